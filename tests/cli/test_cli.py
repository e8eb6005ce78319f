"""The tiered-recall command line: help, add, search, stats, ingest, demo, serve, and errors that name the fix."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tiered_recall.cli import app
from tiered_recall.hot import HotTier, segment_path

runner = CliRunner()
# The installed console script: `python -m` from the checkout would import the source tree instead.
CLI = str(Path(sys.executable).parent / "tiered-recall")


@pytest.fixture
def store(tmp_path, stop_sidecar_after):
    path = tmp_path / "store"
    stop_sidecar_after(path)
    return path


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    return result


def test_help_lists_every_command():
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("serve", "add", "search", "stats", "ingest", "demo"):
        assert command in result.output
    for command in ("serve", "add", "search", "stats", "ingest", "demo"):
        sub = invoke(command, "--help")
        assert sub.exit_code == 0, command
        assert "Usage" in sub.output


def test_add_then_search_prints_hits_with_tiers(store):
    added = invoke("add", "My cat is called Miso", "I work on churn metrics", "-n", "alice", "--role", "user",
                   "--store", str(store), "--device", "cpu")
    assert added.exit_code == 0, added.output
    ids = [int(line) for line in added.output.split()]
    assert len(ids) == 2
    found = invoke("search", "what is my pet called?", "-n", "alice", "-k", "2", "--store", str(store),
                   "--device", "cpu", "--json")
    assert found.exit_code == 0, found.output
    hits = json.loads(found.output)
    assert hits[0]["text"] == "My cat is called Miso"
    assert hits[0]["tier"] in ("hot", "cold") and hits[0]["role"] == "user"
    table = invoke("search", "pet", "-n", "alice", "--store", str(store), "--device", "cpu")
    assert table.exit_code == 0 and "Miso" in table.output and "tier" in table.output
    stats = invoke("stats", "--store", str(store), "--device", "cpu")
    assert stats.exit_code == 0
    assert json.loads(stats.output)["cold_rows"] == 2


def test_ingest_jsonl_twice_adds_nothing_the_second_time(store, tmp_path):
    log = tmp_path / "chat.jsonl"
    log.write_text("\n".join(json.dumps(m) for m in [
        {"role": "user", "content": "I moved to Porto last spring", "session": "s1"},
        {"role": "assistant", "content": "How do you like Porto?", "session": "s1"},
        {"role": "user", "content": "The food is great, especially francesinha", "session": "s1"},
    ]) + "\n")
    first = invoke("ingest", str(log), "-n", "me", "--store", str(store), "--device", "cpu", "--json")
    assert first.exit_code == 0, first.output
    second = invoke("ingest", str(log), "-n", "me", "--store", str(store), "--device", "cpu", "--json")
    assert second.exit_code == 0, second.output
    s1, s2 = json.loads(first.output), json.loads(second.output)
    assert (s1["added"], s1["unchanged"]) == (3, 0)
    assert (s2["added"], s2["updated"], s2["unchanged"], s2["embedded"]) == (0, 0, 3, 0)
    stats = json.loads(invoke("stats", "--store", str(store), "--device", "cpu").output)
    assert stats["cold_rows"] == 3


def test_errors_are_clear_and_exit_non_zero(store):
    bad_k = invoke("search", "x", "-k", "0", "--store", str(store), "--device", "cpu")
    assert bad_k.exit_code == 2 and "k must be" in bad_k.output
    bad_meta = invoke("add", "x", "--metadata", "{not json", "--store", str(store), "--device", "cpu")
    assert bad_meta.exit_code == 2 and "JSON" in bad_meta.output
    bad_device = invoke("stats", "--store", str(store), "--device", "tpu")
    assert bad_device.exit_code == 2 and "device" in bad_device.output
    unknown = invoke("search", "x", "--no-such-flag")
    assert unknown.exit_code != 0


def test_demo_prints_hits_and_tiers(tmp_path):
    result = subprocess.run([CLI, "demo", "--store", str(tmp_path / "demo"),
                             "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "seasick" in result.stdout  # the first demo query finds the boat-tour memory
    assert "hot" in result.stdout and "cold" in result.stdout


def test_serve_runs_a_sidecar_in_the_foreground(segment_name):
    proc = subprocess.Popen([CLI, "serve", "--name", segment_name, "--dim", "8",
                             "--capacity", "10"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not segment_path(segment_name).exists():
            assert proc.poll() is None, "tiered-recall serve exited early"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.1)
        import numpy as np
        with HotTier.attach(segment_name) as hot:
            assert hot.owner_pid == proc.pid  # exec'd in place: the CLI process is the sidecar
            hot.upsert([1, 2], np.eye(8, dtype=np.float32)[:2], 1)
            assert hot.search(np.eye(8, dtype=np.float32)[1], k=1).ids[0, 0] == 2
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    assert not segment_path(segment_name).exists()
