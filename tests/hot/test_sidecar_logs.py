"""A sidecar's output goes to a file with no name: however the sidecar ends (stopped, killed, a signal of its own,
never stopped at all, a failed start), nothing is left in the temporary folder."""
from __future__ import annotations

import gc
import signal
import tempfile

import pytest

from tiered_recall.errors import SidecarUnavailable
from tiered_recall.hot import segment_path, start_sidecar


@pytest.fixture
def temporary(tmp_path, monkeypatch):
    """The temporary folder the sidecars' logs would be made in, this test's own."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_no_way_of_ending_a_sidecar_leaves_its_log(temporary, segment_name):
    stopped = start_sidecar(segment_name, dim=4, capacity=4)
    assert "serving" in stopped.log()  # the log is there to read while it runs
    assert stopped.stop() == 0

    killed = start_sidecar(f"{segment_name}k", dim=4, capacity=4)
    killed.kill()
    segment_path(f"{segment_name}k").unlink()  # the stale segment a kill leaves: not this test's subject

    terminated = start_sidecar(f"{segment_name}t", dim=4, capacity=4)
    terminated.popen.send_signal(signal.SIGTERM)  # ended from outside, never stopped through its handle
    assert terminated.popen.wait(5) == 0
    del terminated, stopped, killed
    gc.collect()
    assert sorted(p.name for p in temporary.iterdir()) == []


def test_a_failed_start_reports_the_log_and_leaves_nothing(temporary, tmp_path, monkeypatch, segment_name):
    from tiered_recall.hot.native import client_library, fast_search_module, sidecar_executable

    real = sidecar_executable().parent
    client_library(), fast_search_module()  # loaded from the real folder before the fake one is named
    fake = tmp_path / "bin"
    fake.mkdir()
    for entry in real.iterdir():
        if entry.name != "tr-sidecar":
            (fake / entry.name).symlink_to(entry)
    script = fake / "tr-sidecar"
    script.write_text("#!/bin/sh\necho 'tr-sidecar: cannot start (test)' >&2\nexit 1\n")
    script.chmod(0o755)
    monkeypatch.setenv("TIERED_RECALL_BIN_DIR", str(fake))
    for detach in (False, True):
        with pytest.raises(SidecarUnavailable, match=r"failed to start: tr-sidecar: cannot start \(test\)"):
            start_sidecar(segment_name, dim=4, capacity=4, detach=detach)
    assert sorted(p.name for p in temporary.iterdir()) == ["bin"]
