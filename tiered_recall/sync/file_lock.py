"""The one cross-process lock of the store's files: an exclusive flock, re-entrant within a thread, that other
threads of the process wait for on a mutex, so they are excluded like other processes."""
from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from typing import Iterator


class FileLock:
    """An exclusive flock on the file at `path` (created 0600 when missing), held by one thread of one process at a
    time. The file is opened at first use and stays open until close() (taking a lock must not cost an open), and a
    later use opens it again. Re-entrant in the thread that holds it: the first entry takes the flock, the last exit
    drops it."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self.mutex = threading.RLock()
        self._depth = 0
        self._fd: int | None = None

    @property
    def fd(self) -> int:
        """The lock file's descriptor (opened if it was not): the one the flock is taken on."""
        with self.mutex:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            return self._fd

    @contextlib.contextmanager
    def held(self, *, wait: bool = True) -> Iterator[bool]:
        """Holds the lock for the with block, yielding True; with wait=False yields False at once when another
        thread of this process or another process holds it."""
        if not self.mutex.acquire(blocking=wait):
            yield False
            return
        try:
            if self._depth:
                self._depth += 1
                try:
                    yield True
                finally:
                    self._depth -= 1
                return
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            self._depth = 1
            try:
                yield True
            finally:
                self._depth = 0
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self.mutex.release()

    def close(self) -> None:
        """Closes the lock file (never while held: a holder's thread closes it after its block); a later held()
        opens it again."""
        with self.mutex:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


@contextlib.contextmanager
def exclusive(path: str | os.PathLike, *, wait: bool = True) -> Iterator[bool]:
    """A FileLock held once and closed after: for locks taken seldom (a sidecar's start, maintenance), whose file
    need not stay open. Yields False at once, with wait=False, when another holder has it."""
    lock = FileLock(path)
    try:
        with lock.held(wait=wait) as got:
            yield got
    finally:
        lock.close()


def lock_held(fd: int) -> bool:
    """Whether some thread or process holds an exclusive flock on the file `fd` is open on. `fd` must be an open
    file of its own, not the one a holder locks through: a shared lock is taken on it and dropped at once."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False
