"""Fault injection, short CI versions. The engines live in tiered_recall/testing/faults.py; benchmarks/faults.py
runs the long versions (more kills, more load)."""
from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from tiered_recall.testing import faults

pytestmark = [pytest.mark.lancedb, pytest.mark.slow]


@pytest.fixture
def store(tmp_path):
    import time

    from tiered_recall.coordinator.link import sidecar_name_of
    from tiered_recall.hot import segment_path

    path = tmp_path / "store"
    yield path
    # stop the sidecar this store started (it would also exit by itself once orphaned)
    name = sidecar_name_of(path)
    pid = faults.sidecar_pid(name)
    if pid:
        os.kill(pid, 15)
    for _ in range(100):
        if not segment_path(name).exists():
            break
        time.sleep(0.05)


def test_sidecar_sigkilled_under_load_loses_nothing_and_comes_back(store):
    r = faults.sidecar_kills(store, kills=5, workers=4, min_gap_s=0.3, max_gap_s=1.0, seed=int.from_bytes(os.urandom(2), "little"))
    assert r["kills"] == 5, r
    assert r["restarted_every_time"], r
    assert r["hung_calls"] == 0 and r["max_call_s"] < faults.HANG_S, r
    assert r["unexpected"] == [], r
    assert r["workers_reported"] == 4, r
    assert r["adds_acknowledged"] > 0 and r["acknowledged_lost"] == 0 and r["duplicates"] == 0, r
    assert r["wrong_answers"] == 0, r
    assert r["acked_in_hot_after"] == r["adds_acknowledged"], r  # re-warmed (and backlog caught up)
    assert r["final_search_tier"] == "hot", r


def test_client_sigkilled_mid_request_gets_its_slot_reclaimed_and_others_are_unaffected():
    r = faults.client_kills(kills=4, slots=2, seed=int.from_bytes(os.urandom(2), "little"))
    assert r["kills"] == 4, r
    assert r["sidecar_alive"] and r["slots_free_after"], r
    assert r["honest_wrong"] == 0 and r["honest_errors"] == 0 and r["honest_checks"] > 10, r
    assert r["honest_ok_after"] and r["call_after_s"] < 2.0, r


def test_ingest_sigkilled_and_rerun_holds_exactly_one_clean_run(tmp_path):
    r = faults.ingest_kills(tmp_path, kills=2, turns=300, batch=20, seed=int.from_bytes(os.urandom(2), "little"))
    assert r["clean_rows"] == 300 and r["kills"] >= 1, r
    assert r["identical"] and r["missing"] == 0 and r["extra"] == 0 and r["duplicates"] == 0, r


def _can_mount() -> str | None:
    if os.geteuid() != 0:
        return "needs root to mount a small tmpfs"
    probe = Path(f"/tmp/tr-mount-probe-{uuid.uuid4().hex[:8]}")
    probe.mkdir()
    try:
        out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)], capture_output=True, text=True)
        if out.returncode != 0:
            return f"mount -t tmpfs is not permitted here: {out.stderr.strip()}"
        subprocess.run(["umount", str(probe)], capture_output=True)
        return None
    finally:
        probe.rmdir()


def test_disk_full_gives_a_clear_error_and_keeps_every_acknowledged_memory(tmp_path):
    reason = _can_mount()
    if reason:
        pytest.skip(reason)
    r = faults.disk_full(tmp_path / "mnt", size="4m")
    assert r["error"] is not None, f"the 4 MiB disk never filled: {r}"
    assert r["clear_error"], r
    assert "the disk is full: free space or move the store" in r["error"], r  # the error names the fix
    assert r["acknowledged"] > 0 and r["acknowledged_lost"] == 0, r
    assert r["rows_after_reopen"] >= r["acknowledged"], r
