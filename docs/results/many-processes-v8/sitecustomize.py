"""Experiment patch for benchmarks/many_processes.py (2026-12-04, eighth session), not part of the product.

Put this folder on PYTHONPATH with TR_HACK=before and every worker process of the benchmark runs the logged add and
delete of 5b6d825 (main before this session: an add of new ids applies up to 8 KiB of other writers' records under
the append lock, and encodes its record, copies its rows and applies them to its mirror under the lock too), and
asks LanceDB for the table's version at every read while a writer is at work: the A/B of this session's changes
within one installation. TR_HACK=recheck0 turns off only the second (every read asks again, as before).

    cd /tmp && TR_HACK=before PYTHONPATH=/path/to/docs/results/many-processes-v8 \
        python /path/to/benchmarks/many_processes.py --processes 2 8 --mix 95/5 --seconds 8
"""
from __future__ import annotations

import os

if os.environ.get("TR_HACK") in ("before", "recheck0"):
    from tiered_recall.storage import _follower as _follower_module
    _follower_module._DEFERRED_VERSION_RECHECK_S = 0.0

if os.environ.get("TR_HACK") == "before":
    from dataclasses import replace

    from tiered_recall.storage import _writer
    from tiered_recall.storage._follower import Follower
    from tiered_recall.storage._tables import storage_message
    from tiered_recall.storage._wal import Deleted, encode_delete, encode_rows
    from tiered_recall.errors import StorageError
    _owned = _writer._owned
    FOLLOW_UNDER_LOCK_MAX_BYTES = 8 * 1024

    def log_bytes_behind_locked(self, end):
        log = self._log
        if log is None or log.fd is None or log.gen != end[0]:
            return None
        return max(0, end[1] - log.offset)

    Follower.log_bytes_behind_locked = log_bytes_behind_locked

    def _queue_waits_locked(self) -> bool:
        """Under the append lock: more than FOLLOW_UNDER_LOCK_MAX_BYTES of records wait for this process's follower,
        or a rotation does (what a follow under the lock would then apply is more than a few records)."""
        behind = self._follower.log_bytes_behind_locked(self.wal.end_locked())
        return behind is None or behind > FOLLOW_UNDER_LOCK_MAX_BYTES

    def _add_logged(self, rows: Rows, *, new_ids: bool = False) -> Bump | None:
        self._follow_before_lock()
        with self.wal.locked():
            self._life.ensure_open()
            with self._lock:
                # The bump needs the namespaces the ids are in now: every earlier logged write into the mirror first.
                # Ids drawn at random for this add are in none (unless the mirror already knows one: then the full
                # way), so for them what others logged since the follow above is applied here only while it is a
                # few records. More is left to after the lock: applying it here would make the section grow with
                # the queue for the lock, each writer applying what the others logged while it waited. This add's
                # own record then reaches the mirror with theirs, after the lock.
                mirror = self._follower.mirror
                if (not new_ids or mirror is None or mirror.positions(rows.ids).size
                        or not self._queue_waits_locked()):
                    self._follower.follow_log_locked()
                bump = self._bump_locked(rows.ids, rows.namespaces)
            logged = replace(rows, bump=bump)  # the bump travels with the rows (see _wal.py)
            record = encode_rows(logged)
            what = f"log {rows.ids.shape[0]} rows"
            try:
                end, fd = self.wal.write(record)
            except Exception as exc:
                raise StorageError(storage_message(what, self._tables.path, exc)) from exc
            self.pending_ops += int(rows.ids.shape[0])
            with self._lock:  # no other record can come between: the mirror takes this one as it is
                own_applied = self._follower.apply_own_record_locked(
                    _owned(logged), (end[0], end[1] - len(record)), end)
        try:
            if not own_applied:
                # Before the fdatasync, as the record applied under the lock would be: the add then returns as soon
                # as it is durable, instead of following the log once it has a core again.
                with self._lock:
                    self._follower.follow_log_locked()  # applies this record (and any other process's before it)
        finally:
            self._sync(fd, end, what)  # durable here: outside the lock, so writers share an fdatasync
        if bump is not None:
            bump = replace(bump, record_end=end)
        if self.pending_ops >= self._flush_rows:
            self._wake.set()
        return bump


    def _delete_logged(self, ids: np.ndarray) -> tuple[int, Bump | None] | None:
        """Log the delete (durable once fdatasynced; the flusher commits it, ordered after every add logged before
        it). Counts the rows that existed from the mirror, which is exact under the append lock once in step with
        the table and the log. None without a mirror (nothing to count from): the caller commits directly."""
        self._follow_before_lock()
        with self.wal.locked():
            with self._lock:
                self._life.ensure_open()
                # Every logged write, and the note of every write that bypassed the log, into the mirror: it then
                # holds every acknowledged row, so the count is exact without asking LanceDB for its version.
                self._follower.follow_log_locked()
                mirror = self._follower.mirror
                if mirror is None:
                    return None
                deleted = int(mirror.positions(ids).shape[0])
                if deleted == 0:
                    # Nothing found: the table's version settles whether that holds. Then nothing to delete in the
                    # table or the log: no record. Unless the mirror's version lags (deferred while another writer
                    # works) and a write outside this store's log could hold the ids: commit directly.
                    settled = self._follower.sync_locked()
                    mirror = self._follower.mirror
                    deleted = 0 if mirror is None else int(mirror.positions(ids).shape[0])
                    if deleted == 0:
                        return (0, None) if settled and mirror is not None else None
                bump = self._bump_locked(ids, None)
            what = f"log the delete of {ids.size} rows"
            record = encode_delete(ids, bump)
            try:
                end, fd = self.wal.write(record)
            except Exception as exc:
                raise StorageError(storage_message(what, self._tables.path, exc)) from exc
            self.pending_ops += int(ids.shape[0])
            with self._lock:  # no other record can come between: the mirror takes this one as it is
                own_applied = self._follower.apply_own_record_locked(
                    Deleted(ids.copy(), bump), (end[0], end[1] - len(record)), end)
        self._sync(fd, end, what)  # durable here, outside the lock (group commit)
        if bump is not None:
            bump = replace(bump, record_end=end)
        if not own_applied:
            with self._lock:
                self._follower.follow_log_locked()  # applies this delete (and any record before it) to the mirror
        if self.pending_ops >= self._flush_rows:
            self._wake.set()
        return deleted, bump


    _writer.Writer._queue_waits_locked = _queue_waits_locked
    _writer.Writer._add_logged = _add_logged
    _writer.Writer._delete_logged = _delete_logged
