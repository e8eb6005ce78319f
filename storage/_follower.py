"""This process's view of the cold table (the exact mirror, BM25), kept in step with the table and with the log."""
from __future__ import annotations

import math
import os
import time
from typing import Callable, Protocol

import numpy as np

from ..errors import StorageError
from ._bm25 import Bm25Index
from ._maintenance import LOCK_FILE_NAME as MAINTENANCE_LOCK_NAME
from ._mirror import VectorMirror
from ._schema import VECTOR_COLUMN, timestamps_us, vectors_from_arrow
from ._tables import LanceTables, row_keeping_versions, version_summaries
from ..sync import HEADER_SIZE, Deleted, Header, LogFollower, Rows, lock_held, read_header
from ._wal import WriteAheadLog

# With the log on and the mirror loaded, a read asks LanceDB for the table's latest version at most this often.
# Every row change of a process that logs reaches the mirror through the log (logged rows and deletes, or a
# "changed" note of a write that bypassed it), so the version only moves the mirror's bookkeeping forward; the ask
# itself is a round trip into LanceDB's event-loop thread and a listing of _versions, which writers would otherwise
# make several times per write inside the store's cross-process write lock, and readers once per search. With many
# processes on few cores that round trip waits for the loop thread to be scheduled, so it is asked rarely.
_VERSION_CHECK_S = 1.0
# The same for a table in object storage (ColdStore's table_uri), where the listing is a request to the store (tens of
# milliseconds on S3, a failure while it is away): only this host's processes write such a table, and their changes
# all come through the log, so the version is bookkeeping there.
REMOTE_VERSION_CHECK_S = 30.0
# After a read found the version moved while another writer was at work (a flush between its commit and its
# rotation) and left it for later, the reads of the next moment leave it too without asking while a writer is still
# at work (two flock probes): otherwise every read in every process asks once per read until that writer is done.
_DEFERRED_VERSION_RECHECK_S = 0.1
_LOAD_ATTEMPTS = 5


def mirror_bytes(rows: int, dim: int) -> int:
    """What the mirror holds for `rows` rows (vector, id, created_at, namespace), against mirror_max_bytes."""
    return rows * (dim * 4 + 24)


def keyword_texts(roles: list, texts: list) -> list[str]:
    """What BM25 indexes: the speaker (role) with the text, since questions name who said things."""
    return [text if not role else f"{role} {text}" for role, text in zip(roles, texts)]


class MirrorWatcher(Protocol):
    """Told when the follower replaces its mirror (a reload; None once past its budget) or the mirror grew."""

    def mirror_replaced(self, old: VectorMirror | None, new: VectorMirror | None) -> None:
        """The follower loaded mirror `new`, or dropped its mirror past the budget (None); `old` is the one before
        (None at the first load)."""
        ...

    def mirror_grew(self) -> None:
        """The mirror was changed in place (logged rows applied, or this process's direct write) and is still within
        its budget."""
        ...


class RowListener(Protocol):
    """Told of every row change the follower sees (any process's, this one's included), so that what a caller keeps
    about rows (the coordinator's cache of texts and metadata) follows the store."""

    def rows_logged(self, rows: Rows) -> None:
        """These rows were added or replaced (the log's record, every column)."""
        ...

    def rows_deleted(self, ids: np.ndarray) -> None:
        """These rows were deleted."""
        ...

    def rows_reloaded(self) -> None:
        """The mirror was reloaded from the table: any row may have changed (a write that bypassed the log)."""
        ...


class _NoWatcher:
    def mirror_replaced(self, old: VectorMirror | None, new: VectorMirror | None) -> None:
        pass

    def mirror_grew(self) -> None:
        pass


class Follower:
    """Owns the mirror (None past mirror_max_bytes: LanceDB then serves searches) and the table version it reflects,
    the BM25 index (built by the first keyword search), this process's read position in the log, the newest logged
    operation of each id that no flush has consumed yet (`get` answers from it), and the table versions known to keep
    the mirror's rows. Methods named *_locked run under the store's lock; `watcher` (the FAISS index) hears of every
    new mirror."""

    def __init__(self, path: str, dim: int, tables: LanceTables, wal: WriteAheadLog | None, *,
                 mirror_max_bytes: int, read_only: bool) -> None:
        self.dim = dim
        self._version_check_s = REMOTE_VERSION_CHECK_S if tables.uri != tables.path else _VERSION_CHECK_S
        self._tables = tables
        self._wal = wal
        self._log = None if wal is None else LogFollower(wal.folder)
        self._mirror_max_bytes = mirror_max_bytes
        self.watcher: MirrorWatcher = _NoWatcher()
        self.listeners: list[RowListener] = []
        self.mirror: VectorMirror | None = None
        self.mirror_version = -1
        self.row_estimate = 0
        self.bm25: Bm25Index | None = None
        # id -> (gen, offset, Rows or None for a delete, row index), as this process followed the log.
        self._unflushed: dict[int, tuple] = {}
        # Table versions past the mirror's whose effect the mirror already holds: a flush of logged records (known from
        # the log's rotation) or a compaction / index build (a "benign" note in the log, or list_versions(), which
        # lists every kept version: each is judged once, never again). Versions never change.
        self._known: set[int] = set()
        self._version_settled_at = -math.inf  # when a read last found the mirror at the table's latest version
        self._version_deferred_at = -math.inf  # when a read last left a moved version for later (sync_locked)
        self._maintenance_probe_fd: int | None = None  # for _writer_active()
        if wal is not None:
            probe = os.path.join(path, MAINTENANCE_LOCK_NAME)
            if not read_only or os.path.exists(probe):
                self._maintenance_probe_fd = os.open(probe, os.O_RDONLY if read_only else os.O_RDWR | os.O_CREAT, 0o600)

    @property
    def log_generation(self) -> int | None:
        """The log generation this process reads (None without a log)."""
        return None if self._log is None else self._log.gen

    # ---- loading -------------------------------------------------------------------------------
    def reload_locked(self) -> None:
        """Rebuild the mirror from one pinned table version (so the copy is a consistent snapshot), then apply the
        logged rows that version does not hold yet."""
        for _ in range(_LOAD_ATTEMPTS):
            self._load_table_locked()
            self._unflushed.clear()  # refilled by the attach below, from the generation the loaded version may lack
            if self._wal is None or self._attach_log_locked():
                return
        raise StorageError(f"cold tier: could not line up the write-ahead log of {self._tables.path} with the table "
                           f"(log generations deleted while loading); reopen the store")

    def _load_table_locked(self) -> None:
        def load():
            reader = self._tables.open_table()
            version = reader.version
            reader.checkout(version)
            rows = reader.count_rows()
            if mirror_bytes(rows, self.dim) > self._mirror_max_bytes:
                return version, None, rows
            data = reader.search().select(["id", "namespace", "created_at", VECTOR_COLUMN]).limit(None).to_arrow()
            return version, data, rows
        version, data, rows = self._tables.guard("load the search mirror", load)
        old = self.mirror
        self.mirror_version = version
        self.row_estimate = rows
        for listener in self.listeners:
            listener.rows_reloaded()
        self.bm25 = None  # rebuilt from the table on the next keyword search
        if data is None:
            self.mirror = None
            self.watcher.mirror_replaced(old, None)
            return
        mirror = VectorMirror(self.dim, capacity=max(1024, data.num_rows + data.num_rows // 4))
        if data.num_rows:
            mirror.upsert(np.asarray(data.column("id").to_numpy(), dtype=np.int64),
                          vectors_from_arrow(data.column(VECTOR_COLUMN), self.dim),
                          data.column("namespace").to_pylist(), timestamps_us(data.column("created_at")))
        self.mirror = mirror
        self.watcher.mirror_replaced(old, mirror)

    def _attach_log_locked(self) -> bool:
        """After loading table version V: follow the log from the newest generation whose rows V may lack (the
        newest whose base_version <= V; see _wal.py for why that view is consistent). False: generations were
        deleted meanwhile, load again."""
        wal, log = self._wal, self._log
        for gen in reversed(wal.generations()):
            try:
                fd = wal.open_gen(gen)
            except FileNotFoundError:
                return False
            try:
                base = read_header(fd).base_version
            finally:
                os.close(fd)
            if base <= self.mirror_version:
                try:
                    log.start_at(gen)
                except FileNotFoundError:
                    return False
                return self._apply_log_events_locked(log.poll())
        return False

    # ---- following the log ---------------------------------------------------------------------
    def follow_log_locked(self) -> None:
        """Apply what was logged since the last look (this process's writes included); reload when the log cannot be
        lined up with the mirror's table version."""
        if self._log is None:
            return
        events = self._tables.guard("read the write-ahead log", self._log.poll)
        if events and not self._apply_log_events_locked(events):
            self.reload_locked()

    def apply_own_record_locked(self, record: "Rows | Deleted", start: tuple[int, int], end: tuple[int, int]) -> bool:
        """This process's own record, written between `start` and `end` (a log's bytes never change once written),
        applied as a poll would apply it, without reading it back: only when this follower stands exactly at `start`
        (every record before it applied). Returns whether it did; if not, a follow_log_locked() reads it."""
        log = self._log
        if log is None or log.fd is None or log.position != tuple(start) or start[0] != end[0]:
            return False
        record.gen, record.offset, record.end = start[0], start[1], end[1]
        if isinstance(record, Rows):
            self._apply_logged_rows_locked(record)
        else:
            self._apply_logged_delete_locked(record)
        log.offset = end[1]
        return True

    def _apply_log_events_locked(self, events: list) -> bool:
        for kind, item in events:
            if kind == "rows":
                self._apply_logged_rows_locked(item)
            elif kind == "deleted":
                self._apply_logged_delete_locked(item)
            elif kind == "note":
                if item.kind == "changed":
                    if int(item.versions.max()) > self.mirror_version:
                        return False  # a write that bypassed the log changed rows this mirror lacks: reload
                else:  # "benign"
                    self.note_row_keeping_locked(item.versions.tolist())
                    self._advance_locked()
            elif kind == "rotated":
                self._drop_flushed_locked(item)
                # The previous generation's records (all applied above) were committed on top of pre_version, giving
                # base_version; versions in between are that flush's commits and compactions (see _wal.py). If the
                # mirror reflects pre_version, it now reflects base_version; otherwise sync_locked() settles the
                # versions before pre_version (a note may still come, or list_versions(), or a reload).
                if item.base_version > self.mirror_version:
                    self._known.update(range(max(item.pre_version, self.mirror_version) + 1, item.base_version + 1))
                    self._advance_locked()
            else:  # "gap"
                return False
        return True

    def note_row_keeping_locked(self, versions) -> None:
        """Table versions known to keep every row (a compaction or index build): the mirror's version moves over them
        once it reaches them."""
        self._known.update(int(v) for v in versions if v > self.mirror_version)

    def _advance_locked(self) -> None:
        """Move the mirror's version over the versions whose effect it already holds."""
        known, v = self._known, self.mirror_version
        while v + 1 in known:
            v += 1
        self.mirror_version = v
        if len(known) > 1024:
            known.difference_update([k for k in known if k <= v])

    def _apply_logged_rows_locked(self, rows: Rows) -> None:
        m = self.mirror
        if m is not None:
            m.upsert(rows.ids, rows.vectors, rows.namespaces, rows.created_at_us)
            self.row_estimate = m.live_rows
            self._mirror_grew_locked()
        else:
            self.row_estimate += int(rows.ids.shape[0])
        if self.bm25 is not None:
            self.bm25.upsert(rows.ids.tolist(), rows.namespaces, keyword_texts(rows.roles, rows.texts))
        for j, row_id in enumerate(rows.ids.tolist()):
            self._unflushed[row_id] = (rows.gen, rows.offset, rows, j)
        for listener in self.listeners:
            listener.rows_logged(rows)

    def _apply_logged_delete_locked(self, deleted: Deleted) -> None:
        m = self.mirror
        if m is not None:
            m.remove(deleted.ids)
            self.row_estimate = m.live_rows
        else:
            self.row_estimate = max(0, self.row_estimate - int(deleted.ids.shape[0]))
        if self.bm25 is not None:
            self.bm25.remove(deleted.ids.tolist())
        for row_id in deleted.ids.tolist():
            self._unflushed[row_id] = (deleted.gen, deleted.offset, None, -1)
        for listener in self.listeners:
            listener.rows_deleted(deleted.ids)

    def _drop_flushed_locked(self, header: Header) -> None:
        """A new generation began: the previous one's records before carried_from are in the table now (forget them);
        those after were copied to the start of the new one (follow them there)."""
        if not self._unflushed:
            return
        moved = HEADER_SIZE - header.carried_from
        for row_id, (gen, offset, rows, j) in list(self._unflushed.items()):
            if gen == header.prev_gen:
                if offset < header.carried_from:
                    del self._unflushed[row_id]
                else:
                    self._unflushed[row_id] = (header.gen, offset + moved, rows, j)

    def _mirror_grew_locked(self) -> None:
        if self.mirror.nbytes() > self._mirror_max_bytes:
            old, self.mirror = self.mirror, None  # past the budget: LanceDB (and its ANN index) serves searches
            self.watcher.mirror_replaced(old, None)
        else:
            self.watcher.mirror_grew()

    # ---- the table's version -------------------------------------------------------------------
    def _benign_versions(self, start: int, end: int) -> bool:
        """True if the mirror holds the effect of every version in (start, end]: known already (flushed from the log,
        or a compaction's note), or kept the rows as they were (compaction, index builds).

        The latter is judged from each version's summary against its predecessor (same_rows), by list_versions(),
        once per version (verdicts are kept in self._known). Unknown versions (cleaned up) count as changes.
        """
        if end <= start:
            return True
        known = self._known
        if all(v in known for v in range(start + 1, end + 1)):
            return True
        try:
            summaries = version_summaries(self._tables.table)
        except Exception:
            return False
        known.update(row_keeping_versions(summaries, start))
        return all(v in known for v in range(start + 1, end + 1))

    def sync_locked(self, *, defer: bool = True) -> bool:
        """Bring the mirror to the table's latest version before a read (another process may have written).

        Versions the log does not explain yet, seen while another writer is at work (a flush between its commit and
        its rotation, a compaction before its note), are left for a later sync (defer): every acknowledged change is
        in the log already (rows, deletes, or a "changed" note of a write that bypassed it), so the mirror is
        complete; only its version lags. Once no writer is at work, unexplained versions are checked (list_versions)
        and, if they changed rows, the mirror is reloaded. Returns False when it deferred; for
        _DEFERRED_VERSION_RECHECK_S after a deferral, while a writer is still at work, it defers without asking
        LanceDB again."""
        self.follow_log_locked()
        logged = self.mirror is not None and self._wal is not None and not self._tables.lagging_reads
        if defer and logged:
            now = time.monotonic()
            if now - self._version_settled_at < self._version_check_s:
                return True  # settled a moment ago, and every row change since came through the log (above)
            if now - self._version_deferred_at < _DEFERRED_VERSION_RECHECK_S and self._writer_active():
                return False  # left for later a moment ago, and that writer (or another) is still at work
        latest = self._tables.guard("read the table version", lambda: self._tables.table.version)
        if latest <= self.mirror_version:
            # Equal: nothing moved. Lower: with read_consistency_interval_s > 0 this handle may lag behind the
            # snapshot the mirror was loaded from; the mirror is already the newer view.
            self._version_settled_at = time.monotonic()
            return True
        if logged:
            if defer and self._writer_active():
                self._version_deferred_at = time.monotonic()
                return False
            self.follow_log_locked()  # a rotation or note written just before that writer let go
            if latest <= self.mirror_version:
                return True
        if (self.mirror is not None and latest > self.mirror_version
                and self._benign_versions(self.mirror_version, latest)):
            self.mirror_version = latest
            self._advance_locked()
            self._version_settled_at = time.monotonic()
            return True
        self.reload_locked()
        self._version_settled_at = time.monotonic()
        return True

    def _writer_active(self) -> bool:
        """A flush, a write that bypasses the log, or maintenance (compaction, index builds) is running now."""
        probe = self._maintenance_probe_fd
        return self._wal.flush_in_progress() or (probe is not None and lock_held(probe))

    # ---- this process's writes that bypassed the log -------------------------------------------
    def _after_own_write_locked(self, new_version: int, apply: Callable[[VectorMirror], None]) -> None:
        if self.mirror is None:
            if mirror_bytes(self._tables.table.count_rows(), self.dim) <= self._mirror_max_bytes // 2:
                self.reload_locked()  # shrank well below the budget: exact in-memory search again
            else:
                self.mirror_version = new_version
            return
        if new_version == self.mirror_version:
            return
        if new_version == self.mirror_version + 1 or self._benign_versions(self.mirror_version, new_version - 1):
            apply(self.mirror)
            self.mirror_version = new_version
            self._mirror_grew_locked()
        else:
            self.reload_locked()  # someone else changed rows in between: start from the truth

    def own_upsert_locked(self, new_version: int, rows: Rows) -> None:
        """This process committed `rows` directly (table version `new_version`)."""
        self._after_own_write_locked(
            new_version, lambda m: m.upsert(rows.ids, rows.vectors, rows.namespaces, rows.created_at_us))
        n = int(rows.ids.shape[0])
        self.row_estimate = self.row_estimate + n if self.mirror is None else self.mirror.live_rows
        if self.bm25 is not None:
            self.bm25.upsert(rows.ids.tolist(), rows.namespaces, keyword_texts(rows.roles, rows.texts))

    def own_delete_locked(self, new_version: int, ids: np.ndarray, deleted: int) -> None:
        """This process deleted `ids` directly (`deleted` rows existed; table version `new_version`)."""
        self._after_own_write_locked(new_version, lambda m: m.remove(ids))
        self.row_estimate = max(0, self.row_estimate - deleted)
        if self.bm25 is not None:
            self.bm25.remove(ids.tolist())

    # ---- what reads need -----------------------------------------------------------------------
    def newest_logged(self, row_id: int) -> tuple[Rows | None, int] | None:
        """The newest operation on `row_id` still only in the log: (its Rows, the row's index), (None, -1) for a
        delete; None when the table holds the newest state of the id."""
        entry = self._unflushed.get(row_id)
        return None if entry is None else (entry[2], entry[3])

    def bm25_locked(self) -> Bm25Index:
        """The BM25 index, built from the table and the log's unflushed operations on first use."""
        if self.bm25 is None:
            data = self._tables.guard("load texts for BM25", lambda: self._tables.table.search()
                                      .select(["id", "namespace", "role", "text"]).limit(None).to_arrow())
            bm25 = Bm25Index()
            bm25.upsert(data.column("id").to_pylist(), data.column("namespace").to_pylist(),
                        keyword_texts(data.column("role").to_pylist(), data.column("text").to_pylist()))
            # Operations logged since the last flush (newer than the table's rows; re-applying a flushed one is
            # harmless): the newest of each id.
            gone = [row_id for row_id, (_, _, rows, _) in self._unflushed.items() if rows is None]
            if gone:
                bm25.remove(gone)
            for row_id, (_, _, rows, j) in self._unflushed.items():
                if rows is not None:
                    bm25.upsert([row_id], [rows.namespaces[j]], keyword_texts([rows.roles[j]], [rows.texts[j]]))
            self.bm25 = bm25
        return self.bm25

    def figures(self) -> dict:
        """mirror_rows, mirror_positions (None without a mirror) and the BM25 index's figures, for ColdStore.stats()."""
        m = self.mirror
        return {
            "mirror_rows": None if m is None else m.live_rows,
            "mirror_positions": None if m is None else m.n,  # live rows plus deleted ones until the next repack
            # BM25 (built by the first keyword search): live_rows, slots, terms
            "keyword_index": None if self.bm25 is None else self.bm25.stats(),
        }

    def close(self) -> None:
        """Drops the mirror and BM25 index and closes the log follower and the maintenance probe."""
        self.mirror = None
        self.bm25 = None
        if self._log is not None:
            self._log.close()
        if self._maintenance_probe_fd is not None:
            os.close(self._maintenance_probe_fd)
            self._maintenance_probe_fd = None
