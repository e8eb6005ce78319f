"""Isolation between local users (issue 8, part 3): segment and store permissions, and names that cannot escape.

The other-user checks run a child as uid 65534 (nobody) and need root; they skip with the reason otherwise.
"""
from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from tiered_recall.errors import InvalidInput, SidecarUnavailable
from tiered_recall.hot import SHM_DIR, HotTier, segment_path, sidecar_executable, start_sidecar, validate_name

OTHER_UID = 65534
REPO = Path(__file__).resolve().parents[2]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a child as another uid (65534)")

# Run as the other user: try to attach to / read / delete the segment and to enter the store; then, when the
# package can be imported from there, attach with the real client. Prints one JSON object.
OTHER_USER_SCRIPT = r"""
import json, os, sys
seg, store, name = sys.argv[1], sys.argv[2], sys.argv[3]
out = {"uid": os.getuid()}
def attempt(key, fn):
    try:
        fn()
        out[key] = "allowed"
    except PermissionError:
        out[key] = "denied"
    except Exception as exc:
        out[key] = f"{type(exc).__name__}: {exc}"
attempt("open_rw", lambda: os.close(os.open(seg, os.O_RDWR)))
attempt("open_ro", lambda: os.close(os.open(seg, os.O_RDONLY)))
attempt("unlink", lambda: os.unlink(seg))
attempt("truncate", lambda: os.truncate(seg, 0))
attempt("list_store", lambda: os.listdir(store))
attempt("read_config", lambda: open(os.path.join(store, "tiered_recall.json")).read())
try:
    sys.path[:0] = sys.argv[4:]
    from tiered_recall.hot import HotTier
    try:
        HotTier.attach(name)
        out["client_attach"] = "allowed"
    except Exception as exc:
        out["client_attach"] = f"{type(exc).__name__}: {exc}"
except Exception as exc:
    out["client_attach"] = f"not importable here: {exc}"
print(json.dumps(out))
"""


def _other_user_python() -> str:
    """An interpreter the other user can execute (the venv's may live under root's 0700 home)."""
    for candidate in (sys.executable, f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}",
                      "/usr/bin/python3"):
        try:
            probe = subprocess.run([candidate, "-c", "0"], user=OTHER_UID, group=OTHER_UID, extra_groups=[],
                                   capture_output=True, timeout=30)
        except OSError:  # not executable by that user
            continue
        if probe.returncode == 0:
            return candidate
    pytest.skip("no Python interpreter is executable by uid 65534 on this machine")


def run_as_other_user(segment: Path, store: Path, name: str) -> dict:
    python = _other_user_python()
    paths = [str(REPO), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TIERED_RECALL_BIN_DIR": str(sidecar_executable().parent)}
    out = subprocess.run([python, "-I", "-c", OTHER_USER_SCRIPT, str(segment), str(store), name, *paths],
                         user=OTHER_UID, group=OTHER_UID, extra_groups=[], capture_output=True, text=True,
                         timeout=60, env=env, cwd="/")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_segment_is_mode_0600_owned_by_us_and_created_exclusively(start, segment_name):
    proc, hot = start(dim=8, capacity=10)
    st = os.stat(segment_path(segment_name))
    assert stat.S_IMODE(st.st_mode) == 0o600, oct(st.st_mode)
    assert st.st_uid == os.getuid()
    # O_EXCL: a second sidecar must not take over (or truncate) a live one's segment
    with pytest.raises(SidecarUnavailable, match="live sidecar"):
        start_sidecar(segment_name, dim=8, capacity=10, ready_timeout_s=10)
    assert hot.ping() >= 0 and hot.owner_pid == proc.pid


@needs_root
def test_client_refuses_a_segment_owned_by_another_uid(start, segment_name):
    start(dim=8, capacity=10)
    path = segment_path(segment_name)
    os.chown(path, OTHER_UID, OTHER_UID)
    try:
        with pytest.raises(SidecarUnavailable, match=f"owned by uid {OTHER_UID}"):
            HotTier.attach(segment_name)
    finally:
        os.chown(path, os.getuid(), os.getgid())


@needs_root
def test_another_user_can_neither_attach_to_nor_delete_our_segment_or_read_our_store(start, segment_name, tmp_path):
    from tiered_recall import TieredMemory

    _, hot = start(dim=8, capacity=10)
    hot.upsert([1], np.eye(8, dtype=np.float32)[:1], 9)
    os.chmod(tmp_path, 0o755)  # pytest's own tmp folders are private: open the way to the store's folder
    store = tmp_path / "store"
    TieredMemory(store, dim=8, embedder=None, device="none").close()
    seg = segment_path(segment_name)
    result = run_as_other_user(seg, store, segment_name)
    assert result["uid"] == OTHER_UID
    for key in ("open_rw", "open_ro", "unlink", "truncate", "list_store", "read_config"):
        assert result[key] == "denied", result
    if not result["client_attach"].startswith("not importable"):
        assert result["client_attach"].startswith("SidecarUnavailable") and "another user" in result["client_attach"], result
    assert seg.exists() and os.stat(seg).st_size > 0
    assert hot.search(np.eye(8, dtype=np.float32)[0], k=1).ids[0, 0] == 1  # untouched


def test_store_folder_keeps_other_users_out(tmp_path):
    from tiered_recall import TieredMemory

    store = tmp_path / "a" / "store"
    memory = TieredMemory(store, dim=8, embedder=None, device="none")
    try:
        memory.add(vectors=np.eye(8, dtype=np.float32)[:2])
    finally:
        memory.close()
    assert stat.S_IMODE(os.stat(store).st_mode) & 0o077 == 0, oct(os.stat(store).st_mode)


EVIL_NAMES = ["../x", "..", "a/../../etc", "/etc/passwd", "a/b", ".hidden", "x" * 201, "a\x00b", "a b", "é",
              "", "a..b", "~root", "a\nb", "$(id)"]


@pytest.mark.parametrize("name", EVIL_NAMES)
def test_segment_names_from_user_input_cannot_escape_dev_shm(name):
    with pytest.raises(InvalidInput):
        validate_name(name)
    with pytest.raises(InvalidInput):
        segment_path(name)


def test_the_native_sidecar_refuses_escaping_names_too():
    before = set(os.listdir(SHM_DIR))
    for name in ["../escape-test", "a/b", ".x", "x" * 201]:
        out = subprocess.run([str(sidecar_executable()), "--name", name, "--dim", "4", "--capacity", "4"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode != 0 and "invalid segment name" in out.stderr, (name, out.stderr)
    # only what these names could have made: other processes of the machine may make segments meanwhile
    made = [n for n in set(os.listdir(SHM_DIR)) - before if "escape" in n or "..x" in n or "x" * 50 in n
            or n.endswith(".a")]
    assert not made, made
    assert not Path("/dev/escape-test").exists()


def test_store_paths_and_namespaces_cannot_place_files_outside_the_store(tmp_path):
    from tiered_recall import TieredMemory

    store = tmp_path / "store"
    outside_before = sorted(p.name for p in tmp_path.iterdir())
    memory = TieredMemory(store, dim=8, embedder=None, device="none")
    try:
        for ns in ["../../escape", "/etc/x", "a/../../b", "..", "ns\\..\\x"]:
            memory.add(vectors=np.eye(8, dtype=np.float32)[:1], namespace=ns)
            assert memory.count(ns) == 1
    finally:
        memory.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(outside_before + ["store"])
    assert not (tmp_path.parent / "escape").exists() and not Path("/etc/x").exists()
    # the sidecar name is derived from a hash of the resolved path, never the raw path
    memory = TieredMemory(tmp_path / "a" / ".." / "store", dim=8, embedder=None, device="none")
    try:
        assert re.fullmatch(r"store-\d+-[0-9a-f]{16}", memory.sidecar_name)
        validate_name(memory.sidecar_name)
    finally:
        memory.close()
