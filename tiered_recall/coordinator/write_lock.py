"""The store's cross-process write lock: one process at a time changes the hot tier (applies the log's writes to it,
warms, repairs or promotes)."""
from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from pathlib import Path
from typing import Iterator

LOCK_FILE = ".write.lock"


class StoreWriteLock:
    """An flock on `<store>/.write.lock`, re-entrant within a thread (add -> reconnect -> warm); other threads of
    this process wait on a mutex first, so they are excluded like other processes.

    A logged write takes it only to apply the hot side of every write logged since the last application (its own
    and other processes', in log order: hot_writes.py); a write that bypasses the log holds it from before its cold
    write until its hot side is done, so no other process applies records past its note meanwhile.
    `held(wait=False)` yields False at once when another holder has it: writers that find it held, promotions and
    repairs use that. A row read from the cold tier and put into the hot tier without the lock could land after
    the application of a newer write of the same id.

    The lock file stays open from the first use until close(): searches and writes take the lock often, and opening
    the file each time cost more than the flock itself.
    """

    def __init__(self, store_path: Path) -> None:
        self.path = Path(store_path) / LOCK_FILE
        self._mutex = threading.RLock()
        self._depth = 0  # entries of the thread that holds the mutex
        self._fd: int | None = None

    @contextlib.contextmanager
    def held(self, *, wait: bool = True) -> Iterator[bool]:
        """Holds the lock for the with block (re-entrant in a thread), yielding True; with wait=False yields False at
        once when another holder has it (another thread of this process, or another process)."""
        if not self._mutex.acquire(blocking=wait):
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
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
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
            self._mutex.release()

    def close(self) -> None:
        """Closes the lock file (a later held() opens it again)."""
        with self._mutex:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
