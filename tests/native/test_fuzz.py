"""Hostile-client fuzzing of the request ring against a sidecar built with ASan + UBSan (issue 8, part 2).

The short CI version: build the sidecar with -DTR_SANITIZE=ON and the fuzz driver
(native/tools/fuzz_client.c, -DTR_BUILD_FUZZ=ON) once per session, fire a few hundred thousand
random and boundary requests at it while honest clients search beside it, then scribble over the
header's geometry. Zero sanitizer reports, the sidecar alive, every honest answer correct.
The long version is benchmarks/fuzz_sidecar.py.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from tiered_recall.hot import layout as L
from tiered_recall.hot import HotTier
from tiered_recall.testing.fuzz import (SanitizedSidecar, build_sanitized, honest_client, run_fuzzer,
                                        sanitizer_reports)

NATIVE = Path(__file__).resolve().parents[2] / "native"


@pytest.fixture(scope="session")
def sanitized_build(tmp_path_factory) -> Path:
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed: cannot build the sanitizer variant of the sidecar")
    try:
        return build_sanitized(NATIVE, tmp_path_factory.mktemp("asan-build"))
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"building the ASan/UBSan sidecar failed:\n{exc.stdout}\n{exc.stderr}")


@pytest.fixture
def asan_sidecar(sanitized_build, tmp_path):
    started: list[SanitizedSidecar] = []

    def _start(**kw) -> SanitizedSidecar:
        side = SanitizedSidecar(sanitized_build, f"fz-{uuid.uuid4().hex[:12]}", tmp_path / f"sidecar-{len(started)}.log",
                                **kw)
        started.append(side)
        return side

    yield _start
    for side in started:
        side.stop()


@pytest.mark.slow
def test_fuzzed_sidecar_stays_up_with_no_sanitizer_report_and_honest_clients_stay_right(sanitized_build, asan_sidecar):
    side = asan_sidecar(dim=16, capacity=4000, slots=16)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    honest = [ctx.Process(target=honest_client, args=(side.name, w, 12.0, queue)) for w in range(2)]
    for p in honest:
        p.start()
    time.sleep(1.0)  # let the honest clients attach and insert before the storm
    summary = run_fuzzer(sanitized_build, side.name, "--requests", "150000", "--seconds", "10", "--inflight", "8",
                         "--seed", str(int.from_bytes(os.urandom(4), "little")))
    results = [queue.get(timeout=60) for _ in honest]
    for p in honest:
        p.join(10)
    assert summary["rc"] == 0, summary
    assert summary["anomalies"] == 0 and summary["hangs"] == 0 and summary["sidecar_alive"], summary
    assert summary["answered"] >= 5_000, f"fuzzer only got {summary['answered']} requests through: {summary}"
    for worker, searches, found, wrong, err in results:
        assert err is None, f"honest client {worker} failed: {err}"
        assert not wrong, f"honest client {worker} got wrong answers: {wrong}"
        assert searches > 50 and found >= searches // 2, (worker, searches, found)
    assert side.popen.poll() is None, f"sidecar died: {side.log()[-3000:]}"
    code = side.stop()
    reports = sanitizer_reports(side.log())
    assert not reports, "sanitizer reports:\n" + "\n".join(reports[:40]) + "\n" + side.log()[-4000:]
    assert code == 0, f"sanitized sidecar exited {code}: {side.log()[-3000:]}"


@pytest.mark.slow
def test_scribbled_header_geometry_neither_crashes_nor_misleads_the_sidecar(sanitized_build, asan_sidecar):
    """A client can write the whole header; the sidecar must serve from its own copy of the geometry."""
    side = asan_sidecar(dim=8, capacity=100, slots=4)
    # bounded by time, not count: header rounds start after 200 ms, and a fast machine answers
    # tens of thousands of requests before that
    summary = run_fuzzer(sanitized_build, side.name, "--requests", "100000000", "--seconds", "3", "--header-garbage",
                         "--seed", "7")
    assert summary["rc"] == 0 and summary["header_rounds"] >= 2, summary
    with HotTier.attach(side.name) as hot:  # header restored by the fuzzer: an honest client works
        hot.clear()  # the fuzzer's rows (and namespaces: 42 is one of its favourites) are still there
        x = np.eye(8, dtype=np.float32)
        hot.upsert(np.arange(100, 108), x, 42)
        res = hot.search(x[3].copy(), k=2, namespace_hash=42)
        assert res.ids[0, 0] == 103 and abs(res.scores[0, 0] - 1.0) < 1e-6
    code = side.stop()
    reports = sanitizer_reports(side.log())
    assert not reports, "\n".join(reports[:40])
    assert code == 0


def test_contains_at_the_largest_accepted_count_stays_inside_its_slot(start):
    """A CONTAINS of the most ids the sidecar accepts must not write its reply into the next slot."""
    _, hot = start(dim=8, capacity=10, slots=4)
    hot.upsert([0], np.eye(8, dtype=np.float32)[:1], 3)  # id 0 present: every reply byte is 1, not 0
    h = hot._header
    payload = int(h.slot_payload_bytes)
    at = h.slots_offset + L.SLOT_HEADER_BYTES
    hot._mm[at: at + payload] = bytes(payload)  # the ids asked: all 0
    sentinel_state = L.Slot.from_buffer(hot._mm, h.slots_offset + 1 * h.slot_bytes)
    before = bytes(hot._mm[h.slots_offset + h.slot_bytes: h.slots_offset + h.slot_bytes + 64])
    slot = L.Slot.from_buffer(hot._mm, h.slots_offset)
    accepted = None
    for count in range(payload // 9, payload // 9 - 80, -1):
        slot.state = L.SLOT_CLAIMED
        slot.owner_pid = os.getpid()
        slot.opcode, slot.flags, slot.k, slot.count = L.OP_CONTAINS, 0, 0, count
        slot.seq += 1
        slot.state = L.SLOT_REQUEST
        h.doorbell += 1
        deadline = time.monotonic() + 5
        while slot.state != L.SLOT_DONE:
            assert time.monotonic() < deadline
            time.sleep(0.0005)
        status = slot.status
        slot.owner_pid = 0
        slot.state = L.SLOT_FREE
        if status == L.OK:
            accepted = count
            break
    assert accepted is not None
    assert L.contains_reply_offset(accepted) + accepted <= payload, f"accepted {accepted} ids: reply overflows"
    assert bytes(hot._mm[h.slots_offset + h.slot_bytes: h.slots_offset + h.slot_bytes + 64]) == before
    assert sentinel_state.state == L.SLOT_FREE
