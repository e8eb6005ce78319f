"""ColdStore: the durable cold tier, a LanceDB table with an in-memory exact-search mirror and background upkeep."""
from __future__ import annotations

import os
import threading
import time
import warnings
from datetime import timedelta
from typing import Any, Callable, TypeVar

import numpy as np

from ..errors import InvalidInput, StorageError, TieredRecallError
from . import _validate as check
from ._maintenance import MaintenanceThread, maintenance_lock
from ._mirror import VectorMirror, top_k_with_ties
from ._schema import (TABLE_NAME, VECTOR_COLUMN, build_batch, memory_schema, rows_from_arrow, schema_dim,
                      sql_id_list, sql_string, timestamps_us, vectors_from_arrow)

T = TypeVar("T")

_COMMIT_RETRIES = 5
# Rows fetched per ANN candidate list before exact re-ranking (LanceDB refine_factor).
_ANN_REFINE_FACTOR = 10
_ANN_NPROBES = 20


def _lancedb():
    # Imported on first use so that LANCE_CPU_THREADS set by the caller takes effect before LanceDB's runtime starts.
    import lancedb
    return lancedb


def _is_conflict(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "conflict" in text or "retryable" in text


def _looks_like_bad_filter(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(word in text for word in ("sql", "parse", "no field", "not found in schema", "schema error",
                                         "invalid user input", "column", "expected", "unsupported"))


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
    """

    def __init__(self, path: str | os.PathLike, *, dim: int, read_consistency_interval_s: float = 0.0,
                 lance_threads: int | None = None, compact_every_writes: int = 32, compact_every_s: float = 10.0,
                 cleanup_grace_s: float = 10.0, mirror_max_bytes: int = 2 << 30,
                 scalar_index_min_rows: int = 50_000, ann_index_min_rows: int = 250_000,
                 background: bool = True):
        self._dim = check.check_dim(dim)
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

        try:
            os.makedirs(self._path, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create the cold-tier folder {self._path}: {exc}") from exc
        interval = timedelta(seconds=float(read_consistency_interval_s))
        self._db = self._guard("connect to LanceDB", lambda: _lancedb().connect(self._path, read_consistency_interval=interval))
        self._table = self._open_or_create()
        self._schema = self._table.schema  # fetched once: each .schema call is a round trip into LanceDB
        self._maintenance_table = None
        with self._lock:
            self._reload_mirror_locked()
        if background:
            self._maintenance = MaintenanceThread(self._maintain, writes_due=self._writes_per_compaction,
                                                  every_s=compact_every_s, name=f"cold-maintenance:{self._path}")

    # ---- life cycle ----------------------------------------------------------------------------
    @property
    def dim(self) -> int:
        return self._dim

    @property
    def path(self) -> str:
        return self._path

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._maintenance is not None:
            self._maintenance.stop()
        with self._lock:
            self._mirror = None
            self._table = None
            self._maintenance_table = None
            self._db = None

    def __enter__(self) -> "ColdStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _guard(self, what: str, fn: Callable[[], T]) -> T:
        """Run a LanceDB/OS call; failures become StorageError saying what was being done."""
        try:
            return fn()
        except TieredRecallError:
            raise
        except Exception as exc:  # LanceDB raises OSError, RuntimeError, ValueError, ... for storage failures
            raise StorageError(f"cold tier: failed to {what} at {self._path}: {type(exc).__name__}: {exc}") from exc

    def _commit(self, what: str, fn: Callable[[], T]) -> T:
        """A write that may race with compaction or another process: retry on commit conflicts (writes are idempotent)."""
        for attempt in range(_COMMIT_RETRIES):
            try:
                return fn()
            except TieredRecallError:
                raise
            except Exception as exc:
                if attempt + 1 < _COMMIT_RETRIES and _is_conflict(exc):
                    time.sleep(0.01 * (attempt + 1))
                    continue
                raise StorageError(f"cold tier: failed to {what} at {self._path}: {type(exc).__name__}: {exc}") from exc
        raise AssertionError("unreachable")

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"cold store at {self._path} is closed; open a new ColdStore")

    def _open_or_create(self):
        def open_or_create():
            try:
                return self._db.open_table(TABLE_NAME)
            except (FileNotFoundError, ValueError):
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
        """Rebuild the mirror from one pinned table version (so the copy is a consistent snapshot)."""
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
        self._mirror_version = version
        self._row_estimate = rows
        if data is None:
            self._mirror = None
            return
        mirror = VectorMirror(self._dim, capacity=max(1024, data.num_rows + data.num_rows // 4))
        if data.num_rows:
            mirror.upsert(np.asarray(data.column("id").to_numpy(), dtype=np.int64),
                          vectors_from_arrow(data.column(VECTOR_COLUMN), self._dim),
                          data.column("namespace").to_pylist(), timestamps_us(data.column("created_at")))
        self._mirror = mirror

    def _benign_versions(self, start: int, end: int) -> bool:
        """True if every version in (start, end] kept the rows as they were (compaction, index builds).

        Judged from each version's summary against its predecessor: same live rows, no more data rows and no more
        deleted rows. Inserts, deletes and updates all fail this; unknown versions (cleaned up) count as changes.
        """
        if end <= start:
            return True
        try:
            summaries = {v["version"]: v.get("metadata") or {} for v in self._table.list_versions()}
        except Exception:
            return False
        for v in range(start + 1, end + 1):
            before, after = summaries.get(v - 1), summaries.get(v)
            if not before or not after:
                return False
            try:
                same_rows = int(after["total_rows"]) == int(before["total_rows"])
                no_new_data = int(after["total_data_file_rows"]) <= int(before["total_data_file_rows"])
                no_new_deletes = int(after["total_deletion_file_rows"]) <= int(before["total_deletion_file_rows"])
            except (KeyError, ValueError):
                return False
            if not (same_rows and no_new_data and no_new_deletes):
                return False
        return True

    def _sync_locked(self) -> None:
        """Bring the mirror to the table's latest version before a read (another process may have written)."""
        latest = self._guard("read the table version", lambda: self._table.version)
        if latest <= self._mirror_version:
            # Equal: nothing moved. Lower: with read_consistency_interval_s > 0 this handle may lag behind the
            # snapshot the mirror was loaded from; the mirror is already the newer view.
            return
        if self._mirror is not None and latest > self._mirror_version and self._benign_versions(self._mirror_version, latest):
            self._mirror_version = latest
            return
        self._reload_mirror_locked()

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
    def add(self, *, ids, vectors, namespaces, texts, sessions, roles, created_at_us, metadata) -> None:
        """Upsert rows by id; committed (durable) when this returns; the whole batch or nothing.

        ids: (n,) int64; vectors: (n, dim) float32 unit-norm; namespaces/texts: n str; sessions/roles: n str|None;
        created_at_us: (n,) int64 microseconds since the epoch (UTC); metadata: n dict|None (JSON-serialisable).
        """
        self._check_open()
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
        batch = build_batch(self._schema, ids=ids, vectors=vectors, namespaces=namespaces, texts=texts,
                            sessions=sessions, roles=roles, created_at_us=created, metadata_json=metadata_json)

        def upsert():
            return (self._table.merge_insert("id").when_matched_update_all()
                    .when_not_matched_insert_all().execute(batch))

        with self._lock:
            self._check_open()
            self._sync_locked()
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
        if self._maintenance is not None:
            self._maintenance.note_writes()

    def delete(self, ids) -> int:
        """Delete rows by id; returns how many existed. Committed when this returns."""
        self._check_open()
        ids = check.check_ids(ids, allow_empty=True)
        if ids.size == 0:
            return 0
        ids = np.unique(ids)
        with self._lock:
            self._check_open()
            result = self._commit(f"delete {ids.size} rows", lambda: self._table.delete(f"id IN {sql_id_list(ids)}"))
            deleted = int(result.num_deleted_rows)
            self._after_own_write_locked(result.version, lambda m: m.remove(ids))
            self._row_estimate = max(0, self._row_estimate - deleted)
        if deleted and self._maintenance is not None:
            self._maintenance.note_writes()
        return deleted

    # ---- reads ---------------------------------------------------------------------------------
    def search(self, vector, *, k: int, namespace: str | None = None, where: str | None = None,
               exclude_ids=None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k rows by inner product with `vector` ((dim,) float32): (ids int64, scores float32), best first.

        Scores are exact; equal scores are ordered by smaller id. `where` is a LanceDB SQL filter over the
        row columns (e.g. "role = 'user' AND session = 's1'"); `exclude_ids` are never returned.
        """
        self._check_open()
        query = check.check_query(vector, self._dim)
        k = check.check_k(k)
        namespace = check.check_optional_namespace(namespace)
        where = check.check_where(where)
        excluded = None if exclude_ids is None else check.check_ids(exclude_ids, name="exclude_ids", allow_empty=True)
        with self._lock:
            self._check_open()
            self._sync_locked()
            if self._mirror is not None:
                only = None if where is None else self._matching_ids(namespace, where)
                return self._mirror.search(query, k, namespace=namespace, only_ids=only, exclude_ids=excluded)
            return self._search_lancedb(query, k, namespace, where, excluded)

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
        with self._lock:
            self._check_open()
            data = self._guard(f"get {uniq.size} rows", lambda: self._table.search().where(f"id IN {sql_id_list(uniq)}")
                               .limit(None).to_arrow())
        rows = rows_from_arrow(data, self._dim)
        out = []
        for row_id in ids.tolist():
            row = rows.get(row_id)
            out.append(None if row is None else {**row, "metadata": dict(row["metadata"]), "vector": row["vector"].copy()})
        return out

    def count(self, namespace: str | None = None) -> int:
        self._check_open()
        namespace = check.check_optional_namespace(namespace)
        with self._lock:
            self._check_open()
            self._sync_locked()
            if self._mirror is not None:
                return self._mirror.count(namespace)
            sql = self._filter_sql(namespace, None)
            return int(self._guard("count rows", lambda: self._table.count_rows(sql)))

    def namespace_counts(self) -> dict[str, int]:
        self._check_open()
        with self._lock:
            self._check_open()
            self._sync_locked()
            if self._mirror is not None:
                return self._mirror.namespace_counts()
            data = self._guard("count namespaces", lambda: self._table.search().select(["namespace"]).limit(None).to_arrow())
        counts = data.column("namespace").value_counts().to_pylist()
        return {c["values"]: int(c["counts"]) for c in counts}

    def recent(self, limit: int, *, namespace: str | None = None) -> dict:
        """Newest rows first (by created_at, then larger id): ids (n,) int64, vectors (n, dim) float32,
        namespace list[str], created_at_us (n,) int64. Used to warm the hot tier."""
        self._check_open()
        limit = check.check_limit(limit)
        namespace = check.check_optional_namespace(namespace)
        with self._lock:
            self._check_open()
            self._sync_locked()
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
        if self._maintenance is not None:
            self._maintenance.wait_idle()
        with maintenance_lock(self._path, blocking=True):
            def run():
                with warnings.catch_warnings():
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
                for attempt in range(_COMMIT_RETRIES):
                    try:
                        table.optimize(cleanup_older_than=self._cleanup_grace)
                        break
                    except Exception as exc:
                        if attempt + 1 == _COMMIT_RETRIES or not _is_conflict(exc):
                            raise
                        time.sleep(0.02 * (attempt + 1))
                self._build_indices(table)
                self._last_compaction_at = time.time()
                self._compactions += 1
            with self._lock:
                if not self._closed:
                    self._sync_locked()  # absorb the compaction versions here, not on a reader's time
        except Exception as exc:  # the thread must survive; stats() reports the failure
            self._maintenance_errors += 1
            self._last_maintenance_error = f"{type(exc).__name__}: {exc}"
        return True

    def _build_indices(self, table) -> None:
        rows = table.count_rows()
        have = {tuple(idx.columns): idx.index_type for idx in table.list_indices()}
        if rows >= self._scalar_index_min_rows:
            from lancedb.index import BTree, Bitmap
            if ("id",) not in have:
                table.create_index("id", config=BTree())  # speeds up upsert, get and delete by id
            if ("namespace",) not in have:
                table.create_index("namespace", config=Bitmap())  # namespace filters without a full scan
        if rows >= self._ann_index_min_rows and (VECTOR_COLUMN,) not in have:
            from lancedb.index import IvfPq
            table.create_index(VECTOR_COLUMN, config=IvfPq(distance_type="dot",
                                                          num_partitions=max(1, int(np.sqrt(rows) / 4)),
                                                          num_sub_vectors=_pq_sub_vectors(self._dim)))

    def _vector_index_type(self) -> str | None:
        for idx in self._table.list_indices():
            if tuple(idx.columns) == (VECTOR_COLUMN,):
                return str(idx.index_type)
        return None

    def wait_for_maintenance(self, timeout: float | None = None) -> bool:
        """Block until queued background upkeep has run (tests and benchmarks use this)."""
        return True if self._maintenance is None else self._maintenance.wait_idle(timeout)

    def stats(self) -> dict:
        self._check_open()
        with self._lock:
            self._check_open()
            self._sync_locked()

            def collect():
                table_stats = self._table.stats()
                return (table_stats, len(self._table.list_versions()),
                        [{"columns": list(i.columns), "type": str(i.index_type), "name": i.name} for i in self._table.list_indices()],
                        self._table.version)
            table_stats, versions, indices, version = self._guard("read table statistics", collect)
            mirror_rows = None if self._mirror is None else self._mirror.live_rows
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
            "search_path": "mirror-exact" if mirror_rows is not None else ("lancedb-ann+rerank" if vector_index else "lancedb-exact"),
            "mirror_rows": mirror_rows,
            "last_compaction_at": self._last_compaction_at,
            "compactions": self._compactions,
            "pending_writes": 0 if self._maintenance is None else self._maintenance.pending_writes,
            "maintenance_errors": self._maintenance_errors,
            "last_maintenance_error": self._last_maintenance_error,
        }


def _pq_sub_vectors(dim: int) -> int:
    """PQ sub-vector count: about dim/8 (8 dims per code), and it must divide dim."""
    target = max(1, dim // 8)
    for m in range(target, 0, -1):
        if dim % m == 0:
            return m
    return 1
