"""Opening a store says what it could not give: no silent fallback to another device or hot capacity, read-only
stores open for search (asked for, or found by themselves), and writes to them fail with a clear error."""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tiered_recall import ReadOnlyStore, TieredMemory
from tiered_recall.errors import InvalidInput, SidecarUnavailable

pytestmark = pytest.mark.lancedb

DIM = 8


def unit(n: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _gpu_visible() -> bool:
    return shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0


@pytest.mark.skipif(_gpu_visible(), reason="a GPU is visible: device='cuda' can be had here")
def test_cuda_asked_without_a_gpu_is_an_error_that_names_the_fallback(tmp_path):
    with pytest.raises(InvalidInput, match=r"device='cuda' but .*device='auto' to fall back"):
        TieredMemory(tmp_path / "s", dim=DIM, embedder=None, device="cuda")


def test_cli_names_its_own_flag(tmp_path):
    from typer.testing import CliRunner

    from tiered_recall.cli import app

    if _gpu_visible():
        pytest.skip("a GPU is visible: --device cuda can be had here")
    out = CliRunner().invoke(app, ["search", "x", "--store", str(tmp_path / "s"), "--device", "cuda"])
    assert out.exit_code == 2
    said = " ".join(out.output.split())  # the console wraps long lines
    assert said.startswith("error: --device cuda but ") and "use --device auto to fall back" in said
    assert "device=" not in said and "'" not in said  # the flag as typed, no Python keyword or quotes


def test_a_different_hot_capacity_from_a_running_sidecar_is_reported(open_memory, tmp_path, caplog):
    path = tmp_path / "store"
    first = open_memory(path, hot_capacity=50)
    assert first.stats()["hot_capacity"] == 50 and first.stats()["hot_warnings"] == []
    with caplog.at_level(logging.WARNING, logger="tiered_recall"):
        second = open_memory(path, hot_capacity=80)
    stats = second.stats()
    assert stats["hot_capacity"] == 50
    assert any("hot_capacity=80" in w and "holds 50 rows" in w for w in stats["hot_warnings"])
    assert any("hot_capacity=80" in r.getMessage() for r in caplog.records)
    third = open_memory(path)  # no capacity asked: the running sidecar's, and nothing to report
    assert third.stats()["hot_warnings"] == [] and third.stats()["hot_capacity"] == 50


@pytest.fixture
def failing_sidecar(tmp_path, monkeypatch):
    """A tr-sidecar that exits at once, beside the real client library (already loaded by the tests)."""
    from tiered_recall.hot.native import client_library, fast_search_module, sidecar_executable

    real = sidecar_executable().parent
    client_library(), fast_search_module()
    fake = tmp_path / "bin"
    fake.mkdir()
    for entry in real.iterdir():
        if entry.name != "tr-sidecar":
            (fake / entry.name).symlink_to(entry)
    script = fake / "tr-sidecar"
    script.write_text("#!/bin/sh\necho 'tr-sidecar: cannot start (test)' >&2\nexit 1\n")
    script.chmod(0o755)
    monkeypatch.setenv("TIERED_RECALL_BIN_DIR", str(fake))


def test_a_hot_tier_that_cannot_start_is_an_error_when_asked_for(failing_sidecar, tmp_path):
    with pytest.raises(SidecarUnavailable, match=r"device='cpu'\) could not start: .*cannot start \(test\)"):
        TieredMemory(tmp_path / "s", dim=DIM, embedder=None, device="cpu")


def test_a_hot_tier_that_cannot_start_under_auto_is_logged_and_reported(failing_sidecar, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="tiered_recall"):
        memory = TieredMemory(tmp_path / "s", dim=DIM, embedder=None, device="auto")
    try:
        memory.add(vectors=unit(2), texts=["a", "b"], namespace="n")
        assert len(memory.search(unit(1)[0], k=5, namespace="n")) == 2
        stats = memory.stats()
        assert stats["hot_backend"] is None and any("no hot tier" in w for w in stats["hot_warnings"])
        assert any("no hot tier" in r.getMessage() for r in caplog.records)
    finally:
        memory.close()


def _filled_store(path: Path) -> list[int]:
    with TieredMemory(path, dim=DIM, embedder=None, device="none") as memory:
        return memory.add(vectors=unit(3), texts=["a", "b", "c"], namespace="n")


def test_read_only_store_searches_and_refuses_writes(tmp_path):
    path = tmp_path / "store"
    ids = _filled_store(path)
    before = sorted(str(p.relative_to(path)) for p in path.rglob("*"))
    with TieredMemory(path, read_only=True, embedder=None) as memory:
        assert memory.stats()["read_only"] is True and memory.stats()["hot_backend"] is None
        assert sorted(h.id for h in memory.search(unit(1, 1)[0], k=10, namespace="n")) == sorted(ids)
        assert [m.id for m in memory.get(ids)] == ids
        with pytest.raises(ReadOnlyStore, match="read-only"):
            memory.add(vectors=unit(1), texts=["d"], namespace="n")
        with pytest.raises(ReadOnlyStore, match="read-only"):
            memory.delete(ids[:1])
    assert sorted(str(p.relative_to(path)) for p in path.rglob("*")) == before  # nothing was written


def test_read_only_and_an_explicit_hot_tier_do_not_mix(tmp_path):
    path = tmp_path / "store"
    _filled_store(path)
    with pytest.raises(InvalidInput, match="read-only store has no hot tier"):
        TieredMemory(path, read_only=True, embedder=None, device="cpu")


def test_read_only_needs_an_existing_store(tmp_path):
    with pytest.raises(InvalidInput, match="no store at"):
        TieredMemory(tmp_path / "nothing", read_only=True, embedder=None)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="a read-only mount needs root and unshare(1)")
def test_a_store_on_a_read_only_mount_opens_read_only_by_itself(tmp_path):
    path = tmp_path / "store"
    ids = _filled_store(path)
    child = textwrap.dedent(f"""
        import logging, numpy as np
        from tiered_recall import ReadOnlyStore, TieredMemory
        logging.basicConfig(level=logging.INFO)
        rng = np.random.default_rng(1)
        q = rng.standard_normal({DIM}).astype(np.float32)
        with TieredMemory({str(path)!r}, embedder=None) as memory:
            assert memory.read_only
            print("found", sorted(h.id for h in memory.search(q / np.linalg.norm(q), k=10, namespace="n")))
            try:
                memory.add(vectors=np.eye({DIM}, dtype=np.float32)[:1], texts=["x"], namespace="n")
            except ReadOnlyStore as exc:
                print("refused", exc)
        """)
    # a private mount namespace: the read-only bind mount is gone with the child
    script = f"mount --bind {path} {path} && mount -o remount,bind,ro {path} && exec {sys.executable} -c \"$0\""
    out = subprocess.run(["unshare", "-m", "sh", "-c", script, child], capture_output=True, text=True, timeout=120)
    if "Operation not permitted" in out.stderr and out.returncode != 0 and "found" not in out.stdout:
        pytest.skip(f"this machine does not allow a private read-only mount: {out.stderr.strip()[:200]}")
    assert out.returncode == 0, out.stderr
    assert f"found {sorted(ids)}" in out.stdout
    assert "refused" in out.stdout and "read-only" in out.stdout
    assert "opened read-only" in out.stderr  # the log line


def test_a_read_only_cold_store_follows_the_log_and_refuses_what_needs_a_flush(tmp_path):
    from tiered_recall.storage import ColdStore

    folder = tmp_path / "cold"
    writer = ColdStore(folder, dim=DIM, background=False, wal_flush_rows=10**6, wal_flush_s=3600)
    try:
        v = unit(2)
        writer.add(ids=[1, 2], vectors=v, namespaces=["n", "n"], texts=["a", "b"], sessions=[None, None],
                   roles=["user", "assistant"], created_at_us=[0, 0], metadata=[None, None])
        reader = ColdStore(folder, dim=DIM, read_only=True)
        try:
            ids, _ = reader.search(v[0], k=5)
            assert sorted(ids.tolist()) == [1, 2]  # the logged rows, not yet in the table
            with pytest.raises(ReadOnlyStore, match="write-ahead log"):
                reader.search(v[0], k=5, where="role = 'user'")
            with pytest.raises(ReadOnlyStore):
                reader.add(ids=[3], vectors=v[:1], namespaces=["n"], texts=["c"], sessions=[None], roles=[None],
                           created_at_us=[0], metadata=[None])
            writer.flush()
            ids, _ = reader.search(v[0], k=5, where="role = 'user'")
            assert ids.tolist() == [1]
        finally:
            reader.close()
    finally:
        writer.close()


def test_no_path_means_the_users_own_store_outside_the_working_folder(tmp_path, monkeypatch):
    """The default store lives in the user's data folder (XDG_DATA_HOME here), not in ./storage: a command run from
    a source checkout writes nothing into it."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with TieredMemory(dim=DIM, embedder=None, device="none") as memory:
        memory.add(vectors=unit(1), texts=["a"], namespace="n")
        assert memory.path == (tmp_path / "data" / "tiered-recall" / "store").resolve()
    assert list(work.iterdir()) == []
