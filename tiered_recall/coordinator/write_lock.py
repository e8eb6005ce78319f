"""The store's cross-process write lock: one process at a time changes the hot tier (applies the log's writes to it,
warms, repairs or promotes)."""
from __future__ import annotations

import contextlib
import fcntl
import threading
from pathlib import Path
from typing import Iterator

LOCK_FILE = ".write.lock"


class StoreWriteLock:
    """An flock on `<store>/.write.lock`, re-entrant within a thread (add -> reconnect -> warm); other threads of
    this process wait like other processes (an flock per open file).

    A logged write takes it only to apply the hot side of every write logged since the last application (its own
    and other processes', in log order: hot_writes.py); a write that bypasses the log holds it from before its cold
    write until its hot side is done, so no other process applies records past its note meanwhile.
    `held(wait=False)` yields False at once when another holder has it: writers that find it held, promotions and
    repairs use that. A row read from the cold tier and put into the hot tier without the lock could land after
    the application of a newer write of the same id.
    """

    def __init__(self, store_path: Path) -> None:
        self.path = Path(store_path) / LOCK_FILE
        self._depth = threading.local()

    @contextlib.contextmanager
    def held(self, *, wait: bool = True) -> Iterator[bool]:
        """Holds the lock for the with block (re-entrant in a thread), yielding True; with wait=False yields False at
        once when another holder has it."""
        depth = getattr(self._depth, "n", 0)
        if depth:
            self._depth.n = depth + 1
            try:
                yield True
            finally:
                self._depth.n = depth
            return
        with open(self.path, "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            self._depth.n = 1
            try:
                yield True
            finally:
                self._depth.n = 0
