"""Background upkeep of the cold table: compaction, old-version cleanup and index builds, one process at a time."""
from __future__ import annotations

import fcntl
import os
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

LOCK_FILE_NAME = ".maintenance.lock"


@contextmanager
def maintenance_lock(folder: str, *, blocking: bool, name: str = LOCK_FILE_NAME) -> Iterator[bool]:
    """Yield True while holding the store's cross-process lock `name` (default: maintenance), False if another
    process holds it."""
    fd = os.open(os.path.join(folder, name), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class MaintenanceThread:
    """Runs `job` on its own thread once `writes_due()` writes are pending, or on a timer tick with a quarter of
    that pending (so a burst's last versions are cleaned up too); never on a writer's thread."""

    def __init__(self, job: Callable[[], bool], *, writes_due: Callable[[], int], every_s: float, name: str):
        self._job = job
        self._writes_due = writes_due
        self._every_s = every_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._lock = threading.Lock()
        self._pending = 0
        self._skipped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def pending_writes(self) -> int:
        return self._pending

    def note_writes(self, n: int = 1) -> None:
        with self._lock:
            self._pending += n
            pending = self._pending
        due = pending >= self._writes_due()
        if due:
            self._wake.set()

    def reset(self) -> None:
        """Forget pending writes (a foreground optimize() just did the work)."""
        with self._lock:
            self._pending = 0

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no job is queued or running (for tests, benchmarks and close)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                # A job skipped for another process's lock stays owed, but waiting for it here could be forever.
                quiet = (self._pending < self._writes_due() or self._skipped) and not self._wake.is_set()
            if quiet and self._idle.is_set():
                return True
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            self._idle.wait(0.01 if remaining is None else min(0.01, remaining))
            time.sleep(0.005)

    def _run(self) -> None:
        while not self._stop.is_set():
            woken = self._wake.wait(self._every_s)
            if self._stop.is_set():
                break
            due = self._writes_due()
            with self._lock:
                self._wake.clear()
                pending = self._pending
                if pending == 0 or pending < (due if woken else max(1, due // 4)):
                    continue
                self._pending = 0
                self._idle.clear()
            try:
                # The job records its own failures; nothing may escape and kill the thread.
                ran = self._job()
                with self._lock:
                    self._skipped = not ran
                    if not ran:
                        self._pending += pending  # another process held the lock: still owed
            finally:
                self._idle.set()

    def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)
