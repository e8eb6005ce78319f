"""Group commit for a shard's object durability: writes logged meanwhile, in any namespace, share one commit of the
shard's log to LanceDB on object storage; a write returns once a commit that began after it was logged is done."""
from __future__ import annotations

import threading
import time
from typing import Callable


class GroupCommit:
    """wait() returns once a commit that started after the call has finished (its failure raised to every waiter it
    covered). One commit runs at a time: the writes that arrive during it wait for the next, and share it."""

    def __init__(self, commit: Callable[[], object]) -> None:
        self._commit = commit
        self._cond = threading.Condition()
        self._started = 0
        self._finished = 0
        self._running = False
        self._errors: dict[int, BaseException] = {}
        self.commits = 0
        self.waiters = 0
        self.seconds = 0.0

    def wait(self) -> None:
        """Returns once a commit that began after this call is done; raises its failure."""
        with self._cond:
            self.waiters += 1
            mine = self._started + 1  # the first commit to start after this call covers it
            while self._finished < mine:
                if self._running:
                    self._cond.wait()
                    continue
                self._running = True
                self._started += 1
                number = self._started
                self._cond.release()
                error: BaseException | None = None
                t0 = time.perf_counter()
                try:
                    self._commit()
                except BaseException as exc:  # handed to every write this commit covered
                    error = exc
                finally:
                    self._cond.acquire()
                self.seconds += time.perf_counter() - t0
                self.commits += 1
                self._running = False
                self._finished = number
                if error is not None:
                    self._errors[number] = error
                for old in [n for n in self._errors if n < number - 64]:
                    del self._errors[old]
                self._cond.notify_all()
            error = self._errors.get(mine)
        if error is not None:
            raise error

    def figures(self) -> dict:
        """Commits made, writes that waited for one, and the mean writes a commit covered."""
        with self._cond:
            return {"commits": self.commits, "writes": self.waiters,
                    "writes_per_commit": (self.waiters / self.commits) if self.commits else None,
                    "commit_seconds": self.seconds}
