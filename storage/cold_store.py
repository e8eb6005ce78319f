"""ColdStore: the durable cold tier, a LanceDB table with an in-memory exact-search mirror and background upkeep."""
from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import warnings
from contextlib import contextmanager, nullcontext
from datetime import timedelta
from typing import Any, Callable, Iterator, TypeVar

import numpy as np

from ..errors import InvalidInput, ReadOnlyStore, StorageError, TieredRecallError
from . import _validate as check
from ._generations import Bump, WriteGenerations, open_generations
from ._ann import (TARGET_RECALL, IvfAnn, choose_method, choose_nlist, flat_search, read_choice, remove_choice,
                   write_choice)
from ._bm25 import Bm25Index, rrf_fuse
from ._maintenance import LOCK_FILE_NAME as MAINTENANCE_LOCK_NAME, MaintenanceThread, maintenance_lock
from ._mirror import VectorMirror, positions_bitmap, top_k_with_ties
from ._schema import (TABLE_NAME, VECTOR_COLUMN, build_batch, memory_schema, rows_from_arrow, schema_dim,
                      sql_id_list, sql_string, timestamps_us, vectors_from_arrow)
from ._wal import (HEADER_SIZE, Deleted, Header, LogFollower, Note, Rows, WriteAheadLog, decode_record, encode_delete,
                   encode_note, encode_rows, lock_held)

T = TypeVar("T")

_COMMIT_RETRIES = 5
# Rows fetched per ANN candidate list before exact re-ranking (LanceDB refine_factor).
_ANN_REFINE_FACTOR = 10
_ANN_NPROBES = 20
INDEX_MODES = ("auto", "exact", "lancedb")
FAISS_FOLDER = "faiss_index"
logger = logging.getLogger(__name__)
# A filtered search over at most this many rows is answered exactly (a gather of their vectors) instead of by FAISS.
_EXACT_SUBSET_MAX = 4096
_RRF_DEPTH = 100  # rows taken from each ranking before reciprocal-rank fusion
# Weight of the BM25 ranking against the vector ranking in reciprocal-rank fusion (see the
# LoCoMo figures in benchmarks/locomo_recall.py: short chat turns favour keywords).
HYBRID_BM25_WEIGHT = 1.0
WAL_FOLDER = "_wal"
_LANCE_METADATA_CACHE_BYTES = 4 << 20
# LanceDB's index cache (6 GiB by default) keeps one entry per table version a connection works on (the version's index
# list; ~0.2 KB of native heap each, measured), never evicted below its cap: a long-lived writer on a busy shared store
# grows without end (the 8-process soak makes ~25 versions/s: up to ~20 MB an hour). Capping that cache would evict
# real indices of big tables (BTREE on id, IVF_PQ) long before it bounded those entries, so background maintenance
# opens a new connection (a fresh session: both caches empty) once the table is this many versions past the one the
# connection was opened at.
_LANCE_RECONNECT_VERSIONS = 5_000
# Adds of more rows than this bypass the log (after flushing it): one LanceDB commit is cheap per row for a batch.
_WAL_MAX_ROWS = 1024
# With the log on and the mirror loaded, a read asks LanceDB for the table's latest version at most this often.
# Every row change of a process that logs reaches the mirror through the log (logged rows and deletes, or a
# "changed" note of a write that bypassed it), so the version only moves the mirror's bookkeeping forward; the
# ask itself is a round trip into LanceDB's event-loop thread and a listing of _versions (~1 ms, longer on a
# busy machine). The 8-process soak (benchmarks/soak.py) made it three to four times per write, inside the
# store's cross-process write lock, and once per search: ~18 % of every worker's samples (py-spy).
_VERSION_CHECK_S = 0.1


def _lancedb():
    # Imported on first use so that LANCE_CPU_THREADS set by the caller takes effect before LanceDB's runtime starts.
    import lancedb
    return lancedb


def _is_conflict(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "conflict" in text or "retryable" in text


def _is_vanished_version(exc: BaseException) -> bool:
    """A read that listed or opened a table version which another process's cleanup deleted meanwhile."""
    text = str(exc)
    return "Not found" in text and ".manifest" in text


def _retry(fn: Callable[[], T], transient: Callable[[BaseException], bool], pause_s: float) -> T:
    """fn(), again (up to _COMMIT_RETRIES times in all, pausing a little longer each time) while it fails in a way
    `transient` says another process caused; the last failure, or any other, is raised as it came."""
    for attempt in range(_COMMIT_RETRIES):
        try:
            return fn()
        except TieredRecallError:
            raise
        except Exception as exc:
            if attempt + 1 < _COMMIT_RETRIES and transient(exc):
                time.sleep(pause_s * (attempt + 1))
                continue
            raise
    raise AssertionError("unreachable")


def _looks_like_bad_filter(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(word in text for word in ("sql", "parse", "no field", "not found in schema", "schema error",
                                         "invalid user input", "column", "expected", "unsupported"))


def _storage_message(what: str, path: str, exc: BaseException) -> str:
    """The failure, led by the fix where the cause is known (nothing of the failed write was kept)."""
    detail = f"failed to {what} at {path}: {type(exc).__name__}: {exc}"
    lowered = str(exc).lower()
    if "no space left" in lowered or "os error 28" in lowered:
        return f"cold tier: the disk is full: free space or move the store (nothing of this write was kept); {detail}"
    if "permission denied" in lowered or "os error 13" in lowered:
        return f"cold tier: this user cannot write the store: fix the folder's owner or permissions; {detail}"
    return f"cold tier: {detail}"


def _keyword_texts(roles: list, texts: list) -> list[str]:
    """What BM25 indexes: the speaker (role) with the text, since questions name who said things."""
    return [text if not role else f"{role} {text}" for role, text in zip(roles, texts)]


class ColdStore:
    """Durable memory rows (LanceDB table "memories" under `path`) with exact cosine search.

    Vectors are unit-norm float32 (n, dim); scores are inner products. Writes commit before returning.
    Small and medium tables are searched exactly through an in-memory mirror kept in step with every
    write and re-synced when another process moves the table; past `mirror_max_bytes` searches go to
    LanceDB (an IVF_PQ index once the table has `ann_index_min_rows` rows, candidates re-ranked exactly).

    Keyword options beyond the coordinator's contract (defaults suit it):
      compact_every_writes / compact_every_s: background compaction after this many writes (more for big tables,
          see _writes_per_compaction) or on a timer tick; cleanup_grace_s: background cleanup keeps versions
          younger than this for readers in other processes (optimize() keeps none);
      mirror_max_bytes: memory budget of the exact-search mirror; scalar_index_min_rows / ann_index_min_rows:
          table sizes at which BTREE(id) + BITMAP(namespace) and the IVF_PQ vector index are built;
      background: False runs no maintenance thread (compaction then only through optimize()).
      index: "auto" (default) searches the mirror exactly below `faiss_min_rows` live rows and through a FAISS
          IVF-Flat index (probe count tuned for recall@10 >= `target_recall`, built in the background, kept in step
          with every write, saved beside the table under faiss_index/ and reconciled against the rows on open)
          above. When the tuned IVF index cannot reach `target_recall` within its probe budget (a quarter of the
          lists), or would be no faster than exact search at the probes it needs, the store keeps exact search,
          logs a warning and reports why in stats()["faiss_choice"]; the choice is re-made when the store has
          grown 4x; "exact" never uses an ANN index; "lancedb" sends searches to LanceDB and its own IVF_PQ index.
      Every score returned is the exact inner product of the stored vector.
      wal: True (default) makes small adds durable in a write-ahead log under _wal/ (fdatasync, well under a
          millisecond) instead of a LanceDB commit each; a background flusher moves logged rows into LanceDB in
          batches (upsert by id, so replay is idempotent) once `wal_flush_rows` are pending or every `wal_flush_s`.
          Deletes are logged too (while the mirror is loaded), so they reach every process through the log instead of
          a LanceDB commit each; a flush commits the last operation of each id. Rows in the log are searched,
          counted and returned like any other (every process follows the log; get() answers logged rows and deletes
          from it); reads that LanceDB serves (where filters, LanceDB search paths, stats) flush the log first. On
          open the log is replayed; close() flushes it. False commits every add and delete to LanceDB before
          returning.
    """

    def __init__(self, path: str | os.PathLike, *, dim: int, read_consistency_interval_s: float = 0.0,
                 lance_threads: int | None = None, compact_every_writes: int = 32, compact_every_s: float = 10.0,
                 cleanup_grace_s: float = 10.0, mirror_max_bytes: int = 2 << 30,
                 scalar_index_min_rows: int = 50_000, ann_index_min_rows: int = 250_000,
                 background: bool = True, index: str = "auto", faiss_min_rows: int = 20_000,
                 target_recall: float = TARGET_RECALL, wal: bool = True, wal_flush_rows: int = 512,
                 wal_flush_s: float = 0.5, read_only: bool = False):
        self._dim = check.check_dim(dim)
        if not isinstance(read_only, bool):
            raise InvalidInput(f"read_only must be True or False, got {read_only!r}")
        self._read_only = read_only
        if index not in INDEX_MODES:
            raise InvalidInput(f"index must be one of {INDEX_MODES} (\"auto\" picks exact or FAISS by size), got {index!r}")
        if isinstance(faiss_min_rows, bool) or not isinstance(faiss_min_rows, int) or faiss_min_rows < 1:
            raise InvalidInput(f"faiss_min_rows must be a positive int, got {faiss_min_rows!r}")
        if not isinstance(target_recall, (int, float)) or not 0 < target_recall <= 1:
            raise InvalidInput(f"target_recall must be in (0, 1], got {target_recall!r}")
        self._index_mode = index
        self._faiss_min_rows = faiss_min_rows
        self._target_recall = float(target_recall)
        self._ann: IvfAnn | None = None
        self._ann_source = "none"
        self._ann_thread: threading.Thread | None = None
        self._ann_builds = 0
        self._ann_last_build_s: float | None = None
        self._ann_last_reconcile: dict | None = None
        self._ann_error: str | None = None
        self._ann_choice: dict | None = None  # the last build's (or the saved) choice: method, why, tuned recall
        self._ann_save_lock = threading.Lock()
        self._bm25: Bm25Index | None = None
        self._opening = True  # no background build before the saved index had its chance
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise InvalidInput(f"path must be a folder path (str or os.PathLike), got {path!r}")
        if not isinstance(read_consistency_interval_s, (int, float)) or read_consistency_interval_s < 0:
            raise InvalidInput(f"read_consistency_interval_s must be a number >= 0 (0 = see other writers at once), got {read_consistency_interval_s!r}")
        if lance_threads is not None:
            if isinstance(lance_threads, bool) or not isinstance(lance_threads, int) or lance_threads <= 0:
                raise InvalidInput(f"lance_threads must be a positive int or None, got {lance_threads!r}")
            # LanceDB reads this once when its runtime starts; set it before the first connect in the process.
            os.environ["LANCE_CPU_THREADS"] = str(lance_threads)
        if cleanup_grace_s <= 0:
            raise InvalidInput("cleanup_grace_s must be > 0 for background cleanup (readers in other processes may hold old versions); use optimize() for a full cleanup")
        self._path = os.path.abspath(os.fspath(path))
        self._cleanup_grace = timedelta(seconds=float(cleanup_grace_s))
        self._mirror_max_bytes = int(mirror_max_bytes)
        self._scalar_index_min_rows = int(scalar_index_min_rows)
        self._ann_index_min_rows = int(ann_index_min_rows)
        if isinstance(compact_every_writes, bool) or not isinstance(compact_every_writes, int) or compact_every_writes <= 0:
            raise InvalidInput(f"compact_every_writes must be a positive int, got {compact_every_writes!r}")
        self._compact_every_writes = compact_every_writes
        self._row_estimate = 0
        self._lock = threading.RLock()
        self._closed = False
        self._mirror: VectorMirror | None = None
        self._mirror_version = -1
        self._last_compaction_at: float | None = None
        self._compactions = 0
        self._maintenance_errors = 0
        self._last_maintenance_error: str | None = None
        self._maintenance: MaintenanceThread | None = None
        if not isinstance(wal, bool):
            raise InvalidInput(f"wal must be True or False, got {wal!r}")
        if isinstance(wal_flush_rows, bool) or not isinstance(wal_flush_rows, int) or wal_flush_rows <= 0:
            raise InvalidInput(f"wal_flush_rows must be a positive int, got {wal_flush_rows!r}")
        if not isinstance(wal_flush_s, (int, float)) or not wal_flush_s > 0:
            raise InvalidInput(f"wal_flush_s must be a number > 0 (seconds between background flushes), got {wal_flush_s!r}")
        self._wal: WriteAheadLog | None = None
        self._follower: LogFollower | None = None
        self._wal_flush_rows = wal_flush_rows
        self._wal_flush_s = float(wal_flush_s)
        self._wal_unflushed = 0  # operations this process logged that no flush has consumed yet (wakes the flusher)
        # The newest logged operation of each id not yet flushed, as this process followed the log: id -> (gen, offset,
        # Rows or None for a delete, row index). get() answers from it without forcing a flush.
        self._unflushed: dict[int, tuple] = {}
        # Table versions past the mirror's whose effect the mirror already holds: a flush of logged records (known from
        # the log's rotation) or a compaction / index build (a "benign" note in the log, or list_versions(), which is
        # O(versions kept), ~30-50 ms at a few hundred: taken once per version, never again). Versions never change.
        self._known: set[int] = set()
        self._version_settled_at = -math.inf  # when a read last found the mirror at the table's latest version
        self._maintenance_probe_fd: int | None = None  # for _writer_active()
        self._wal_flushes = 0
        self._wal_flushed_rows = 0
        self._wal_last_flush_s: float | None = None
        self._wal_errors = 0
        self._wal_last_error: str | None = None
        self._flush_table = None
        self._flusher: threading.Thread | None = None
        self._flusher_wake = threading.Event()
        self._flusher_stop = threading.Event()

        if read_only:
            if not os.path.isdir(self._path):
                raise InvalidInput(f"no cold store at {self._path}: a read-only store must exist (open it writable "
                                   "once to create it)")
            background = False  # no compaction, flush or index file: nothing is written
        else:
            try:
                os.makedirs(self._path, mode=0o700, exist_ok=True)
            except OSError as exc:
                raise StorageError(f"cannot create the cold-tier folder {self._path}: {exc}") from exc
        wal_folder = os.path.join(self._path, WAL_FOLDER)
        if wal and (not read_only or os.path.isdir(wal_folder)):
            self._wal = self._guard("open the write-ahead log", lambda: WriteAheadLog(wal_folder, read_only=read_only))
            self._follower = LogFollower(self._wal)
            probe = os.path.join(self._path, MAINTENANCE_LOCK_NAME)
            if not read_only or os.path.exists(probe):
                self._maintenance_probe_fd = os.open(probe, os.O_RDONLY if read_only else os.O_RDWR | os.O_CREAT, 0o600)
        # Every write bumps these before it is acknowledged; the coordinator certifies the hot tier against them.
        self._generations: WriteGenerations | None = self._guard(
            "open the write generations", lambda: open_generations(self._path, read_only=read_only))
        self._read_interval = timedelta(seconds=float(read_consistency_interval_s))
        self._lagging_reads = read_consistency_interval_s > 0
        self._reconnects = 0
        self._db = self._connect()
        self._table = self._open_or_create()
        self._connected_at_version = self._table.version
        self._schema = self._table.schema  # fetched once: each .schema call is a round trip into LanceDB
        self._maintenance_table = None
        with self._lock:
            self._reload_mirror_locked()
            self._opening = False
            self._open_ann_locked()
        if background:
            self._maintenance = MaintenanceThread(self._maintain, writes_due=self._writes_per_compaction,
                                                  every_s=compact_every_s, name=f"cold-maintenance:{self._path}")
        if self._wal is not None and not read_only:
            # Replay: rows a process logged but did not flush (it died, or is still running) go into LanceDB now
            # (a failure, e.g. a full disk, leaves them in the log, served from there, and is retried later).
            self._flush_for_read()
            self._flusher = threading.Thread(target=self._flusher_run, name=f"cold-wal-flusher:{self._path}", daemon=True)
            self._flusher.start()

    # ---- life cycle ----------------------------------------------------------------------------
    @property
    def dim(self) -> int:
        return self._dim

    @property
    def path(self) -> str:
        return self._path

    @property
    def read_only(self) -> bool:
        return self._read_only

    @property
    def generations(self) -> WriteGenerations | None:
        """The store's write generations (None for a read-only store no writer of this version has opened)."""
        return self._generations

    def _check_writable(self) -> None:
        if self._read_only:
            raise ReadOnlyStore(f"the cold store at {self._path} is open read-only: open it without read_only=True, "
                                "from a user and file system that can write the folder, to add or delete")

    def close(self) -> None:
        if self._closed:
            return
        if self._flusher is not None:
            self._flusher_stop.set()
            self._flusher_wake.set()
            self._flusher.join(60)
        if self._wal is not None and not self._read_only:
            try:
                self._flush_now()  # LanceDB holds every row again; on failure the rows stay in the log (replayed on open)
            except Exception as exc:
                self._wal_errors += 1
                self._wal_last_error = f"flush at close: {type(exc).__name__}: {exc}"
        if self._maintenance is not None:
            self._maintenance.stop()
        thread = self._ann_thread
        if thread is not None:
            thread.join()  # a build in flight finishes (it cannot be interrupted inside FAISS) and is then dropped
        try:
            self._save_ann(force=True)
        except Exception:
            pass  # the index is a cache: the next open rebuilds or repairs it
        self._closed = True
        with self._lock:
            self._ann = None
            self._bm25 = None
            self._mirror = None
            self._table = None
            self._maintenance_table = None
            self._flush_table = None
            self._db = None
            if self._follower is not None:
                self._follower.close()
            if self._wal is not None:
                self._wal.close()
            if self._maintenance_probe_fd is not None:
                os.close(self._maintenance_probe_fd)
                self._maintenance_probe_fd = None
            if self._generations is not None:
                self._generations.close()

    def __enter__(self) -> "ColdStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _connect(self):
        # LanceDB caches metadata for every table version a process sees, up to 1 GiB by default: with
        # other processes committing all day, a long-lived reader grew ~13 MB per 1,000 operations
        # (benchmarks/soak.py). Our mirror answers reads, so a small cache loses nothing: at 4 MiB it is
        # full after ~1,000 soak operations and RSS levels off; at 64 MiB it held ~80 MB before it did.
        session = _lancedb().Session(metadata_cache_size_bytes=_LANCE_METADATA_CACHE_BYTES)
        return self._guard("connect to LanceDB", lambda: _lancedb().connect(
            self._path, read_consistency_interval=self._read_interval, session=session))

    def _maybe_reconnect(self, latest: int) -> None:
        """Under the maintenance lock (so no optimize() uses the table meanwhile): a new connection, with empty
        caches, once the table has moved _LANCE_RECONNECT_VERSIONS versions past the current connection's start
        (see that constant). No flush or direct write commits meanwhile (the flush lock) and no read or write uses
        the table (the store's lock); the old connection's caches go with its last handle."""
        if latest - self._connected_at_version < _LANCE_RECONNECT_VERSIONS:
            return
        with self._no_row_commits(), self._lock:
            if self._closed:
                return
            db = self._connect()
            table = self._guard("open the table", lambda: db.open_table(TABLE_NAME))
            self._db, self._table = db, table
            self._flush_table = None
            self._maintenance_table = None
            self._connected_at_version = table.version
            self._reconnects += 1

    def _guard(self, what: str, fn: Callable[[], T]) -> T:
        """Run a LanceDB/OS call; failures become StorageError saying what was being done."""
        try:
            return fn()
        except TieredRecallError:
            raise
        except Exception as exc:  # LanceDB raises OSError, RuntimeError, ValueError, ... for storage failures
            raise StorageError(_storage_message(what, self._path, exc)) from exc

    def _commit(self, what: str, fn: Callable[[], T]) -> T:
        """A write that may race with compaction or another process: retry on commit conflicts (writes are idempotent)."""
        return self._guard(what, lambda: _retry(fn, _is_conflict, 0.01))

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"cold store at {self._path} is closed; open a new ColdStore")

    def _open_or_create(self):
        def open_or_create():
            try:
                return self._db.open_table(TABLE_NAME)
            except (FileNotFoundError, ValueError):
                if self._read_only:
                    raise InvalidInput(f"no memories table in {self._path}: a read-only store must exist (open it "
                                       "writable once to create it)") from None
                # exist_ok covers a concurrent creator; the dim check below catches a mismatch either way.
                return self._db.create_table(TABLE_NAME, schema=memory_schema(self._dim), exist_ok=True)
        table = self._guard("open or create the table", open_or_create)
        found = schema_dim(table.schema)
        if found != self._dim:
            raise InvalidInput(
                f"the cold store at {self._path} holds vectors of dim {found}, but dim={self._dim} was requested; "
                f"open it with dim={found} or use another folder")
        return table

    # ---- mirror upkeep -------------------------------------------------------------------------
    def _reload_mirror_locked(self) -> None:
        """Rebuild the mirror from one pinned table version (so the copy is a consistent snapshot), then apply the
        logged rows that version does not hold yet."""
        for _ in range(5):
            self._load_table_locked()
            self._unflushed.clear()  # refilled by the attach below, from the generation the loaded version may lack
            if self._wal is None or self._attach_log_locked():
                return
        raise StorageError(f"cold tier: could not line up the write-ahead log of {self._path} with the table "
                           f"(log generations deleted while loading); reopen the store")

    def _load_table_locked(self) -> None:
        def load():
            reader = self._db.open_table(TABLE_NAME)
            version = reader.version
            reader.checkout(version)
            rows = reader.count_rows()
            if rows * (self._dim * 4 + 24) > self._mirror_max_bytes:
                return version, None, rows
            data = reader.search().select(["id", "namespace", "created_at", VECTOR_COLUMN]).limit(None).to_arrow()
            return version, data, rows
        version, data, rows = self._guard("load the search mirror", load)
        old = self._mirror
        self._mirror_version = version
        self._row_estimate = rows
        self._bm25 = None  # rebuilt from the table on the next hybrid search
        if data is None:
            self._mirror = None
            self._ann = None
            return
        mirror = VectorMirror(self._dim, capacity=max(1024, data.num_rows + data.num_rows // 4))
        if data.num_rows:
            mirror.upsert(np.asarray(data.column("id").to_numpy(), dtype=np.int64),
                          vectors_from_arrow(data.column(VECTOR_COLUMN), self._dim),
                          data.column("namespace").to_pylist(), timestamps_us(data.column("created_at")))
        self._mirror = mirror
        if self._ann is not None and old is not None:
            # Another process moved rows: keep the index, relabelled to the new positions and repaired.
            ann, self._ann = self._ann, None
            try:
                self._ann_last_reconcile = ann.reconcile(old.label_ids(), mirror)
                mirror.listener = ann
                self._ann = ann
            except Exception as exc:
                self._ann_error = f"reconcile after reload: {type(exc).__name__}: {exc}"
        self._maybe_schedule_ann_locked()

    # ---- the write-ahead log, reader side ----------------------------------------------------------
    def _attach_log_locked(self) -> bool:
        """After loading table version V: follow the log from the newest generation whose rows V may lack (the
        newest whose base_version <= V; see _wal.py for why that view is consistent). False: generations were
        deleted meanwhile, load again."""
        from ._wal import read_header
        wal, follower = self._wal, self._follower
        for gen in reversed(wal.generations()):
            try:
                fd = wal.open_gen(gen)
            except FileNotFoundError:
                return False
            try:
                base = read_header(fd).base_version
            finally:
                os.close(fd)
            if base <= self._mirror_version:
                try:
                    follower.start_at(gen)
                except FileNotFoundError:
                    return False
                return self._apply_log_events_locked(follower.poll())
        return False

    def _follow_log_locked(self) -> None:
        """Apply what was logged since the last look (this process's adds included); reload when the log cannot be
        lined up with the mirror's table version."""
        if self._wal is None or self._follower is None:
            return
        events = self._guard("read the write-ahead log", self._follower.poll)
        if events and not self._apply_log_events_locked(events):
            self._reload_mirror_locked()

    def _apply_log_events_locked(self, events: list) -> bool:
        for kind, item in events:
            if kind == "rows":
                self._apply_logged_rows_locked(item)
            elif kind == "deleted":
                self._apply_logged_delete_locked(item)
            elif kind == "note":
                if item.kind == "changed":
                    if int(item.versions.max()) > self._mirror_version:
                        return False  # a write that bypassed the log changed rows this mirror lacks: reload
                else:  # "benign"
                    self._known.update(int(v) for v in item.versions.tolist() if v > self._mirror_version)
                    self._advance_locked()
            elif kind == "rotated":
                self._drop_flushed_locked(item)
                # The previous generation's records (all applied above) were committed on top of pre_version, giving
                # base_version; versions in between are that flush's commits and compactions (see _wal.py). If the
                # mirror reflects pre_version, it now reflects base_version; otherwise _sync_locked() settles the
                # versions before pre_version (a note may still come, or list_versions(), or a reload).
                if item.base_version > self._mirror_version:
                    self._known.update(range(max(item.pre_version, self._mirror_version) + 1, item.base_version + 1))
                    self._advance_locked()
            else:  # "gap"
                return False
        return True

    def _advance_locked(self) -> None:
        """Move the mirror's version over the versions whose effect it already holds."""
        known, v = self._known, self._mirror_version
        while v + 1 in known:
            v += 1
        self._mirror_version = v
        if len(known) > 1024:
            known.difference_update([k for k in known if k <= v])

    def _apply_logged_rows_locked(self, rows: Rows) -> None:
        m = self._mirror
        if m is not None:
            m.upsert(rows.ids, rows.vectors, rows.namespaces, rows.created_at_us)
            self._row_estimate = m.live_rows
            if m.nbytes() > self._mirror_max_bytes:
                self._mirror = None  # past the budget: LanceDB (and its ANN index) serves searches
                self._ann = None
            else:
                self._maybe_schedule_ann_locked()
        else:
            self._row_estimate += int(rows.ids.shape[0])
        if self._bm25 is not None:
            self._bm25.upsert(rows.ids.tolist(), rows.namespaces, _keyword_texts(rows.roles, rows.texts))
        for j, row_id in enumerate(rows.ids.tolist()):
            self._unflushed[row_id] = (rows.gen, rows.offset, rows, j)

    def _apply_logged_delete_locked(self, deleted: Deleted) -> None:
        m = self._mirror
        if m is not None:
            m.remove(deleted.ids)
            self._row_estimate = m.live_rows
        else:
            self._row_estimate = max(0, self._row_estimate - int(deleted.ids.shape[0]))
        if self._bm25 is not None:
            self._bm25.remove(deleted.ids.tolist())
        for row_id in deleted.ids.tolist():
            self._unflushed[row_id] = (deleted.gen, deleted.offset, None, -1)

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

    def _benign_versions(self, start: int, end: int) -> bool:
        """True if the mirror holds the effect of every version in (start, end]: known already (flushed from the log,
        or a compaction's note), or kept the rows as they were (compaction, index builds).

        The latter is judged from each version's summary against its predecessor (_same_rows), by list_versions(),
        once per version (verdicts are kept in self._known). Unknown versions (cleaned up) count as changes.
        """
        if end <= start:
            return True
        known = self._known
        if all(v in known for v in range(start + 1, end + 1)):
            return True
        try:
            summaries = {v["version"]: v.get("metadata") or {} for v in self._table.list_versions()}
        except Exception:
            return False
        verdict = True
        for v in range(start + 1, max(summaries, default=end) + 1):
            before, after = summaries.get(v - 1), summaries.get(v)
            if before and after and _same_rows(before, after):
                known.add(v)
            elif v <= end and v not in known:
                verdict = False
        return verdict

    def _sync_locked(self, *, defer: bool = True) -> bool:
        """Bring the mirror to the table's latest version before a read (another process may have written).

        Versions the log does not explain yet, seen while another writer is at work (a flush between its commit and
        its rotation, a compaction before its note), are left for a later sync (defer): every acknowledged change is
        in the log already (rows, deletes, or a "changed" note of a write that bypassed it), so the mirror is
        complete; only its version lags. Once no writer is at work, unexplained versions are checked (list_versions)
        and, if they changed rows, the mirror is reloaded. Returns False when it deferred."""
        self._follow_log_locked()
        logged = self._mirror is not None and self._wal is not None and not self._lagging_reads
        if defer and logged and time.monotonic() - self._version_settled_at < _VERSION_CHECK_S:
            return True  # settled a moment ago, and every row change since came through the log (above)
        latest = self._guard("read the table version", lambda: self._table.version)
        if latest <= self._mirror_version:
            # Equal: nothing moved. Lower: with read_consistency_interval_s > 0 this handle may lag behind the
            # snapshot the mirror was loaded from; the mirror is already the newer view.
            self._version_settled_at = time.monotonic()
            return True
        if self._mirror is not None and self._wal is not None and not self._lagging_reads:
            if defer and self._writer_active():
                return False
            self._follow_log_locked()  # a rotation or note written just before that writer let go
            if latest <= self._mirror_version:
                return True
        if self._mirror is not None and latest > self._mirror_version and self._benign_versions(self._mirror_version, latest):
            self._mirror_version = latest
            self._advance_locked()
            self._version_settled_at = time.monotonic()
            return True
        self._reload_mirror_locked()
        self._version_settled_at = time.monotonic()
        return True

    def _writer_active(self) -> bool:
        """A flush, a write that bypasses the log, or maintenance (compaction, index builds) is running now."""
        probe = self._maintenance_probe_fd
        return self._wal.flush_in_progress() or (probe is not None and lock_held(probe))

    def _after_own_write_locked(self, new_version: int, apply: Callable[[VectorMirror], None]) -> None:
        if self._mirror is None:
            if self._table.count_rows() * (self._dim * 4 + 24) <= self._mirror_max_bytes // 2:
                self._reload_mirror_locked()  # shrank well below the budget: exact in-memory search again
            else:
                self._mirror_version = new_version
            return
        if new_version == self._mirror_version:
            return
        if new_version == self._mirror_version + 1 or self._benign_versions(self._mirror_version, new_version - 1):
            apply(self._mirror)
            self._mirror_version = new_version
            if self._mirror.nbytes() > self._mirror_max_bytes:
                self._mirror = None  # past the budget: LanceDB (and its ANN index) serves searches
                self._ann = None
            else:
                self._maybe_schedule_ann_locked()
        else:
            self._reload_mirror_locked()  # someone else changed rows in between: start from the truth

    def _writes_per_compaction(self) -> int:
        """Writes between background compactions.

        LanceDB's optimize() takes no compaction options, and it rewrites every fragment under 1M rows together
        with the new small ones: compacting a 100k-row table rewrites all of it. So the interval grows with the
        table (about one compaction per 1000 rows held, at most every 1000 writes), which bounds the rows rewritten
        per write (~1000) and the fragment count (compact_every_writes .. 1000 + the writes during one compaction).
        """
        return max(self._compact_every_writes, min(self._row_estimate // 1000, 1000))

    # ---- writes --------------------------------------------------------------------------------
    def add(self, *, ids, vectors, namespaces, texts, sessions, roles, created_at_us, metadata) -> Bump | None:
        """Upsert rows by id; durable when this returns (in the write-ahead log or committed to LanceDB); the whole
        batch or nothing. Returns what the write did to the write generations (bumped before it was durable).

        ids: (n,) int64; vectors: (n, dim) float32 unit-norm; namespaces/texts: n str; sessions/roles: n str|None;
        created_at_us: (n,) int64 microseconds since the epoch (UTC); metadata: n dict|None (JSON-serialisable).
        """
        self._check_open()
        self._check_writable()
        ids = check.check_ids(ids)
        n = ids.shape[0]
        check.check_unique(ids)
        vectors = check.check_vectors(vectors, n, self._dim)
        namespaces = check.check_namespaces(namespaces, n)
        texts = check.check_strings(texts, n, "texts", nullable=False)
        sessions = check.check_strings(sessions, n, "sessions", nullable=True)
        roles = check.check_strings(roles, n, "roles", nullable=True)
        created = check.check_timestamps(created_at_us, n)
        metadata_json = check.check_metadata(metadata, n)
        if self._wal is not None and n <= _WAL_MAX_ROWS:
            return self._add_logged(Rows(ids, vectors, created, namespaces, sessions, roles, texts, metadata_json))
        batch = build_batch(self._schema, ids=ids, vectors=vectors, namespaces=namespaces, texts=texts,
                            sessions=sessions, roles=roles, created_at_us=created, metadata_json=metadata_json)
        with self._direct_write():  # runs while the log is empty (see _wal.py)
            return self._add_committed(ids, vectors, namespaces, texts, roles, created, batch)

    def _bump_locked(self, ids: np.ndarray, namespaces: list[str] | None) -> Bump | None:
        """Counts a write of rows `ids` (into `namespaces`; None for a delete) in the write generations before it is
        acknowledged. It touches the namespaces it writes into and those the ids are in now, which only the mirror
        knows cheaply: without one the write counts as unplaced. Called under the lock that orders this write after
        every earlier one (the log's append lock, or a direct write's), with the mirror in step with them."""
        gens = self._generations
        if gens is None:
            return None
        if self._mirror is None:
            return gens.bump(None)
        return gens.bump(set(namespaces or ()) | self._mirror.namespaces_of(ids))

    def _add_committed(self, ids, vectors, namespaces, texts, roles, created, batch) -> Bump | None:
        n = ids.shape[0]

        def upsert():
            return (self._table.merge_insert("id").when_matched_update_all()
                    .when_not_matched_insert_all().execute(batch))

        with self._lock:
            self._check_open()
            self._sync_locked(defer=False)  # the flush lock is ours: no other writer to wait for
            bump = self._bump_locked(ids, namespaces)
            expected = self._mirror_version + 1
            if self._mirror is not None and self._mirror.positions(ids).size == 0:
                # All ids are new as of the latest version: a plain append skips merge_insert's join (~2x faster).
                result = self._commit(f"add {n} rows", lambda: self._table.add(batch))
                id_filter = f"id IN {sql_id_list(ids)}"
                if (result.version != expected
                        and self._guard("check for duplicate ids", lambda: self._table.count_rows(id_filter)) != n):
                    # Another process committed the same ids meanwhile: keep one row per id, this batch's.
                    self._commit("remove duplicate ids", lambda: self._table.delete(id_filter))
                    result = self._commit(f"add {n} rows", upsert)
            else:
                result = self._commit(f"add {n} rows", upsert)
            self._after_own_write_locked(result.version, lambda m: m.upsert(ids, vectors, namespaces, created))
            self._row_estimate = self._row_estimate + n if self._mirror is None else self._mirror.live_rows
            if self._bm25 is not None:
                self._bm25.upsert(ids.tolist(), namespaces, _keyword_texts(roles, texts))
            self._announce_locked(encode_note("changed", [result.version]), f"log the add of {n} rows")
        if self._maintenance is not None:
            self._maintenance.note_writes()
        return bump

    # ---- the write-ahead log, writer side ----------------------------------------------------------
    @contextmanager
    def _direct_write(self) -> Iterator[None]:
        """For a write that bypasses the log (delete, large add): both log locks, and the log flushed and empty
        (see _wal.py). Lock order: flush lock, append lock, then self._lock."""
        if self._wal is None:
            yield
            return
        with self._wal.flushing():
            self._flush_locked()  # the bulk of the log, appends going on meanwhile
            with self._wal.locked():
                self._flush_locked(appends_held=True)  # what was appended during that flush; the log is now empty
                yield

    def _announce_locked(self, record: bytes, what: str) -> None:
        """After a write that bypassed the log (under _direct_write, so the append lock is ours): tell the other
        processes through the log before the write is acknowledged (a repeated delete, or a "changed" note), so none
        of them leaves it out of its mirror while it waits for another writer (see _sync_locked)."""
        if self._wal is None:
            return
        try:
            self._wal.append(record)
        except Exception as exc:
            raise StorageError(_storage_message(what, self._path, exc)) from exc
        self._follow_log_locked()

    def _add_logged(self, rows: Rows) -> Bump | None:
        record = encode_rows(rows)
        with self._wal.locked():
            self._check_open()
            with self._lock:
                self._follow_log_locked()  # every earlier logged write in the mirror: the ids' namespaces are known
                bump = self._bump_locked(rows.ids, rows.namespaces)
            try:
                self._wal.append(record)  # durable here (fdatasync)
            except Exception as exc:
                raise StorageError(_storage_message(f"log {rows.ids.shape[0]} rows", self._path, exc)) from exc
            with self._lock:
                self._follow_log_locked()  # applies this record (and any other process's before it) to the mirror
            self._wal_unflushed += int(rows.ids.shape[0])
        if self._wal_unflushed >= self._wal_flush_rows:
            self._flusher_wake.set()
        return bump

    def _flush_locked(self, *, appends_held: bool = False) -> int:
        """Under the flush lock: commit the last logged operation of each id to LanceDB (delete, or upsert of its
        newest logged row), then start a new log generation. Appends go on during the commit (their records are
        carried into the new generation) unless the caller holds the append lock (`appends_held`: the log is then
        empty after). Returns the rows flushed (upserted or deleted)."""
        if self._wal is None:
            return 0
        with self._wal.locked():
            gen, records, end = self._guard("read the write-ahead log", self._wal.pending)
            # Every operation this process counted so far is in `records` (both are read under the append lock),
            # so this flush consumes exactly that many of them. Counting down by the ids committed instead let the
            # count drift up whenever an id had several operations in one generation (add then delete: two logged,
            # one committed), until every single write woke the flusher: one LanceDB commit per write.
            consumed = self._wal_unflushed
            if not records:  # another process's flush took them
                self._wal_unflushed = 0
        if not records:
            return 0
        t0 = time.perf_counter()
        parts = [r for _, p in records if not isinstance(r := decode_record(p), Note)]  # notes change no rows
        rows = [r for r in parts if isinstance(r, Rows)]
        # Every logged operation in log order; the last one of each id decides (a delete, or its newest row).
        op_ids = np.concatenate([r.ids for r in parts] or [np.empty(0, np.int64)])
        is_delete = np.concatenate([np.full(r.ids.shape[0], isinstance(r, Deleted)) for r in parts] or [np.empty(0, bool)])
        row_at = np.full(op_ids.shape[0], -1, np.int64)
        row_at[~is_delete] = np.arange(int((~is_delete).sum()))
        _, last = np.unique(op_ids[::-1], return_index=True)
        final = np.sort(op_ids.shape[0] - 1 - last)
        delete_ids = np.sort(op_ids[final][is_delete[final]])
        keep = row_at[final][~is_delete[final]]
        batch = None
        if keep.shape[0]:
            ids = np.concatenate([r.ids for r in rows])[keep]
            vectors = np.concatenate([r.vectors for r in rows])[keep]
            created = np.concatenate([r.created_at_us for r in rows])[keep]
            picks = keep.tolist()
            cols = {name: [v for r in rows for v in getattr(r, name)]
                    for name in ("namespaces", "sessions", "roles", "texts", "metadata_json")}
            cols = {name: [values[i] for i in picks] for name, values in cols.items()}
            batch = build_batch(self._schema, ids=ids, vectors=vectors, namespaces=cols["namespaces"],
                                texts=cols["texts"], sessions=cols["sessions"], roles=cols["roles"],
                                created_at_us=created, metadata_json=cols["metadata_json"])
        if self._flush_table is None:
            self._flush_table = self._guard("open the table", lambda: self._db.open_table(TABLE_NAME))
        table = self._flush_table
        pre = self._guard("read the table version", lambda: table.version)
        version = pre
        # Deleted and upserted ids are disjoint, so the order of the two commits does not matter; both are
        # idempotent, so a flusher killed between them (or before the rotation) is simply repeated by the next.
        if delete_ids.shape[0]:
            version = self._commit(f"flush {delete_ids.shape[0]} logged deletes",
                                   lambda: table.delete(f"id IN {sql_id_list(delete_ids)}")).version
        if batch is not None:
            version = self._commit(f"flush {keep.shape[0]} logged rows",
                                   lambda: table.merge_insert("id").when_matched_update_all()
                                   .when_not_matched_insert_all().execute(batch)).version
        with self._wal.locked():
            self._guard("rotate the write-ahead log", lambda: self._wal.rotate(gen, end, pre, version))
            self._wal_unflushed -= consumed  # what was logged during the commit stays counted
        with self._lock:
            if not self._closed:
                if self._lagging_reads:  # this process's reads see its own flush, as they saw its own commits
                    self._guard("refresh the table", self._table.checkout_latest)
                self._follow_log_locked()  # the rotation: the mirror now reflects the flush's table version
        flushed = int(keep.shape[0] + delete_ids.shape[0])
        self._wal_flushes += 1
        self._wal_flushed_rows += flushed
        self._wal_last_flush_s = time.perf_counter() - t0
        if self._maintenance is not None:
            self._maintenance.note_writes()
        return flushed

    def _flush_now(self) -> int:
        if self._wal is None or self._closed:
            return 0
        with self._wal.flushing():
            return self._flush_locked()

    def flush(self) -> int:
        """Move every logged row (of any process) into LanceDB now; returns how many. Background flushes and close()
        do this anyway; bulk loaders and tests call it to see the table itself."""
        self._check_open()
        self._check_writable()
        return self._flush_now()

    @contextmanager
    def _read_locked(self, *, flush: bool) -> Iterator[None]:
        """The store's lock, with the mirror in step with the table and the log. flush: LanceDB serves this read, so
        rows still in the log go into the table first (outside the lock: a flush takes the log's own locks)."""
        if flush:
            self._flush_for_read()
        with self._lock:
            self._check_open()
            self._sync_locked()
            yield

    def _flush_for_read(self) -> bool:
        """Before a read that LanceDB serves: rows still in the log must be in the table. False when the flush failed
        (disk full, ...): the rows stay durable in the log (get() and the mirror answer from there), while where
        filters and LanceDB search paths answer without them until a flush succeeds (stats() reports
        wal_last_error). A read-only store cannot flush: such a read then fails with ReadOnlyStore (stats() says
        so instead), since it would miss the logged rows."""
        if self._wal is None or self._wal.pending_bytes() == 0:
            return True
        if self._read_only:
            raise ReadOnlyStore(
                f"cold tier: {self._wal.pending_bytes()} bytes of writes at {self._path} are still only in its "
                "write-ahead log, which a read-only process cannot move into the table that this read needs (where "
                "filters, hybrid search past the log, stats): open the store writable once (or let its writer close "
                "it), or search without where")
        try:
            self._flush_now()
            return True
        except StorageError as exc:
            self._wal_errors += 1
            self._wal_last_error = str(exc)
            return False

    def _flusher_run(self) -> None:
        backoff = self._wal_flush_s
        while not self._flusher_stop.is_set():
            self._flusher_wake.wait(backoff)
            self._flusher_wake.clear()
            if self._flusher_stop.is_set() or self._closed:
                break
            try:
                if self._wal.pending_bytes() > 0:
                    self._flush_now()
                backoff = self._wal_flush_s
            except Exception as exc:  # the rows stay in the log; stats() reports the failure; retried later
                self._wal_errors += 1
                self._wal_last_error = f"{type(exc).__name__}: {exc}"
                backoff = min(30.0, backoff * 2)

    def delete(self, ids) -> int:
        """Delete rows by id; returns how many existed. Committed when this returns."""
        return self.delete_rows(ids)[0]

    def delete_rows(self, ids) -> tuple[int, Bump | None]:
        """delete(), and what it did to the write generations (None when it deleted nothing, or without them)."""
        self._check_open()
        self._check_writable()
        ids = check.check_ids(ids, allow_empty=True)
        if ids.size == 0:
            return 0, None
        ids = np.unique(ids)
        if self._wal is not None and not self._lagging_reads:
            done = self._delete_logged(ids)
            if done is not None:
                return done
        with self._direct_write():  # logged rows reach LanceDB first, so the delete covers them and none comes back
            return self._delete_committed(ids)

    def _delete_logged(self, ids: np.ndarray) -> tuple[int, Bump | None] | None:
        """Log the delete (durable once fdatasynced; the flusher commits it, ordered after every add logged before
        it). Counts the rows that existed from the mirror, which is exact under the append lock once in step with
        the table and the log. None without a mirror (nothing to count from): the caller commits directly."""
        with self._wal.locked():
            with self._lock:
                self._check_open()
                settled = self._sync_locked()
                if self._mirror is None:
                    return None
                deleted = int(self._mirror.positions(ids).shape[0])
                if deleted == 0:
                    # Nothing to delete in the table or the log: no record. Unless the mirror's version lags (deferred
                    # while another writer works) and a write outside this store's log could hold the ids: commit
                    # directly.
                    return (0, None) if settled else None
                bump = self._bump_locked(ids, None)
            try:
                self._wal.append(encode_delete(ids))  # durable here (fdatasync)
            except Exception as exc:
                raise StorageError(_storage_message(f"log the delete of {ids.size} rows", self._path, exc)) from exc
            with self._lock:
                self._follow_log_locked()  # applies this delete (and any record before it) to the mirror
            self._wal_unflushed += int(ids.shape[0])
        if self._wal_unflushed >= self._wal_flush_rows:
            self._flusher_wake.set()
        return deleted, bump

    def _delete_committed(self, ids: np.ndarray) -> tuple[int, Bump | None]:
        with self._lock:
            self._check_open()
            self._sync_locked(defer=False)  # both log locks are ours: the mirror knows every earlier write
            bump = self._bump_locked(ids, None)
            result = self._commit(f"delete {ids.size} rows", lambda: self._table.delete(f"id IN {sql_id_list(ids)}"))
            deleted = int(result.num_deleted_rows)
            self._after_own_write_locked(result.version, lambda m: m.remove(ids))
            self._row_estimate = max(0, self._row_estimate - deleted)
            if self._bm25 is not None:
                self._bm25.remove(ids.tolist())
            if deleted:
                self._announce_locked(encode_delete(ids), f"log the delete of {ids.size} rows")
        if deleted and self._maintenance is not None:
            self._maintenance.note_writes()
        return deleted, bump

    # ---- reads ---------------------------------------------------------------------------------
    def search(self, vector, *, k: int, namespace: str | None = None, where: str | None = None,
               exclude_ids=None, text: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k rows by inner product with `vector` ((dim,) float32): (ids int64, scores float32), best first.

        Scores are exact inner products of the stored vectors; equal scores are ordered by smaller id. Past
        `faiss_min_rows` the candidates come from the FAISS index (recall@10 tuned to `target_recall`), below it
        the search is exact. `where` is a LanceDB SQL filter over the row columns (e.g. "role = 'user' AND
        session = 's1'"); `exclude_ids` are never returned.

        Hybrid search: with `text` (the query's text), BM25 over the memory texts is fused with the vector
        ranking by reciprocal-rank fusion (1/(60 + rank), the top 100 of each); ids come back in fused order,
        each with its exact cosine score (so the scores are then not sorted).
        """
        self._check_open()
        query = check.check_query(vector, self._dim)
        k = check.check_k(k)
        namespace = check.check_optional_namespace(namespace)
        where = check.check_where(where)
        excluded = None if exclude_ids is None else check.check_ids(exclude_ids, name="exclude_ids", allow_empty=True)
        if text is not None and not isinstance(text, str):
            raise InvalidInput(f"text must be a str (the query text for hybrid BM25 + vector search) or None, got {type(text).__name__}")
        # A BM25 index is built from the table and the log's newest operations (no flush needed), except through a
        # lagging handle, which may not see another process's flush yet.
        lancedb_serves = (where is not None or self._mirror is None or self._index_mode == "lancedb"
                          or (text is not None and self._bm25 is None and self._lagging_reads))
        with self._read_locked(flush=lancedb_serves):
            if text is not None and text.strip():
                return self._hybrid_locked(query, text, k, namespace, where, excluded)
            return self._vector_search_locked(query, k, namespace, where, excluded)

    def text_search(self, text: str, *, k: int, namespace: str | None = None, where: str | None = None,
                    exclude_ids=None) -> tuple[np.ndarray, np.ndarray]:
        """BM25 alone over the memory texts: (ids int64, BM25 scores float32), best first, ties by smaller id;
        rows sharing no term with `text` are not returned."""
        self._check_open()
        if not isinstance(text, str):
            raise InvalidInput(f"text must be a str, got {type(text).__name__}")
        k = check.check_k(k)
        namespace = check.check_optional_namespace(namespace)
        where = check.check_where(where)
        excluded = None if exclude_ids is None else check.check_ids(exclude_ids, name="exclude_ids", allow_empty=True)
        with self._read_locked(flush=where is not None or (self._bm25 is None and self._lagging_reads)):
            only = None if where is None else self._matching_ids(namespace, where)
            return self._bm25_locked().search(text, k, namespace=namespace, only_ids=only, exclude_ids=excluded)

    def _vector_search_locked(self, query: np.ndarray, k: int, namespace: str | None, where: str | None,
                              excluded: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        m = self._mirror
        if m is None or self._index_mode == "lancedb":
            return self._search_lancedb(query, k, namespace, where, excluded)
        ann = self._ann if self._index_mode == "auto" else None
        if where is not None:
            positions = m.positions(self._matching_ids(namespace, where))
            if namespace is not None:
                positions = np.intersect1d(positions, m.namespace_positions(namespace))
            if ann is None or positions.shape[0] <= _EXACT_SUBSET_MAX:
                return m.search_positions(query, positions, k, excluded)
            return self._ann_search(ann, query, k, excluded, positions.shape[0],
                                    positions_bitmap(positions, m.n), lambda: positions)
        if ann is None:
            if namespace is None and self._exact_by_choice():
                return self._flat_search(query, k, excluded)
            return m.search(query, k, namespace=namespace, exclude_ids=excluded)
        if namespace is None:
            return self._ann_search(ann, query, k, excluded, m.live_rows, None, m.live_positions)
        allowed = m.namespace_live(namespace)
        if allowed <= _EXACT_SUBSET_MAX:
            return m.search_positions(query, m.namespace_positions(namespace), k, excluded)
        bitmap = None if allowed == m.live_rows else m.namespace_bitmap(namespace)
        return self._ann_search(ann, query, k, excluded, allowed, bitmap, lambda: m.namespace_positions(namespace))

    def _ann_search(self, ann: IvfAnn, query: np.ndarray, k: int, excluded: np.ndarray | None, allowed: int,
                    bitmap: np.ndarray | None, positions: Callable[[], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """FAISS candidates (the filter applied inside the search, probes scaled up by its selectivity), re-scored
        exactly from the mirror; falls back to exact search when the index yields fewer than k rows."""
        m = self._mirror
        n_excluded = 0 if excluded is None else int(excluded.size)
        nprobe = ann.nprobe
        if bitmap is not None:
            nprobe = min(ann.nlist, int(np.ceil(ann.nprobe * m.live_rows / max(allowed, 1))))
        labels = ann.search(query, k + 8 + n_excluded, nprobe=nprobe, bitmap=bitmap)
        labels = labels[labels < m.n]
        labels = labels[m.alive_at(labels)]
        ids, scores = m.search_positions(query, labels, k, excluded)
        if ids.shape[0] < k and allowed - n_excluded > ids.shape[0]:
            return m.search_positions(query, positions(), k, excluded)
        return ids, scores

    def _exact_by_choice(self) -> bool:
        choice = self._ann_choice
        return (self._index_mode == "auto" and choice is not None and choice.get("method") == "exact"
                and self._mirror is not None and self._mirror.live_rows >= self._faiss_min_rows)

    def _flat_search(self, query: np.ndarray, k: int, excluded: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Exact search past faiss_min_rows when IVF lost (see _ann.choose_method): a FAISS flat scan of the mirror
        on one thread (no BLAS threads fighting over the cores), candidates re-scored and tie-ordered like every
        other path; the numpy scan answers when dead or excluded rows leave fewer than k candidates."""
        m = self._mirror
        n_excluded = 0 if excluded is None else int(excluded.size)
        labels = flat_search(m.all_vectors(), query, k + 8 + n_excluded)
        labels = labels[m.alive_at(labels)]
        ids, scores = m.search_positions(query, labels, k, excluded)
        if ids.shape[0] < k and m.live_rows - n_excluded > ids.shape[0]:
            return m.search(query, k, exclude_ids=excluded)
        return ids, scores

    def _hybrid_locked(self, query: np.ndarray, text: str, k: int, namespace: str | None, where: str | None,
                       excluded: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        depth = max(_RRF_DEPTH, k)
        vec_ids, vec_scores = self._vector_search_locked(query, depth, namespace, where, excluded)
        only = None if where is None else self._matching_ids(namespace, where)
        bm_ids, _ = self._bm25_locked().search(text, depth, namespace=namespace, only_ids=only, exclude_ids=excluded)
        ids, _ = rrf_fuse([vec_ids, bm_ids], k, weights=(1.0, HYBRID_BM25_WEIGHT))
        known = dict(zip(vec_ids.tolist(), vec_scores.tolist()))
        missing = np.array([i for i in ids.tolist() if i not in known], np.int64)
        if missing.size:
            if self._mirror is not None:
                pos = self._mirror.positions_or_minus1(missing)
                exact = self._mirror.vectors_at(pos) @ query
            else:
                exact = np.array([float(r["vector"] @ query) for r in self.get(missing)], np.float32)
            known.update(zip(missing.tolist(), exact.tolist()))
        return ids, np.array([known[i] for i in ids.tolist()], np.float32)

    def _bm25_locked(self) -> Bm25Index:
        if self._bm25 is None:
            data = self._guard("load texts for BM25", lambda: self._table.search()
                               .select(["id", "namespace", "role", "text"]).limit(None).to_arrow())
            bm25 = Bm25Index()
            bm25.upsert(data.column("id").to_pylist(), data.column("namespace").to_pylist(),
                        _keyword_texts(data.column("role").to_pylist(), data.column("text").to_pylist()))
            # Operations logged since the last flush (newer than the table's rows; re-applying a flushed one is
            # harmless): the newest of each id.
            gone = [row_id for row_id, (_, _, rows, _) in self._unflushed.items() if rows is None]
            if gone:
                bm25.remove(gone)
            for row_id, (_, _, rows, j) in self._unflushed.items():
                if rows is not None:
                    bm25.upsert([row_id], [rows.namespaces[j]], _keyword_texts([rows.roles[j]], [rows.texts[j]]))
            self._bm25 = bm25
        return self._bm25

    # ---- FAISS index upkeep --------------------------------------------------------------------
    @property
    def _ann_folder(self) -> str:
        return os.path.join(self._path, FAISS_FOLDER)

    def _ann_wanted_locked(self) -> bool:
        m = self._mirror
        if self._closed or self._opening or self._index_mode != "auto" or m is None or m.live_rows < self._faiss_min_rows:
            return False
        # (Re)train when the store has grown 4x past what the lists were trained for (nlist ~ 2 sqrt(n)).
        if self._ann is not None:
            return m.live_rows > 4 * self._ann.trained_rows
        choice = self._ann_choice
        if choice is not None and choice.get("method") == "exact" and choice.get("target_recall") == self._target_recall:
            return m.live_rows > 4 * int(choice.get("rows", 0))  # IVF lost to exact search at this size: re-made later
        return True

    def _maybe_schedule_ann_locked(self) -> None:
        if self._ann_thread is None and self._ann_wanted_locked():
            self._ann_thread = threading.Thread(target=self._ann_build_worker, name=f"cold-faiss-build:{self._path}",
                                                daemon=True)
            self._ann_thread.start()

    def _open_ann_locked(self) -> None:
        """Load the saved index and reconcile it with the rows (it is a cache: never trusted blindly)."""
        m = self._mirror
        if self._index_mode != "auto" or m is None or m.live_rows < self._faiss_min_rows:
            return
        choice = read_choice(self._ann_folder)
        if (choice is not None and choice.get("method") == "exact" and choice.get("dim") == self._dim
                and choice.get("target_recall") == self._target_recall and m.live_rows <= 4 * int(choice.get("rows", 0))):
            self._adopt_exact_locked(choice, source="loaded")
            self._maybe_schedule_ann_locked()
            return
        try:
            ann, label_ids, meta = IvfAnn.read(self._ann_folder, self._dim)
        except FileNotFoundError:
            self._ann_source = "none"
        except Exception as exc:
            self._ann_source = "rejected"
            self._ann_error = f"saved index rejected ({type(exc).__name__}: {exc}); rebuilding from LanceDB"
        else:
            ann.scan_fraction, ann.probe_budget = meta.get("scan_fraction"), meta.get("probe_budget")
            method, why = choose_method(ann.tuned_recall, ann.nprobe, ann.nlist, ann.scan_fraction, self._target_recall)
            if method == "exact":  # saved by an older version (or for another target): not used, not loaded again
                choice = self._choice_record(ann, method, why)
                del ann
                self._adopt_exact_locked(choice, source="loaded")
                if self._read_only:
                    self._maybe_schedule_ann_locked()
                    return
                try:
                    with maintenance_lock(self._path, blocking=True, name=".faiss.lock"):
                        write_choice(self._ann_folder, {**choice, "table_version": self._mirror_version,
                                                        "saved_at": time.time()})
                except OSError:
                    pass  # a read-only folder: the saved index is judged again on the next open
                self._maybe_schedule_ann_locked()
                return
            try:
                report = ann.reconcile(label_ids, m)
            except Exception as exc:
                self._ann_source = "rejected"
                self._ann_error = f"saved index failed reconciliation ({type(exc).__name__}: {exc}); rebuilding"
            else:
                fresh = (meta.get("table_version") == self._mirror_version and meta.get("rows") == m.live_rows
                         and report["dropped"] == 0 and report["added"] == 0)
                self._ann_source = "loaded" if fresh else "repaired"
                self._ann_last_reconcile = report
                ann.changes = 0 if fresh else max(1, report["dropped"] + report["added"])
                m.listener = ann
                self._ann = ann
                self._ann_choice = self._choice_record(ann, method, why)
        self._maybe_schedule_ann_locked()

    def _choice_record(self, ann: IvfAnn, method: str, why: str) -> dict:
        return {"method": method, "reason": why, "tuned_recall": ann.tuned_recall, "target_recall": self._target_recall,
                "nprobe": ann.nprobe, "nlist": ann.nlist, "probe_budget": ann.probe_budget,
                "scan_fraction": ann.scan_fraction, "rows": ann.trained_rows, "dim": self._dim}

    def _adopt_exact_locked(self, choice: dict, *, source: str) -> None:
        """Search exactly (no FAISS index) because IVF missed the recall target or would be no faster."""
        old = self._ann
        if old is not None and self._mirror is not None and self._mirror.listener is old:
            self._mirror.listener = None
        self._ann = None
        self._ann_source = source
        self._ann_choice = dict(choice)
        logger.warning("cold store %s: exact search over %d rows instead of FAISS IVF: %s", self._path,
                       self._mirror.live_rows if self._mirror is not None else -1, choice.get("reason"))

    def _ann_build_worker(self) -> None:
        try:
            self._build_ann()
        except Exception as exc:  # a failed build leaves exact search in place; stats() reports it
            self._ann_error = f"build: {type(exc).__name__}: {exc}"
        finally:
            with self._lock:
                self._ann_thread = None

    def _build_ann(self) -> None:
        """Train and fill a new IVF index from a snapshot of the mirror without holding the lock, then catch up
        with the writes made meanwhile and swap it in (positions are append-only between repacks)."""
        for _ in range(3):
            with self._lock:
                if not self._ann_wanted_locked():
                    return
                m = self._mirror
                epoch, n_snap = m.epoch, m.n
                positions = m.live_positions()
                vectors = m.all_vectors()  # rows below n_snap are never rewritten in place; a repack bumps epoch
            t0 = time.perf_counter()
            nlist = choose_nlist(positions.shape[0])
            rng = np.random.default_rng(0)
            sample = np.sort(rng.choice(positions, size=min(positions.shape[0], 64 * nlist), replace=False))
            ann = IvfAnn.train(vectors[sample], nlist=nlist, trained_rows=positions.shape[0])
            for lo in range(0, positions.shape[0], 65536):
                part = positions[lo:lo + 65536]
                ann.add(part, vectors[part])
            ann.tune(vectors, positions, target=self._target_recall)
            method, why = ann.choice(self._target_recall)
            if method == "exact":
                with self._lock:
                    if self._closed:
                        return
                    choice = self._choice_record(ann, method, why)
                    self._adopt_exact_locked(choice, source="built")
                    self._ann_builds += 1
                    self._ann_last_build_s = time.perf_counter() - t0
                del ann
                if not self._read_only:
                    with self._ann_save_lock, maintenance_lock(self._path, blocking=True, name=".faiss.lock"):
                        write_choice(self._ann_folder, {**choice, "table_version": self._mirror_version,
                                                        "saved_at": time.time()})
                return
            with self._lock:
                if self._closed:
                    return
                if self._mirror is not m or m.epoch != epoch:
                    continue  # positions moved while building: build again from the new snapshot
                ann.remove(positions[~m.alive_at(positions)])
                new = m.live_positions(n_snap)
                ann.add(new, m.vectors_at(new))
                ann.changes = max(1, ann.changes)
                m.listener = ann
                self._ann = ann
                self._ann_choice = self._choice_record(ann, method, why)
                self._ann_source = "built"
                self._ann_builds += 1
                self._ann_last_build_s = time.perf_counter() - t0
            self._save_ann(force=True)
            return

    def _save_ann(self, *, force: bool) -> bool:
        """Publish the FAISS index beside the table (stamped with the table version it matches). Serialised under
        the store lock (a memory copy), written to disk outside it."""
        if self._closed or self._read_only:
            return False
        with self._ann_save_lock:
            with self._lock:
                ann, m = self._ann, self._mirror
                if ann is None or m is None or ann.changes == 0:
                    return False
                if not force and ann.changes < max(1000, m.live_rows // 20):
                    return False
                blob = ann.serialize()
                label_ids = m.label_ids()
                meta = {"dim": self._dim, "table_version": self._mirror_version, "rows": m.live_rows,
                        "nprobe": ann.nprobe, "trained_rows": ann.trained_rows, "tuned_recall": ann.tuned_recall,
                        "scan_fraction": ann.scan_fraction, "probe_budget": ann.probe_budget,
                        "target_recall": self._target_recall, "saved_at": time.time()}
                ann.changes = 0
            with maintenance_lock(self._path, blocking=True, name=".faiss.lock"):
                IvfAnn.write(self._ann_folder, blob, label_ids, meta)
                remove_choice(self._ann_folder)  # an IVF index is in use again
            return True

    def build_index(self) -> None:
        """Build (or retrain) the FAISS index now if the store is past `faiss_min_rows`, and save it; waits for
        a background build in flight. Benchmarks and bulk loaders call this; normal use never needs to."""
        self._check_open()
        self.wait_for_index()
        self._build_ann()
        self._save_ann(force=True)

    def wait_for_index(self, timeout: float | None = None) -> bool:
        """Block until no FAISS build is running (tests and benchmarks use this)."""
        thread = self._ann_thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def _filter_sql(self, namespace: str | None, where: str | None, excluded: np.ndarray | None = None) -> str | None:
        parts = []
        if namespace is not None:
            parts.append(f"namespace = {sql_string(namespace)}")
        if where is not None:
            parts.append(f"({where})")
        if excluded is not None and excluded.size:
            parts.append(f"id NOT IN {sql_id_list(np.unique(excluded))}")
        return " AND ".join(parts) or None

    def _run_filtered(self, what: str, fn: Callable[[], T], where: str | None) -> T:
        try:
            return fn()
        except TieredRecallError:
            raise
        except Exception as exc:
            if where is not None and _looks_like_bad_filter(exc):
                raise InvalidInput(f"where={where!r} is not a valid LanceDB SQL filter over the columns "
                                   f"id, namespace, session, role, text, created_at, metadata: {exc}") from None
            raise StorageError(f"cold tier: failed to {what} at {self._path}: {type(exc).__name__}: {exc}") from exc

    def _matching_ids(self, namespace: str | None, where: str) -> np.ndarray:
        sql = self._filter_sql(namespace, where)
        data = self._run_filtered("evaluate a where filter",
                                  lambda: self._table.search().where(sql).select(["id"]).limit(None).to_arrow(), where)
        return np.asarray(data.column("id").to_numpy(), dtype=np.int64)

    def _search_lancedb(self, query: np.ndarray, k: int, namespace: str | None, where: str | None,
                        excluded: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        sql = self._filter_sql(namespace, where, excluded)
        indexed = self._vector_index_type() is not None

        def run():
            # Fetch a few extra rows so ties at the k-th score can still be ordered by id after exact re-scoring.
            builder = (self._table.search(query, vector_column_name=VECTOR_COLUMN).distance_type("dot")
                       .select(["id", VECTOR_COLUMN]).limit(k + 16))
            if indexed:
                builder = builder.nprobes(_ANN_NPROBES).refine_factor(_ANN_REFINE_FACTOR)
            else:
                builder = builder.bypass_vector_index()
            if sql is not None:
                builder = builder.where(sql, prefilter=True)
            return builder.to_arrow()
        data = self._run_filtered("search", run, where)
        ids = np.asarray(data.column("id").to_numpy(), dtype=np.int64)
        vectors = vectors_from_arrow(data.column(VECTOR_COLUMN), self._dim)
        # Exact scores from the stored vectors: an ANN index only proposes candidates.
        return top_k_with_ties(vectors @ query, ids, k)

    def get(self, ids) -> list[dict | None]:
        """Rows for `ids` in the same order (None where absent): id, namespace, session, role, text,
        created_at_us, metadata (dict), vector ((dim,) float32)."""
        self._check_open()
        ids = check.check_ids(ids, allow_empty=True)
        if ids.size == 0:
            return []
        uniq = np.unique(ids)
        if self._lagging_reads:
            # This handle may not see another process's flush yet, while the log no longer holds those rows: read
            # them from the table after a flush of our own, which moves the handle to the latest version.
            self._flush_for_read()
        with self._lock:
            self._check_open()
            self._sync_locked()  # the log followed to its end: what it holds past the table is known
            rows: dict[int, dict] = {}
            in_table = []
            for row_id in uniq.tolist():
                logged = self._unflushed.get(row_id)
                if logged is None:
                    in_table.append(row_id)
                elif logged[2] is not None:  # logged rows are newer than the table's; a logged delete leaves None
                    r, j = logged[2], logged[3]
                    meta = r.metadata_json[j]
                    rows[row_id] = {"id": row_id, "namespace": r.namespaces[j], "session": r.sessions[j],
                                    "role": r.roles[j], "text": r.texts[j], "created_at_us": int(r.created_at_us[j]),
                                    "metadata": json.loads(meta) if meta else {}, "vector": r.vectors[j]}
            if in_table:
                wanted = np.asarray(in_table, np.int64)
                data = self._guard(f"get {wanted.size} rows", lambda: self._table.search()
                                   .where(f"id IN {sql_id_list(wanted)}").limit(None).to_arrow())
                rows.update(rows_from_arrow(data, self._dim))
        out = []
        for row_id in ids.tolist():
            row = rows.get(row_id)
            out.append(None if row is None else {**row, "metadata": dict(row["metadata"]), "vector": row["vector"].copy()})
        return out

    def count(self, namespace: str | None = None) -> int:
        self._check_open()
        namespace = check.check_optional_namespace(namespace)
        with self._read_locked(flush=self._mirror is None):
            if self._mirror is not None:
                return self._mirror.count(namespace)
            sql = self._filter_sql(namespace, None)
            return int(self._guard("count rows", lambda: self._table.count_rows(sql)))

    def namespace_counts(self) -> dict[str, int]:
        self._check_open()
        with self._read_locked(flush=self._mirror is None):
            if self._mirror is not None:
                return self._mirror.namespace_counts()
            data = self._guard("count namespaces", lambda: self._table.search().select(["namespace"]).limit(None).to_arrow())
        counts = data.column("namespace").value_counts().to_pylist()
        return {c["values"]: int(c["counts"]) for c in counts}

    def vectors_of(self, ids) -> dict:
        """The stored rows among ids (absent ones left out), in the form recent() returns; served
        from the in-memory mirror when it is loaded, so promoting rows to the hot tier reads no disk."""
        self._check_open()
        ids = check.check_ids(ids, allow_empty=True)
        with self._read_locked(flush=self._mirror is None):
            if self._mirror is not None:
                return self._mirror.rows(ids)
        rows = [r for r in self.get(ids) if r is not None]
        return {
            "ids": np.array([r["id"] for r in rows], dtype=np.int64),
            "vectors": np.stack([r["vector"] for r in rows]) if rows else np.empty((0, self._dim), np.float32),
            "namespace": [r["namespace"] for r in rows],
            "created_at_us": np.array([r["created_at_us"] for r in rows], dtype=np.int64),
        }

    def recent(self, limit: int, *, namespace: str | None = None) -> dict:
        """Newest rows first (by created_at, then larger id): ids (n,) int64, vectors (n, dim) float32,
        namespace list[str], created_at_us (n,) int64. Used to warm the hot tier."""
        self._check_open()
        limit = check.check_limit(limit)
        namespace = check.check_optional_namespace(namespace)
        with self._read_locked(flush=self._mirror is None):
            if self._mirror is not None:
                return self._mirror.recent(limit, namespace)
            sql = self._filter_sql(namespace, None)

            def scan():
                builder = self._table.search().select(["id", "created_at"]).limit(None)
                return (builder.where(sql) if sql else builder).to_arrow()
            meta = self._guard("list recent rows", scan)
        ids = np.asarray(meta.column("id").to_numpy(), dtype=np.int64)
        created = timestamps_us(meta.column("created_at"))
        chosen = ids[np.lexsort((-ids, -created))[:limit]]
        rows = self.get(chosen)
        rows = [r for r in rows if r is not None]
        return {
            "ids": np.array([r["id"] for r in rows], dtype=np.int64),
            "vectors": np.stack([r["vector"] for r in rows]).astype(np.float32) if rows else np.empty((0, self._dim), np.float32),
            "namespace": [r["namespace"] for r in rows],
            "created_at_us": np.array([r["created_at_us"] for r in rows], dtype=np.int64),
        }

    # ---- upkeep --------------------------------------------------------------------------------
    def optimize(self) -> None:
        """Compact now and drop every old version (waits for another process's maintenance to finish)."""
        self._check_open()
        self._check_writable()
        self._flush_now()
        if self._maintenance is not None:
            self._maintenance.wait_idle()
        with maintenance_lock(self._path, blocking=True):
            def run():
                with warnings.catch_warnings(), self._no_row_commits():
                    # LanceDB warns that a zero grace breaks readers of old versions: that is what "now" asks for.
                    warnings.filterwarnings("ignore", message=r"optimize\(cleanup_older_than=0\)", category=UserWarning)
                    self._table.optimize(cleanup_older_than=timedelta(0))
                self._build_indices(self._table)
            self._guard("optimize the table", run)
            if self._maintenance is not None:
                self._maintenance.reset()
            self._last_compaction_at = time.time()
            self._compactions += 1
        with self._lock:
            self._sync_locked()
        self.wait_for_index()
        self._build_ann()
        self._save_ann(force=True)

    def _maintain(self) -> bool:
        """Background job: compaction, cleanup of versions older than the grace period, index builds.
        Returns False when it did not run because another process holds the maintenance lock."""
        if self._closed:
            return True
        try:
            with maintenance_lock(self._path, blocking=False) as got:
                if not got:
                    return False  # another process is compacting this table right now
                if self._maintenance_table is None:
                    self._maintenance_table = self._db.open_table(TABLE_NAME)
                table = self._maintenance_table
                start = table.version
                def optimize():
                    with self._no_row_commits():
                        table.optimize(cleanup_older_than=self._cleanup_grace)
                _retry(optimize, _is_conflict, 0.02)
                self._build_indices(table)
                self._last_compaction_at = time.time()
                self._compactions += 1
                self._note_benign(table, start)  # before the lock goes: readers defer until then (_sync_locked)
                self._maybe_reconnect(table.version)
            with self._lock:
                if not self._closed:
                    self._sync_locked()  # absorb the compaction versions here, not on a reader's time
            self._save_ann(force=False)
        except Exception as exc:  # the thread must survive; stats() reports the failure
            self._maintenance_errors += 1
            self._last_maintenance_error = f"{type(exc).__name__}: {exc}"
        return True

    def _no_row_commits(self):
        """Held around a compaction: no flush and no direct write commits meanwhile (they take the same flush lock).
        LanceDB drops a compaction task whose fragments a concurrent delete touched ("Retryable commit conflict ...
        preempted by concurrent transaction Delete"): with deletes flushed every half second, compaction lost every
        time and fragments piled up (a soak fell from about 500 to 150 operations/s in 10 minutes). Adds and
        deletes go on meanwhile: they are appended to the log, which the flusher commits after the compaction."""
        return self._wal.flushing() if self._wal is not None else nullcontext()

    def _note_benign(self, table, start: int) -> None:
        """Log which versions since `start` keep every row (this maintenance's compaction and index builds), so other
        processes need not list the table's versions to find out. Only a hint: on failure they do."""
        if self._wal is None:
            return
        try:
            summaries = {v["version"]: v.get("metadata") or {} for v in table.list_versions()}
            benign = []
            for v in range(start + 1, max(summaries, default=start) + 1):
                before, after = summaries.get(v - 1), summaries.get(v)
                if before and after and _same_rows(before, after):
                    benign.append(v)
            if benign:
                with self._wal.locked():
                    self._wal.append(encode_note("benign", benign))
                with self._lock:
                    self._known.update(v for v in benign if v > self._mirror_version)
        except Exception as exc:
            self._last_maintenance_error = f"benign-version note: {type(exc).__name__}: {exc}"

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
        # with the mirror, FAISS does: building IVF_PQ over 1M rows would cost minutes of CPU for nothing.
        lance_serves = self._mirror is None or self._index_mode == "lancedb"
        if rows >= self._ann_index_min_rows and lance_serves and (VECTOR_COLUMN,) not in have:
            from lancedb.index import IvfPq
            table.create_index(VECTOR_COLUMN, config=IvfPq(distance_type="dot",
                                                          num_partitions=max(1, int(np.sqrt(rows) / 4)),
                                                          num_sub_vectors=_pq_sub_vectors(self._dim)))

    def _vector_index_type(self) -> str | None:
        for idx in self._table.list_indices():
            if tuple(idx.columns) == (VECTOR_COLUMN,):
                return str(idx.index_type)
        return None

    def _search_path(self, mirror_rows: int | None, vector_index: str | None) -> str:
        if self._ann is None and mirror_rows is not None and self._exact_by_choice():
            return "faiss-flat-exact"  # past faiss_min_rows, but IVF missed the recall target or was no faster
        return _search_path_name(self._index_mode, mirror_rows, self._ann is not None, vector_index)

    def wait_for_maintenance(self, timeout: float | None = None) -> bool:
        """Block until queued background upkeep has run (tests and benchmarks use this)."""
        return True if self._maintenance is None else self._maintenance.wait_idle(timeout)

    def stats(self) -> dict:
        self._check_open()
        try:
            self._flush_for_read()  # the table's figures below then count every row
        except ReadOnlyStore as exc:
            self._wal_last_error = str(exc)
        with self._lock:
            self._check_open()
            self._sync_locked()

            def collect():
                table_stats = self._table.stats()
                return (table_stats, len(self._table.list_versions()),
                        [{"columns": list(i.columns), "type": str(i.index_type), "name": i.name} for i in self._table.list_indices()],
                        self._table.version)

            # Another process's maintenance may delete old versions while this lists them: list again.
            table_stats, versions, indices, version = self._guard(
                "read table statistics", lambda: _retry(collect, _is_vanished_version, 0.01))
            mirror_rows = None if self._mirror is None else self._mirror.live_rows
            mirror_positions = None if self._mirror is None else self._mirror.n
            keyword_index = None if self._bm25 is None else self._bm25.stats()
            ann = self._ann
            faiss_stats = None if ann is None else {
                "kind": "ivf_flat", "rows": ann.ntotal, "nlist": ann.nlist, "nprobe": ann.nprobe,
                "trained_rows": ann.trained_rows, "tuned_recall": ann.tuned_recall, "source": self._ann_source,
                "unsaved_changes": ann.changes, "scan_fraction": ann.scan_fraction}
            faiss_choice = None if self._ann_choice is None else dict(self._ann_choice)
        fragments = table_stats.get("fragment_stats", {})
        vector_index = next((i["type"] for i in indices if i["columns"] == [VECTOR_COLUMN]), None)
        return {
            "path": self._path,
            "dim": self._dim,
            "rows": int(table_stats.get("num_rows", 0)),
            "bytes": int(table_stats.get("total_bytes", 0)),
            "fragments": int(fragments.get("num_fragments", 0)),
            "small_fragments": int(fragments.get("num_small_fragments", 0)),
            "versions": versions,
            "table_version": version,
            "indices": indices,
            "index_kind": vector_index or "none",
            "search_path": self._search_path(mirror_rows, vector_index),
            "faiss": faiss_stats,
            "faiss_source": self._ann_source,
            "faiss_builds": self._ann_builds,
            "faiss_building": self._ann_thread is not None,
            "faiss_last_build_s": self._ann_last_build_s,
            "faiss_last_reconcile": self._ann_last_reconcile,
            "faiss_error": self._ann_error,
            # Why the default search is exact or IVF past faiss_min_rows: method, reason, tuned_recall, nprobe, ...
            "faiss_choice": faiss_choice,
            "mirror_rows": mirror_rows,
            "mirror_positions": mirror_positions,  # live rows plus deleted ones until the next repack
            "keyword_index": keyword_index,  # BM25 (built by the first hybrid search): live_rows, slots, terms
            "last_compaction_at": self._last_compaction_at,
            "compactions": self._compactions,
            "lance_reconnects": self._reconnects,
            "pending_writes": 0 if self._maintenance is None else self._maintenance.pending_writes,
            "maintenance_errors": self._maintenance_errors,
            "last_maintenance_error": self._last_maintenance_error,
            "wal": self._wal is not None,
            "wal_generation": None if self._follower is None else self._follower.gen,
            "wal_flushes": self._wal_flushes,
            "wal_flushed_rows": self._wal_flushed_rows,
            "wal_last_flush_s": self._wal_last_flush_s,
            "wal_errors": self._wal_errors,
            "wal_last_error": self._wal_last_error,
        }


def _same_rows(before: dict, after: dict) -> bool:
    """From two consecutive versions' summaries: the later kept the rows as they were (same live rows, no more data
    rows, no more deleted rows). Inserts, deletes and updates all fail this."""
    try:
        return (int(after["total_rows"]) == int(before["total_rows"])
                and int(after["total_data_file_rows"]) <= int(before["total_data_file_rows"])
                and int(after["total_deletion_file_rows"]) <= int(before["total_deletion_file_rows"]))
    except (KeyError, ValueError):
        return False


def _search_path_name(mode: str, mirror_rows: int | None, has_faiss: bool, vector_index: str | None) -> str:
    if mirror_rows is None or mode == "lancedb":
        return "lancedb-ann+rerank" if vector_index else "lancedb-exact"
    return "faiss-ivf+rerank" if has_faiss and mode == "auto" else "mirror-exact"


def _pq_sub_vectors(dim: int) -> int:
    """PQ sub-vector count: about dim/8 (8 dims per code), and it must divide dim."""
    target = max(1, dim // 8)
    for m in range(target, 0, -1):
        if dim % m == 0:
            return m
    return 1
