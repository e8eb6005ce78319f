"""Upkeep of the cold table: compaction, old-version cleanup, index builds and reconnects, one process at a time."""
from __future__ import annotations

import os
import threading
import time
import warnings
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from ._schema import VECTOR_COLUMN
from ._tables import is_conflict, retry, row_keeping_versions, version_summaries
from ..sync import encode_note, exclusive

if TYPE_CHECKING:
    from ._follower import Follower
    from ._index import FaissIndex
    from ._lifecycle import Lifecycle
    from ._tables import LanceTables
    from ._wal import WriteAheadLog

LOCK_FILE_NAME = ".maintenance.lock"


@contextmanager
def maintenance_lock(folder: str, *, blocking: bool, name: str = LOCK_FILE_NAME) -> Iterator[bool]:
    """Yield True while holding the store's cross-process lock `name` (default: maintenance), False if another
    process holds it."""
    with exclusive(os.path.join(folder, name), wait=blocking) as got:
        yield got


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
        """Writes noted that no job has handled yet (a job skipped for another process's lock still owes them)."""
        return self._pending

    def note_writes(self, n: int = 1) -> None:
        """Counts n more writes; wakes the thread once writes_due() are pending."""
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
        """Stops the thread, waiting up to timeout seconds for a job in flight."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)


class TableUpkeep:
    """Compaction, cleanup of old versions, index builds and reconnects of one store, on the maintenance thread or
    by optimize(); owns their figures and the thread. It changes no rows: a compaction holds the flush lock so that
    no flush or direct write commits meanwhile, and its versions are logged as benign for the other processes."""

    def __init__(self, *, tables: "LanceTables", wal: "WriteAheadLog | None", follower: "Follower",
                 index: "FaissIndex", lock: threading.RLock, unlogged_commits: threading.RLock, life: "Lifecycle",
                 cleanup_grace_s: float, compact_every_writes: int, scalar_index_min_rows: int,
                 ann_index_min_rows: int, index_mode: str, dim: int) -> None:
        self._tables = tables
        self._wal = wal
        self._follower = follower
        self._index = index
        self._lock = lock
        self._unlogged_commits = unlogged_commits  # without a log: held by compactions and by direct writes
        self._life = life
        self._path = tables.path
        self._cleanup_grace = timedelta(seconds=float(cleanup_grace_s))
        self._compact_every_writes = compact_every_writes
        self._scalar_index_min_rows = scalar_index_min_rows
        self._ann_index_min_rows = ann_index_min_rows
        self._index_mode = index_mode
        self._dim = dim
        self._thread: MaintenanceThread | None = None
        self.last_compaction_at: float | None = None
        self.compactions = 0
        self.errors = 0
        self.last_error: str | None = None

    def start(self, every_s: float) -> None:
        """Starts the background maintenance thread: a job once writes_per_compaction() writes are pending, or on a
        timer tick every every_s seconds with a quarter of that pending."""
        self._thread = MaintenanceThread(self._maintain, writes_due=self.writes_per_compaction, every_s=every_s,
                                         name=f"cold-maintenance:{self._path}")

    def writes_per_compaction(self) -> int:
        """Writes between background compactions.

        LanceDB's optimize() takes no compaction options, and it rewrites every fragment under 1M rows together
        with the new small ones: compacting a 100k-row table rewrites all of it. So the interval grows with the
        table (about one compaction per 1000 rows held, at most every 1000 writes), which bounds the rows rewritten
        per write (~1000) and the fragment count (compact_every_writes .. 1000 + the writes during one compaction).
        """
        return max(self._compact_every_writes, min(self._follower.row_estimate // 1000, 1000))

    def note_writes(self) -> None:
        """One more commit (a flush or a direct write) towards the next background compaction."""
        if self._thread is not None:
            self._thread.note_writes()

    def no_row_commits(self):
        """Held around a compaction: no flush and no direct write commits meanwhile (they take the same flush lock;
        without a log, this process's direct writes take the same unlogged-commit lock).
        LanceDB drops a compaction task whose fragments a concurrent delete touched ("Retryable commit conflict ...
        preempted by concurrent transaction Delete"): with deletes flushed every half second, compaction would lose
        every time and fragments pile up. Adds and deletes go on meanwhile: they are appended to the log, which the
        flusher commits after the compaction."""
        return self._wal.flushing() if self._wal is not None else self._unlogged_commits

    def compact_now(self) -> None:
        """Compact now, build the indices due and drop every old version (waits for this process's queued upkeep and
        for another process's maintenance to finish)."""
        if self._thread is not None:
            self._thread.wait_idle()
        with maintenance_lock(self._path, blocking=True):
            def run():
                table = self._tables.table
                with warnings.catch_warnings(), self.no_row_commits():
                    # LanceDB warns that a zero grace breaks readers of old versions: that is what "now" asks for.
                    warnings.filterwarnings("ignore", message=r"optimize\(cleanup_older_than=0\)", category=UserWarning)
                    table.optimize(cleanup_older_than=timedelta(0))
                self._build_indices(table)
            self._tables.guard("optimize the table", run)
            if self._thread is not None:
                self._thread.reset()
            self.last_compaction_at = time.time()
            self.compactions += 1

    def _maintain(self) -> bool:
        """Background job: compaction, cleanup of versions older than the grace period, index builds.
        Returns False when it did not run because another process holds the maintenance lock."""
        if self._life.closed:
            return True
        try:
            with maintenance_lock(self._path, blocking=False) as got:
                if not got:
                    return False  # another process is compacting this table right now
                table = self._tables.maintenance_table
                start = table.version

                def optimize():
                    with self.no_row_commits():
                        table.optimize(cleanup_older_than=self._cleanup_grace)
                retry(optimize, is_conflict, 0.02)
                self._build_indices(table)
                self.last_compaction_at = time.time()
                self.compactions += 1
                self._note_benign(table, start)  # before the lock goes: readers defer until then (Follower.sync_locked)
                self.maybe_reconnect(table.version)
            with self._lock:
                if not self._life.closed:
                    self._follower.sync_locked()  # absorb the compaction versions here, not on a reader's time
            self._index.save(force=False)
        except Exception as exc:  # the thread must survive; stats() reports the failure
            self.errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
        return True

    def _note_benign(self, table, start: int) -> None:
        """Log which versions since `start` keep every row (this maintenance's compaction and index builds), so other
        processes need not list the table's versions to find out. Only a hint: on failure they do."""
        if self._wal is None:
            return
        try:
            benign = row_keeping_versions(version_summaries(table), start)
            if benign:
                with self._wal.locked():
                    self._wal.append(encode_note("benign", benign))
                with self._lock:
                    self._follower.note_row_keeping_locked(benign)
        except Exception as exc:
            self.last_error = f"benign-version note: {type(exc).__name__}: {exc}"

    def _build_indices(self, table) -> None:
        rows = table.count_rows()
        have = {tuple(idx.columns): idx.index_type for idx in table.list_indices()}
        if rows >= self._scalar_index_min_rows:
            from lancedb.index import BTree, Bitmap
            if ("id",) not in have:
                table.create_index("id", config=BTree())  # speeds up upsert, get and delete by id
            if ("namespace",) not in have:
                table.create_index("namespace", config=Bitmap())  # namespace filters without a full scan
        # LanceDB's vector index only serves searches when there is no mirror (past its budget) or index="lancedb";
        # with the mirror, FAISS does: building IVF_PQ over a large table would cost minutes of CPU for nothing.
        lance_serves = self._follower.mirror is None or self._index_mode == "lancedb"
        if rows >= self._ann_index_min_rows and lance_serves and (VECTOR_COLUMN,) not in have:
            from lancedb.index import IvfPq
            table.create_index(VECTOR_COLUMN, config=IvfPq(distance_type="dot",
                                                          num_partitions=max(1, int(np.sqrt(rows) / 4)),
                                                          num_sub_vectors=pq_sub_vectors(self._dim)))

    def maybe_reconnect(self, latest: int) -> None:
        """Under the maintenance lock (so no optimize() uses the table meanwhile): a new LanceDB connection, with empty
        caches, once the table has moved far enough past the current connection's start (see _tables.py). No flush
        or direct write commits meanwhile (the flush lock) and no read or write uses the table (the store's lock)."""
        if not self._tables.reconnect_due(latest):
            return
        with self.no_row_commits(), self._lock:
            if not self._life.closed:
                self._tables.reconnect()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no background upkeep is queued or running (True at once without the thread); False on timeout."""
        return True if self._thread is None else self._thread.wait_idle(timeout)

    def stop(self) -> None:
        """Stops the maintenance thread, if one runs."""
        if self._thread is not None:
            self._thread.stop()

    def figures(self) -> dict:
        """Compactions, reconnects, pending writes and maintenance errors, for ColdStore.stats()."""
        return {
            "last_compaction_at": self.last_compaction_at,
            "compactions": self.compactions,
            "lance_reconnects": self._tables.reconnects,
            "pending_writes": 0 if self._thread is None else self._thread.pending_writes,
            "maintenance_errors": self.errors,
            "last_maintenance_error": self.last_error,
        }


def pq_sub_vectors(dim: int) -> int:
    """PQ sub-vector count: about dim/8 (8 dims per code), and it must divide dim."""
    target = max(1, dim // 8)
    for m in range(target, 0, -1):
        if dim % m == 0:
            return m
    return 1
