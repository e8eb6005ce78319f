"""The cold tier's write path: logged adds and deletes, writes that bypass the log, flushes and the flusher thread."""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from ..errors import ReadOnlyStore, StorageError
from ..sync import Bump, Deleted, Note, Rows, RowsDraft, WriteGenerations, decode_record, encode_delete, encode_note
from ._lifecycle import Lifecycle
from ._schema import build_batch, sql_id_list
from ._tables import LanceTables, storage_message
from ._wal import WriteAheadLog

if TYPE_CHECKING:
    from ._follower import Follower

# Adds of more rows than this bypass the log (after flushing it): one LanceDB commit is cheap per row for a batch.
_WAL_MAX_ROWS = 1024
_MAX_FLUSH_BACKOFF_S = 30.0
_ROW_COLUMNS = ("namespaces", "sessions", "roles", "texts", "metadata_json")


def last_operations(records: list, schema) -> tuple[np.ndarray, object | None, int]:
    """The last logged operation of each id among a generation's `records` [(offset, payload)]: the ids whose last
    operation is a delete (sorted), an Arrow batch of the newest row of every other id (None if there is none), and
    how many rows that batch holds. Notes change no rows and are left out."""
    parts = [r for _, p in records if not isinstance(r := decode_record(p), Note)]
    rows = [r for r in parts if isinstance(r, Rows)]
    op_ids = np.concatenate([r.ids for r in parts] or [np.empty(0, np.int64)])
    is_delete = np.concatenate([np.full(r.ids.shape[0], isinstance(r, Deleted)) for r in parts] or [np.empty(0, bool)])
    row_at = np.full(op_ids.shape[0], -1, np.int64)
    row_at[~is_delete] = np.arange(int((~is_delete).sum()))
    _, last = np.unique(op_ids[::-1], return_index=True)
    final = np.sort(op_ids.shape[0] - 1 - last)
    delete_ids = np.sort(op_ids[final][is_delete[final]])
    keep = row_at[final][~is_delete[final]]
    if not keep.shape[0]:
        return delete_ids, None, 0
    picks = keep.tolist()
    cols = {name: [v for r in rows for v in getattr(r, name)] for name in _ROW_COLUMNS}
    cols = {name: [values[i] for i in picks] for name, values in cols.items()}
    batch = build_batch(schema, ids=np.concatenate([r.ids for r in rows])[keep],
                        vectors=np.concatenate([r.vectors for r in rows])[keep],
                        created_at_us=np.concatenate([r.created_at_us for r in rows])[keep],
                        namespaces=cols["namespaces"], texts=cols["texts"], sessions=cols["sessions"],
                        roles=cols["roles"], metadata_json=cols["metadata_json"])
    return delete_ids, batch, int(keep.shape[0])


def _owned(rows: Rows) -> Rows:
    """The rows with arrays and lists of their own, as decoding the record would give them: the follower keeps what
    it applies (get() answers logged rows from it), and the caller's arrays and lists are the caller's."""
    return replace(rows, ids=rows.ids.copy(), vectors=rows.vectors.copy(), created_at_us=rows.created_at_us.copy(),
                   namespaces=list(rows.namespaces), sessions=list(rows.sessions), roles=list(rows.roles),
                   texts=list(rows.texts), metadata_json=list(rows.metadata_json))


class Writer:
    """Every write of one store, in the lock order of _wal.py: the flush lock, then the append lock, then the store's
    lock. Owns the append and flush side of the log: the operations this process logged that no flush has consumed
    yet (they wake the flusher), the flusher thread and the flush figures; and it bumps the write generations. With
    no log (wal=False, or a read-only store without one) every write commits to LanceDB before returning."""

    def __init__(self, *, wal: WriteAheadLog | None, follower: "Follower", tables: LanceTables,
                 generations: WriteGenerations | None, lock: threading.RLock, unlogged_commits: threading.RLock,
                 life: Lifecycle, read_only: bool, flush_rows: int, flush_s: float,
                 note_writes: Callable[[], None]) -> None:
        self.wal = wal
        self._unlogged_commits = unlogged_commits  # without a log: held by direct writes and by compactions
        self._follower = follower
        self._tables = tables
        self._generations = generations
        self._lock = lock
        self._life = life
        self._read_only = read_only
        self._flush_rows = flush_rows
        self._flush_s = flush_s
        self._note_writes = note_writes  # a commit for background maintenance to count
        self.pending_ops = 0  # operations this process logged that no flush has consumed yet
        self.flushes = 0
        self.flushed_rows = 0
        self.last_flush_s: float | None = None
        self.errors = 0
        self.last_error: str | None = None
        self._flusher: threading.Thread | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()

    def logs(self, *, rows: int | None = None, delete: bool = False) -> bool:
        """Whether an add of `rows` rows (or a delete) is logged rather than committed directly (a delete checks the
        mirror again under the append lock, and commits directly if it went meanwhile)."""
        if self.wal is None or self._read_only:
            return False
        if delete:
            return not self._tables.lagging_reads and self._follower.mirror is not None
        return rows is not None and rows <= _WAL_MAX_ROWS

    # ---- adds ----------------------------------------------------------------------------------
    def add(self, rows: Rows, *, new_ids: bool = False) -> Bump | None:
        """Upsert checked rows; durable when this returns. new_ids: the caller drew the ids at random for this add
        (see ColdStore.add)."""
        if self.logs(rows=int(rows.ids.shape[0])):
            return self._add_logged(rows, new_ids=new_ids)
        batch = build_batch(self._tables.schema, ids=rows.ids, vectors=rows.vectors, namespaces=rows.namespaces,
                            texts=rows.texts, sessions=rows.sessions, roles=rows.roles,
                            created_at_us=rows.created_at_us, metadata_json=rows.metadata_json)
        with self._direct_write():  # runs while the log is empty (see _wal.py)
            return self._add_committed(rows, batch)

    def _bump_locked(self, ids: np.ndarray, namespaces: list[str] | None) -> Bump | None:
        """Counts a write of rows `ids` (into `namespaces`; None for a delete) in the write generations before it is
        acknowledged. It touches the namespaces it writes into and those the ids are in now, which only the mirror
        knows cheaply: without one the write counts as unplaced. Called under the lock that orders this write after
        every earlier one (the log's append lock, or a direct write's), with the mirror in step with them, or, for
        ids no earlier write holds, with the mirror as it is (see _add_logged)."""
        gens = self._generations
        if gens is None:
            return None
        mirror = self._follower.mirror
        if mirror is None:
            return gens.bump(None)
        return gens.bump(set(namespaces or ()) | mirror.namespaces_of(ids))

    def _follow_before_lock(self) -> None:
        """Most of what other processes logged, applied before the append lock is taken (the log is read without
        it), so the follow under the lock only has the records of the last moment left: the lock's holder would
        otherwise apply every other writer's records while they all wait."""
        with self._lock:
            self._life.ensure_open()
            self._follower.follow_log_locked()

    def _add_logged(self, rows: Rows, *, new_ids: bool = False) -> Bump | None:
        draft = RowsDraft(rows)  # all of the record but its bump, encoded before the lock
        own = _owned(rows)
        self._follow_before_lock()
        with self.wal.locked():
            self._life.ensure_open()
            with self._lock:
                # The bump needs the namespaces the ids are in now: every earlier logged write into the mirror first.
                # Ids drawn at random for this add are in none (unless the mirror already knows one: then the full
                # way), so for them nothing another process logged since the follow above is needed here: their
                # records reach the mirror with this one, after the lock. Applying them here would make the section
                # grow with the queue for the lock, each writer applying what the others logged while it waited.
                mirror = self._follower.mirror
                if not new_ids or mirror is None or mirror.positions(rows.ids).size:
                    self._follower.follow_log_locked()
                bump = self._bump_locked(rows.ids, rows.namespaces)
            record = draft.record(bump)  # the bump travels with the rows (see _wal.py)
            what = f"log {rows.ids.shape[0]} rows"
            try:
                end, fd = self.wal.write(record)
            except Exception as exc:
                raise StorageError(storage_message(what, self._tables.path, exc)) from exc
            self.pending_ops += int(rows.ids.shape[0])
        self._apply_own_then_sync(replace(own, bump=bump), len(record), end, fd, what)
        if bump is not None:
            bump = replace(bump, record_end=end)
        if self.pending_ops >= self._flush_rows:
            self._wake.set()
        return bump

    def _apply_own_then_sync(self, own: "Rows | Deleted", size: int, end: tuple[int, int], fd: int,
                             what: str) -> None:
        """After the append lock: this process's record (`size` bytes ending at `end`) into the mirror, as written
        when the follower stands at its start, or else by following the log (which applies the other processes'
        records before it too), then made durable. Both outside the lock, which covers only the bump and the
        append; the apply before the fdatasync, so the write returns as soon as it is durable, and the fdatasync
        in a finally, so a failed apply leaves no acknowledged record unsynced and no fd open."""
        try:
            with self._lock:
                if not self._follower.apply_own_record_locked(own, (end[0], end[1] - size), end):
                    self._follower.follow_log_locked()
        finally:
            self._sync(fd, end, what)  # durable here: outside the lock, so writers share an fdatasync

    def _add_committed(self, rows: Rows, batch) -> Bump | None:
        ids, n = rows.ids, int(rows.ids.shape[0])
        tables = self._tables

        def upsert():
            return (tables.table.merge_insert("id").when_matched_update_all()
                    .when_not_matched_insert_all().execute(batch))

        with self._lock:
            self._life.ensure_open()
            self._follower.sync_locked(defer=False)  # the flush lock is ours: no other writer to wait for
            bump = self._bump_locked(ids, rows.namespaces)
            expected = self._follower.mirror_version + 1
            mirror = self._follower.mirror
            if mirror is not None and mirror.positions(ids).size == 0:
                # All ids are new as of the latest version: a plain append skips merge_insert's join.
                result = tables.commit(f"add {n} rows", lambda: tables.table.add(batch))
                id_filter = f"id IN {sql_id_list(ids)}"
                if (result.version != expected
                        and tables.guard("check for duplicate ids", lambda: tables.table.count_rows(id_filter)) != n):
                    # Another process committed the same ids meanwhile: keep one row per id, this batch's.
                    tables.commit("remove duplicate ids", lambda: tables.table.delete(id_filter))
                    result = tables.commit(f"add {n} rows", upsert)
            else:
                result = tables.commit(f"add {n} rows", upsert)
            self._follower.own_upsert_locked(result.version, rows)
            note_at = self._announce_locked(encode_note("changed", [result.version]), f"log the add of {n} rows")
            if bump is not None and note_at is not None:
                bump = replace(bump, note_at=note_at)
        self._note_writes()
        return bump

    def _sync(self, fd: int, end: tuple[int, int], what: str) -> None:
        """fdatasync of a record this process wrote to the log (and closes fd). On failure the record is in the
        log but perhaps not on disk: other processes may already have read it, so it cannot be taken back."""
        try:
            self.wal.sync(fd, end)
        except OSError as exc:
            raise StorageError(storage_message(f"{what} (the record was written but could not be made durable: "
                                               "whether it is kept is not known; write it again)", self._tables.path,
                                               exc)) from exc
        finally:
            os.close(fd)

    # ---- deletes -------------------------------------------------------------------------------
    def delete(self, ids: np.ndarray) -> tuple[int, Bump | None]:
        """Delete checked, unique, non-empty ids: (how many existed, the bump)."""
        if self.logs(delete=True):
            done = self._delete_logged(ids)
            if done is not None:
                return done
        with self._direct_write():  # logged rows reach LanceDB first, so the delete covers them and none comes back
            return self._delete_committed(ids)

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
        self._apply_own_then_sync(Deleted(ids.copy(), bump), len(record), end, fd, what)
        if bump is not None:
            bump = replace(bump, record_end=end)
        if self.pending_ops >= self._flush_rows:
            self._wake.set()
        return deleted, bump

    def _delete_committed(self, ids: np.ndarray) -> tuple[int, Bump | None]:
        tables = self._tables
        with self._lock:
            self._life.ensure_open()
            self._follower.sync_locked(defer=False)  # both log locks are ours: the mirror knows every earlier write
            bump = self._bump_locked(ids, None)
            result = tables.commit(f"delete {ids.size} rows", lambda: tables.table.delete(f"id IN {sql_id_list(ids)}"))
            deleted = int(result.num_deleted_rows)
            self._follower.own_delete_locked(result.version, ids, deleted)
            if deleted or bump is not None:  # with its bump, so the hot tier's side of it is applied from the log
                end = self._announce_locked(encode_delete(ids, bump), f"log the delete of {ids.size} rows")
                if bump is not None and end is not None:
                    bump = replace(bump, record_end=end)
        if deleted:
            self._note_writes()
        return deleted, bump

    # ---- writes that bypass the log ------------------------------------------------------------
    @contextmanager
    def _direct_write(self) -> Iterator[None]:
        """For a write that bypasses the log (delete, large add): both log locks, and the log flushed and empty
        (see _wal.py). Lock order: flush lock, append lock, then the store's lock."""
        if self.wal is None:
            with self._unlogged_commits:
                yield
            return
        with self.wal.flushing():
            self._flush_locked()  # the bulk of the log, appends going on meanwhile
            with self.wal.locked():
                self._flush_locked(appends_held=True)  # what was appended during that flush; the log is now empty
                yield

    def _announce_locked(self, record: bytes, what: str) -> tuple[int, int] | None:
        """After a write that bypassed the log (under _direct_write, so the append lock is ours): tell the other
        processes through the log before the write is acknowledged (a repeated delete, or a "changed" note), so none
        of them leaves it out of its mirror while it waits for another writer (see Follower.sync_locked). Returns
        where the record begins (None without a log)."""
        if self.wal is None:
            return None
        start = self.wal.end_locked()
        try:
            self.wal.append(record)
        except Exception as exc:
            raise StorageError(storage_message(what, self._tables.path, exc)) from exc
        self._follower.follow_log_locked()
        return start

    # ---- flushes -------------------------------------------------------------------------------
    def _flush_locked(self, *, appends_held: bool = False) -> int:
        """Under the flush lock: commit the last logged operation of each id to LanceDB (delete, or upsert of its
        newest logged row), then start a new log generation. Appends go on during the commit (their records are
        carried into the new generation) unless the caller holds the append lock (`appends_held`: the log is then
        empty after). Returns the rows flushed (upserted or deleted)."""
        if self.wal is None:
            return 0
        tables = self._tables
        with self.wal.locked():
            gen, records, end = tables.guard("read the write-ahead log", self.wal.pending)
            # Every operation this process counted so far is in `records` (both are read under the append lock), so
            # this flush consumes exactly that many of them. Counting down by the ids committed instead would let the
            # count drift up whenever an id had several operations in one generation (add then delete: two logged,
            # one committed), until every single write woke the flusher: one LanceDB commit per write.
            consumed = self.pending_ops
            if not records:  # another process's flush took them
                self.pending_ops = 0
        if not records:
            return 0
        t0 = time.perf_counter()
        delete_ids, batch, upserts = last_operations(records, tables.schema)
        table = tables.flush_table
        pre = tables.guard("read the table version", lambda: table.version)
        version = pre
        # Deleted and upserted ids are disjoint, so the order of the two commits does not matter; both are
        # idempotent, so a flusher killed between them (or before the rotation) is simply repeated by the next.
        if delete_ids.shape[0]:
            version = tables.commit(f"flush {delete_ids.shape[0]} logged deletes",
                                    lambda: table.delete(f"id IN {sql_id_list(delete_ids)}")).version
        if batch is not None:
            version = tables.commit(f"flush {upserts} logged rows",
                                    lambda: table.merge_insert("id").when_matched_update_all()
                                    .when_not_matched_insert_all().execute(batch)).version
        with self.wal.locked():
            tables.guard("rotate the write-ahead log", lambda: self.wal.rotate(gen, end, pre, version))
            self.pending_ops -= consumed  # what was logged during the commit stays counted
        with self._lock:
            if not self._life.closed:
                if tables.lagging_reads:  # this process's reads see its own flush, as they saw its own commits
                    tables.guard("refresh the table", tables.table.checkout_latest)
                self._follower.follow_log_locked()  # the rotation: the mirror now reflects the flush's table version
        flushed = upserts + int(delete_ids.shape[0])
        self.flushes += 1
        self.flushed_rows += flushed
        self.last_flush_s = time.perf_counter() - t0
        self._note_writes()
        return flushed

    def flush_now(self) -> int:
        """Moves what the log holds (of any process) into LanceDB, under the flush lock; returns the rows flushed
        (upserted or deleted): 0 without a log or once closed."""
        if self.wal is None or self._life.closed:
            return 0
        with self.wal.flushing():
            return self._flush_locked()

    def flush_for_read(self) -> bool:
        """Before a read that LanceDB serves: rows still in the log must be in the table. False when the flush failed
        (disk full, ...): the rows stay durable in the log (get() and the mirror answer from there), while where
        filters and LanceDB search paths answer without them until a flush succeeds (stats() reports
        wal_last_error). A read-only store cannot flush: such a read then fails with ReadOnlyStore (stats() says
        so instead), since it would miss the logged rows."""
        if self.wal is None or self.wal.pending_bytes() == 0:
            return True
        if self._read_only:
            raise ReadOnlyStore(
                f"cold tier: {self.wal.pending_bytes()} bytes of writes at {self._tables.path} are still only in its "
                "write-ahead log, which a read-only process cannot move into the table that this read needs (where "
                "filters, hybrid search past the log, stats): open the store writable once (or let its writer close "
                "it), or search without where")
        try:
            self.flush_now()
            return True
        except StorageError as exc:
            self.errors += 1
            self.last_error = str(exc)
            return False

    def flush_before_stats(self) -> None:
        """flush_for_read(), with a read-only store's refusal reported in stats() instead of raised."""
        try:
            self.flush_for_read()
        except ReadOnlyStore as exc:
            self.last_error = str(exc)

    # ---- the flusher ---------------------------------------------------------------------------
    def start(self) -> None:
        """On open: replay the log (rows a process logged but did not flush: it died, or is still running) into
        LanceDB, then start the flusher. A failed replay (a full disk, ...) leaves the rows in the log, served from
        there, and the flusher retries it."""
        if self.wal is None or self._read_only:
            return
        self.flush_for_read()
        self._flusher = threading.Thread(target=self._flusher_run, name=f"cold-wal-flusher:{self._tables.path}",
                                         daemon=True)
        self._flusher.start()

    def _flusher_run(self) -> None:
        backoff = self._flush_s
        while not self._stop.is_set():
            woken = self._wake.wait(backoff)
            self._wake.clear()
            if self._stop.is_set() or self._life.closed:
                break
            try:
                # On the timer, the store's flush cadence is shared: a process flushes only when no process has
                # for flush_s (each flush is a LanceDB commit that every process then follows, so flushing per
                # process would multiply them by the number of processes).
                since = self.wal.seconds_since_flush()
                if not woken and since < self._flush_s:
                    backoff = max(0.01, self._flush_s - since)
                    continue
                if self.wal.pending_bytes() > 0:
                    self.flush_now()
                backoff = self._flush_s
            except Exception as exc:  # the rows stay in the log; stats() reports the failure; retried later
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                backoff = min(_MAX_FLUSH_BACKOFF_S, backoff * 2)

    def stop(self) -> None:
        """At close: stop the flusher and flush what is logged, so LanceDB holds every row again (on failure the rows
        stay in the log and are replayed on the next open)."""
        if self._flusher is not None:
            self._stop.set()
            self._wake.set()
            self._flusher.join(60)
        if self.wal is not None and not self._read_only:
            try:
                self.flush_now()
            except Exception as exc:
                self.errors += 1
                self.last_error = f"flush at close: {type(exc).__name__}: {exc}"

    def figures(self) -> dict:
        """The log's flush figures for ColdStore.stats(): flushes, rows flushed, the last flush's time and errors."""
        return {
            "wal_flushes": self.flushes,
            "wal_flushed_rows": self.flushed_rows,
            "wal_last_flush_s": self.last_flush_s,
            "wal_errors": self.errors,
            "wal_last_error": self.last_error,
        }
