"""A shard's node-local folder: which incarnation it belongs to (kept across a restart on the same node, wiped when
another incarnation ran elsewhere since), the lease its live shard holds, and the ownership view it publishes for
co-located readers (a seqlock counter they read from shared memory, and the view as JSON)."""
from __future__ import annotations

import errno
import fcntl
import json
import mmap
import os
import shutil
import time
from pathlib import Path
from typing import Any

STORE = "store"  # the shard's TieredMemory folder
INCARNATION = "incarnation.json"
LEASE = "lease"
VIEW = "view.json"
SEQUENCE = "view.seq"
LEASE_PROBE_S = 0.05


def default_local_root() -> str:
    """Where shards keep their node-local state when no local_root is set: the user data folder."""
    import platformdirs

    return os.path.join(platformdirs.user_data_dir("tiered-recall"), "cluster")


def shard_folder(root: str, cluster: str, shard: str) -> Path:
    """A shard's node-local folder under `root`."""
    return Path(root) / cluster / shard


def keeps_folder(folder: Path, last_opened: dict | None, node: str) -> bool:
    """Whether a starting incarnation keeps the folder: the last incarnation that opened the shard's store did so on
    this node, in this folder (its log may hold acknowledged writes not yet in object storage; opening the store
    replays them there). Otherwise what is here is older than object storage."""
    if not last_opened or last_opened.get("node") != node:
        return False
    try:
        mine = json.loads((folder / INCARNATION).read_text())
    except (OSError, ValueError):
        return False
    return mine.get("node") == node and int(mine.get("epoch", -1)) == int(last_opened["epoch"])


def settle(folder: Path, *, keep: bool) -> None:
    """The folder, emptied unless kept."""
    if not keep and folder.exists():
        shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)


def mark_incarnation(folder: Path, *, epoch: int, node: str) -> None:
    """Records that this incarnation opened the store in this folder (after the directory recorded it)."""
    tmp = folder / (INCARNATION + ".tmp")
    tmp.write_text(json.dumps({"epoch": epoch, "node": node, "pid": os.getpid()}))
    os.replace(tmp, folder / INCARNATION)


class Lease:
    """The flock a live shard holds on its folder: a co-located reader that can take it knows the shard is gone."""

    def __init__(self, folder: Path, timeout_s: float = 30.0) -> None:
        self._fd = os.open(folder / LEASE, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + timeout_s
        while True:  # a previous incarnation on this node may still be exiting
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN) or time.monotonic() > deadline:
                    os.close(self._fd)
                    raise
                time.sleep(0.05)

    def close(self) -> None:
        """Lets the lease go (the shard is closing)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class ViewPublisher:
    """The shard's side: publishes each ownership view it applies (the counter is odd while a view is written)."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        fd = os.open(folder / SEQUENCE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < 8:
                os.ftruncate(fd, 8)
            self._map = mmap.mmap(fd, 8)
        finally:
            os.close(fd)
        self._words = memoryview(self._map).cast("q")

    def publish(self, state: dict[str, Any]) -> None:
        """Writes the view (the counter odd meanwhile, then even again)."""
        self._words[0] += 1  # odd: a view is being written
        tmp = self._folder / (VIEW + ".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self._folder / VIEW)
        self._words[0] += 1

    def close(self) -> None:
        """Unmaps the counter."""
        self._words.release()
        self._map.close()


class ViewReader:
    """A co-located reader's side: the counter (a load from shared memory), the view, and whether the shard that
    publishes them still holds its lease."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        fd = os.open(folder / SEQUENCE, os.O_RDONLY)
        try:
            self._map = mmap.mmap(fd, 8, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self._words = memoryview(self._map).cast("q")
        self._lease = os.open(folder / LEASE, os.O_RDONLY)
        self._probed_at = 0.0

    def sequence(self) -> int:
        """The counter: odd while a view is being written."""
        return self._words[0]

    def load(self) -> dict[str, Any] | None:
        """The published view, or None while none can be read."""
        try:
            return json.loads((self._folder / VIEW).read_text())
        except (OSError, ValueError):
            return None

    def shard_alive(self) -> bool:
        """True while a live shard holds the lease on this folder's lease file (the one this reader opened: a
        folder emptied for a new incarnation has a new file, so this one is free). Probed at most every
        LEASE_PROBE_S: a shard lost since then cannot have been replaced by one that took a write yet (a new
        incarnation needs Ray to notice the loss and a process to start, seconds), so what it answered still holds."""
        now = time.monotonic()
        if now - self._probed_at < LEASE_PROBE_S:
            return True
        try:
            fcntl.flock(self._lease, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            self._probed_at = now
            return True
        fcntl.flock(self._lease, fcntl.LOCK_UN)
        self._probed_at = 0.0
        return False

    def forget_probe(self) -> None:
        """The next shard_alive() probes the lease whenever it was last probed."""
        self._probed_at = 0.0

    def close(self) -> None:
        """Unmaps the counter and closes the lease file."""
        self._words.release()
        self._map.close()
        os.close(self._lease)
