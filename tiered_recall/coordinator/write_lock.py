"""The store's cross-process write lock: commit-then-publish of namespace totals is one step for every process."""
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

    Writers hold it from their cold write until their hot side is published, so the published total of a namespace
    always belongs to the latest commit. `held(wait=False)` yields False at once when another holder has it:
    promotions and repairs use that, since they are optimisations a search should not wait for. A row read from
    the cold tier and upserted into the hot tier without the lock could land after another process's delete took
    it out of the hot tier and before that delete reached the cold tier.
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
