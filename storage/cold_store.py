"""ColdStore: the durable cold tier, a LanceDB table with an in-memory exact-search mirror and background upkeep.

The store is a facade over parts that each own their state (docs/cold-tier.md walks through them): _tables (the
LanceDB connection), _follower (the mirror and what this process read of the log), _writer (the write path and the
flusher), _index (the FAISS index), _search, _reads, _maintenance (compaction and index builds). Caller input is
checked here, once; the parts take checked arrays.
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

from ..errors import InvalidInput, ReadOnlyStore, StorageError
from ..sync import Bump, LogFollower, Rows, Snapshot, WriteGenerations, open_generations
from . import _validate as check
from ._ann import TARGET_RECALL
from ._follower import Follower
from ._index import FAISS_FOLDER, FaissIndex
from ._lifecycle import Lifecycle
from ._maintenance import TableUpkeep
from ._reads import RowReads, as_recent, in_order
from ._search import Searcher
from ._tables import LanceTables, guard
from ._wal import WriteAheadLog
from ._writer import Writer

__all__ = ["ColdStore", "FAISS_FOLDER", "INDEX_MODES", "WAL_FOLDER"]

INDEX_MODES = ("auto", "exact", "lancedb")
WAL_FOLDER = "_wal"


def _check_options(*, index: str, faiss_min_rows: Any, target_recall: Any, path: Any,
                   read_consistency_interval_s: Any, lance_threads: Any, cleanup_grace_s: Any,
                   compact_every_writes: Any, wal: Any, wal_flush_rows: Any, wal_flush_s: Any) -> None:
    if index not in INDEX_MODES:
        raise InvalidInput(f"index must be one of {INDEX_MODES} (\"auto\" picks exact or FAISS by size), got {index!r}")
    if isinstance(faiss_min_rows, bool) or not isinstance(faiss_min_rows, int) or faiss_min_rows < 1:
        raise InvalidInput(f"faiss_min_rows must be a positive int, got {faiss_min_rows!r}")
    if not isinstance(target_recall, (int, float)) or not 0 < target_recall <= 1:
        raise InvalidInput(f"target_recall must be in (0, 1], got {target_recall!r}")
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise InvalidInput(f"path must be a folder path (str or os.PathLike), got {path!r}")
    if not isinstance(read_consistency_interval_s, (int, float)) or read_consistency_interval_s < 0:
        raise InvalidInput(f"read_consistency_interval_s must be a number >= 0 (0 = see other writers at once), got {read_consistency_interval_s!r}")
    if lance_threads is not None:
        if isinstance(lance_threads, bool) or not isinstance(lance_threads, int) or lance_threads <= 0:
            raise InvalidInput(f"lance_threads must be a positive int or None, got {lance_threads!r}")
    if cleanup_grace_s <= 0:
        raise InvalidInput("cleanup_grace_s must be > 0 for background cleanup (readers in other processes may hold old versions); use optimize() for a full cleanup")
    if isinstance(compact_every_writes, bool) or not isinstance(compact_every_writes, int) or compact_every_writes <= 0:
        raise InvalidInput(f"compact_every_writes must be a positive int, got {compact_every_writes!r}")
    if not isinstance(wal, bool):
        raise InvalidInput(f"wal must be True or False, got {wal!r}")
    if isinstance(wal_flush_rows, bool) or not isinstance(wal_flush_rows, int) or wal_flush_rows <= 0:
        raise InvalidInput(f"wal_flush_rows must be a positive int, got {wal_flush_rows!r}")
    if not isinstance(wal_flush_s, (int, float)) or not wal_flush_s > 0:
        raise InvalidInput(f"wal_flush_s must be a number > 0 (seconds between background flushes), got {wal_flush_s!r}")


def _check_location(table_uri: Any, storage_options: Any) -> tuple[str | None, dict[str, str] | None]:
    if table_uri is not None and (not isinstance(table_uri, str) or not table_uri):
        raise InvalidInput(f"table_uri must be a non-empty str (s3://bucket/prefix, gs://..., a folder) or None, got "
                           f"{type(table_uri).__name__}")
    if storage_options is None:
        return table_uri, None
    if table_uri is None:
        raise InvalidInput("storage_options go with table_uri (the object store they are for): pass both")
    if not isinstance(storage_options, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                        for k, v in storage_options.items()):
        raise InvalidInput("storage_options must be a dict of str to str (LanceDB's options: aws_endpoint, "
                           "aws_region, ...)")  # the values are never printed: they may be keys
    return table_uri, dict(storage_options)


class ColdStore:
    """Durable memory rows (LanceDB table "memories" under `path`) with exact cosine search.

    Vectors are unit-norm float32 (n, dim); scores are inner products. Writes commit before returning.
    Small and medium tables are searched exactly through an in-memory mirror kept in step with every
    write and re-synced when another process moves the table; past `mirror_max_bytes` searches go to
    LanceDB (an IVF_PQ index once the table has `ann_index_min_rows` rows, candidates re-ranked exactly).

    Keyword options beyond the coordinator's contract (defaults suit it):
      compact_every_writes / compact_every_s: background compaction after this many writes (more for big tables,
          see TableUpkeep.writes_per_compaction) or on a timer tick; cleanup_grace_s: background cleanup keeps
          versions younger than this for readers in other processes (optimize() keeps none);
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
      table_uri: where LanceDB keeps the table, when not in `path`: an object store URI (s3://bucket/prefix,
          gs://..., az://...) or another folder; storage_options: what LanceDB takes for it (aws_endpoint,
          aws_region, keys, allow_http, ...). The log, the mirror, the FAISS index and the locks stay in `path`, so
          one host's processes share the store as with a local table; only one host may write the table.
    """

    def __init__(self, path: str | os.PathLike, *, dim: int, read_consistency_interval_s: float = 0.0,
                 lance_threads: int | None = None, compact_every_writes: int = 32, compact_every_s: float = 10.0,
                 cleanup_grace_s: float = 10.0, mirror_max_bytes: int = 2 << 30,
                 scalar_index_min_rows: int = 50_000, ann_index_min_rows: int = 250_000,
                 background: bool = True, index: str = "auto", faiss_min_rows: int = 20_000,
                 target_recall: float = TARGET_RECALL, wal: bool = True, wal_flush_rows: int = 512,
                 wal_flush_s: float = 0.5, read_only: bool = False, table_uri: str | None = None,
                 storage_options: dict[str, str] | None = None):
        self._dim = check.check_dim(dim)
        table_uri, storage_options = _check_location(table_uri, storage_options)
        if not isinstance(read_only, bool):
            raise InvalidInput(f"read_only must be True or False, got {read_only!r}")
        _check_options(index=index, faiss_min_rows=faiss_min_rows, target_recall=target_recall, path=path,
                       read_consistency_interval_s=read_consistency_interval_s, lance_threads=lance_threads,
                       cleanup_grace_s=cleanup_grace_s, compact_every_writes=compact_every_writes, wal=wal,
                       wal_flush_rows=wal_flush_rows, wal_flush_s=wal_flush_s)
        if lance_threads is not None:
            # LanceDB reads this once when its runtime starts; set it before the first connect in the process.
            os.environ["LANCE_CPU_THREADS"] = str(lance_threads)
        self._read_only = read_only
        self._path = path = os.path.abspath(os.fspath(path))
        if read_only:
            if not os.path.isdir(path):
                raise InvalidInput(f"no cold store at {path}: a read-only store must exist (open it writable "
                                   "once to create it)")
            background = False  # no compaction, flush or index file: nothing is written
        else:
            try:
                os.makedirs(path, mode=0o700, exist_ok=True)
            except OSError as exc:
                raise StorageError(f"cannot create the cold-tier folder {path}: {exc}") from exc
        self._life = Lifecycle(path)
        # The store's lock: orders every use of the in-memory view and the table handles; taken after the log's locks.
        self._lock = threading.RLock()
        wal_folder = os.path.join(path, WAL_FOLDER)
        self._wal: WriteAheadLog | None = None
        if wal and (not read_only or os.path.isdir(wal_folder)):
            self._wal = guard(path, "open the write-ahead log", lambda: WriteAheadLog(wal_folder, read_only=read_only))
        # Every write bumps these before it is acknowledged; the coordinator certifies the hot tier against them.
        self._generations: WriteGenerations | None = guard(
            path, "open the write generations", lambda: open_generations(path, read_only=read_only))
        self._tables = LanceTables(path, self._dim, read_only=read_only,
                                   read_consistency_interval_s=read_consistency_interval_s,
                                   uri=table_uri, storage_options=storage_options)
        self._follower = Follower(path, self._dim, self._tables, self._wal, mirror_max_bytes=int(mirror_max_bytes),
                                  read_only=read_only)
        self._index = FaissIndex(self._follower, lock=self._lock, life=self._life, path=path, dim=self._dim,
                                 read_only=read_only, mode=index, min_rows=faiss_min_rows,
                                 target_recall=float(target_recall))
        self._follower.watcher = self._index
        self._reads = RowReads(self._follower, self._tables, self._dim)
        self._searcher = Searcher(self._follower, self._index, self._tables, self._reads, dim=self._dim, mode=index)
        # Without a log nothing else keeps this process's direct writes and its compactions apart (with one, both take
        # the flush lock): a compaction whose fragments a delete touched meanwhile is dropped by LanceDB.
        unlogged_commits = threading.RLock()
        self._upkeep = TableUpkeep(tables=self._tables, wal=self._wal, follower=self._follower, index=self._index,
                                   lock=self._lock, unlogged_commits=unlogged_commits, life=self._life,
                                   cleanup_grace_s=cleanup_grace_s,
                                   compact_every_writes=compact_every_writes,
                                   scalar_index_min_rows=int(scalar_index_min_rows),
                                   ann_index_min_rows=int(ann_index_min_rows), index_mode=index, dim=self._dim)
        self._writer = Writer(wal=self._wal, follower=self._follower, tables=self._tables,
                              generations=self._generations, lock=self._lock, unlogged_commits=unlogged_commits,
                              life=self._life, read_only=read_only,
                              flush_rows=wal_flush_rows, flush_s=float(wal_flush_s),
                              note_writes=self._upkeep.note_writes)
        with self._lock:
            self._follower.reload_locked()
            self._index.open_saved_locked()
        if background:
            self._upkeep.start(compact_every_s)
        self._writer.start()  # replays what the log holds, then starts the flusher (not in a read-only store)

    # ---- life cycle ----------------------------------------------------------------------------
    @property
    def dim(self) -> int:
        """The vector width of the store."""
        return self._dim

    @property
    def path(self) -> str:
        """The store's folder, absolute."""
        return self._path

    @property
    def read_only(self) -> bool:
        """True when the store was opened read_only (adds and deletes raise ReadOnlyStore)."""
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
        """Flushes the log into LanceDB, stops the background threads, saves the FAISS index and closes every file;
        closing again does nothing."""
        if self._life.closed:
            return
        self._writer.stop()  # LanceDB holds every row again; on failure the rows stay in the log (replayed on open)
        self._upkeep.stop()
        self._index.stop()
        self._life.mark_closed()
        with self._lock:
            self._index.drop()
            self._follower.close()
            self._tables.close()
            if self._wal is not None:
                self._wal.close()
            if self._generations is not None:
                self._generations.close()

    def __enter__(self) -> "ColdStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @contextmanager
    def _read_locked(self, *, flush: bool) -> Iterator[None]:
        """The store's lock, with the view in step with the table and the log. flush: LanceDB serves this read, so
        rows still in the log go into the table first (outside the lock: a flush takes the log's own locks)."""
        if flush:
            self._writer.flush_for_read()
        with self._lock:
            self._life.ensure_open()
            self._follower.sync_locked()
            yield

    # ---- writes --------------------------------------------------------------------------------
    def add(self, *, ids, vectors, namespaces, texts, sessions, roles, created_at_us, metadata,
            new_ids: bool = False) -> Bump | None:
        """Upsert rows by id; durable when this returns (in the write-ahead log or committed to LanceDB); the whole
        batch or nothing. Returns what the write did to the write generations (bumped before it was durable).

        ids: (n,) int64; vectors: (n, dim) float32 unit-norm; namespaces/texts: n str; sessions/roles: n str|None;
        created_at_us: (n,) int64 microseconds since the epoch (UTC); metadata: n dict|None (JSON-serialisable).
        new_ids: True when the caller drew the ids at random for this add (TieredMemory does, 62 bits), so that no
        other process's write holds them: a logged add then need not apply a queue of other processes' records while
        it holds the log's lock (docs/cold-tier.md).
        An id this process's mirror already holds is still handled as an upsert.
        """
        self._life.ensure_open()
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
        if not isinstance(new_ids, bool):
            raise InvalidInput(f"new_ids must be True or False, got {new_ids!r}")
        return self._writer.add(Rows(ids, vectors, created, namespaces, sessions, roles, texts, metadata_json),
                                new_ids=new_ids)

    def add_rows(self, rows: Rows, *, new_ids: bool = False) -> Bump | None:
        """add() of rows whose every value the caller checked (TieredMemory does, once, at its API): distinct int64
        ids, C-contiguous (n, dim) float32 unit rows, valid namespaces, str texts, str or None sessions and roles,
        int64 times, metadata as JSON text (sync.encode_metadata). Nothing is checked again here."""
        self._life.ensure_open()
        self._check_writable()
        return self._writer.add(rows, new_ids=new_ids)

    def flush(self) -> int:
        """Move every logged row (of any process) into LanceDB now; returns how many. Background flushes and close()
        do this anyway; bulk loaders and tests call it to see the table itself."""
        self._life.ensure_open()
        self._check_writable()
        return self._writer.flush_now()

    def delete(self, ids) -> int:
        """Delete rows by id; returns how many existed. Committed when this returns."""
        return self.delete_rows(ids)[0]

    def delete_rows(self, ids) -> tuple[int, Bump | None]:
        """delete(), and what it did to the write generations (None when it deleted nothing, or without them)."""
        self._life.ensure_open()
        self._check_writable()
        ids = check.check_ids(ids, allow_empty=True)
        if ids.size == 0:
            return 0, None
        return self._writer.delete(np.unique(ids))

    # ---- searches ------------------------------------------------------------------------------
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
        self._life.ensure_open()
        query = check.check_query(vector, self._dim)
        k = check.check_k(k)
        namespace = check.check_optional_namespace(namespace)
        where = check.check_where(where)
        excluded = None if exclude_ids is None else check.check_ids(exclude_ids, name="exclude_ids", allow_empty=True)
        if text is not None and not isinstance(text, str):
            raise InvalidInput(f"text must be a str (the query text for hybrid BM25 + vector search) or None, got {type(text).__name__}")
        with self._read_locked(flush=self._searcher.table_serves(where, text)):
            return self._searcher.search_locked(query, k, namespace, where, excluded, text)

    def exact_scan_rows(self, namespace: str | None = None) -> int | None:
        """The rows search(vector, namespace=namespace) reads when it answers by an exact scan of the in-memory
        mirror, or None when it would not (no mirror, LanceDB serves, or FAISS picks the candidates). A hint for a
        caller choosing between this and another exact path: read without the lock, it may be a write behind."""
        self._life.ensure_open()
        namespace = check.check_optional_namespace(namespace)
        return self._searcher.exact_scan_rows(namespace)

    def text_search(self, text: str, *, k: int, namespace: str | None = None, where: str | None = None,
                    exclude_ids=None) -> tuple[np.ndarray, np.ndarray]:
        """BM25 alone over the memory texts: (ids int64, BM25 scores float32), best first, ties by smaller id;
        rows sharing no term with `text` are not returned."""
        self._life.ensure_open()
        if not isinstance(text, str):
            raise InvalidInput(f"text must be a str, got {type(text).__name__}")
        k = check.check_k(k)
        namespace = check.check_optional_namespace(namespace)
        where = check.check_where(where)
        excluded = None if exclude_ids is None else check.check_ids(exclude_ids, name="exclude_ids", allow_empty=True)
        with self._read_locked(flush=self._searcher.text_table_serves(where)):
            return self._searcher.text_search_locked(text, k, namespace, where, excluded)

    def warm_text_index(self) -> None:
        """Builds the BM25 index now, as the first text search would (a store's open does it in the background, so
        that its first search need not)."""
        with self._read_locked(flush=False):
            self._follower.bm25_locked()

    def add_row_listener(self, listener) -> None:
        """listener (rows_logged(rows), rows_deleted(ids), rows_reloaded()) hears of every row change this process's
        follower applies, another process's included; called under the store's lock, so it must not call back in."""
        self._follower.listeners.append(listener)

    def follow(self) -> None:
        """Applies what other processes logged since the last look (a cheap check of the log when nothing was)."""
        self._life.ensure_open()
        with self._read_locked(flush=False):
            pass

    def writes_logged(self, *, rows: int | None = None, delete: bool = False) -> bool:
        """Whether an add of `rows` rows (or, delete=True, a delete) goes through the write-ahead log, so the record
        that carries it (and its bump) reaches every process (see Bump.record_end); else it is committed to LanceDB
        directly and announced by a note."""
        return self._writer.logs(rows=rows, delete=delete)

    def log_reader(self) -> LogFollower | None:
        """A reader of the write-ahead log of its own (LogFollower: seek to a position, poll the records past it,
        each with the bump of the write it carries); None without a log."""
        return None if self._wal is None else LogFollower(self._wal.folder)

    def log_snapshot(self) -> tuple[tuple[int, int] | None, Snapshot | None]:
        """(the log's end position, every write generation) read together under the log's append lock: no write's
        bump is then counted without its record in the log, so a reader that follows the log to that position after
        this has seen every write the snapshot counts. (None, snapshot) without a log, (None, None) without
        generations."""
        gens = self._generations
        if gens is None:
            return None, None
        if self._wal is None or self._read_only:
            return None, gens.snapshot()
        with self._wal.locked():
            return self._wal.end_locked(), gens.snapshot()

    @contextmanager
    def writes_paused(self) -> Iterator[None]:
        """Holds the log's flush and append locks (in their order, re-entrant in this thread): no write of any
        process lands meanwhile, while this thread's own writes go through. For a read-then-write that must not
        interleave with other writers (the expiry sweep); without a log it holds nothing."""
        if self._wal is None or self._read_only:
            yield
            return
        with self._wal.flushing(), self._wal.locked():
            yield

    def log_backlog_bytes(self) -> int:
        """Bytes of write-ahead log records not yet committed to LanceDB (a cheap look, no lock; 0 without a log)."""
        return 0 if self._wal is None else int(self._wal.pending_bytes())

    def ids_where(self, where: str, *, namespace: str | None = None) -> np.ndarray:
        """The ids (int64) of every row (of one namespace) that a LanceDB SQL where filter matches; what a sweep of
        expired memories reads."""
        self._life.ensure_open()
        namespace = check.check_optional_namespace(namespace)
        where = check.check_where(where)
        with self._read_locked(flush=True):
            return self._searcher.matching_ids(namespace, where)

    # ---- reads ---------------------------------------------------------------------------------
    def get(self, ids) -> list[dict | None]:
        """Rows for `ids` in the same order (None where absent): id, namespace, session, role, text,
        created_at_us, metadata (dict), vector ((dim,) float32)."""
        self._life.ensure_open()
        ids = check.check_ids(ids, allow_empty=True)
        if ids.size == 0:
            return []
        if self._tables.lagging_reads:
            # This handle may not see another process's flush yet, while the log no longer holds those rows: read
            # them from the table after a flush of our own, which moves the handle to the latest version.
            self._writer.flush_for_read()
        with self._lock:
            self._life.ensure_open()
            self._follower.sync_locked()  # the log followed to its end: what it holds past the table is known
            rows = self._reads.rows_locked(np.unique(ids))
        return in_order(rows, ids)

    def count(self, namespace: str | None = None) -> int:
        """Rows in the store (of one namespace when given), logged ones included."""
        self._life.ensure_open()
        namespace = check.check_optional_namespace(namespace)
        with self._read_locked(flush=self._follower.mirror is None):
            return self._reads.count_locked(namespace)

    def counts(self, namespaces) -> dict[str, int]:
        """Rows of each of these namespaces, logged ones included, from one read (count() of each would follow the
        log once per namespace)."""
        self._life.ensure_open()
        names = [check.check_optional_namespace(ns) for ns in namespaces]
        with self._read_locked(flush=self._follower.mirror is None):
            return {ns: self._reads.count_locked(ns) for ns in names}

    def count_followed(self) -> int | None:
        """The store's rows as this process last followed them (no read of the log or the table; None without a
        mirror): a hint that may lag behind other processes' latest writes, for a choice that stays exact either
        way (count() is the exact figure)."""
        with self._lock:
            mirror = self._follower.mirror
            return None if mirror is None or self._life.closed else mirror.live_rows

    def namespace_counts(self) -> dict[str, int]:
        """Rows per namespace, logged ones included (namespaces with none left out)."""
        self._life.ensure_open()
        with self._read_locked(flush=self._follower.mirror is None):
            return self._reads.namespace_counts_locked()

    def vectors_of(self, ids) -> dict:
        """The stored rows among ids (absent ones left out), in the form recent() returns; served
        from the in-memory mirror when it is loaded, so promoting rows to the hot tier reads no disk."""
        self._life.ensure_open()
        ids = check.check_ids(ids, allow_empty=True)
        with self._read_locked(flush=self._follower.mirror is None):
            mirror = self._follower.mirror
            if mirror is not None:
                return mirror.rows(ids)
        return as_recent([r for r in self.get(ids) if r is not None], self._dim)

    def recent(self, limit: int, *, namespace: str | None = None) -> dict:
        """Newest rows first (by created_at, then larger id): ids (n,) int64, vectors (n, dim) float32,
        namespace list[str], created_at_us (n,) int64. Used to warm the hot tier."""
        self._life.ensure_open()
        limit = check.check_limit(limit)
        namespace = check.check_optional_namespace(namespace)
        with self._read_locked(flush=self._follower.mirror is None):
            mirror = self._follower.mirror
            if mirror is not None:
                return mirror.recent(limit, namespace)
            chosen = self._reads.recent_ids_locked(limit, namespace)
        return as_recent([r for r in self.get(chosen) if r is not None], self._dim)

    # ---- upkeep --------------------------------------------------------------------------------
    def optimize(self) -> None:
        """Compact now and drop every old version (waits for another process's maintenance to finish)."""
        self._life.ensure_open()
        self._check_writable()
        self._writer.flush_now()
        self._upkeep.compact_now()
        with self._lock:
            self._follower.sync_locked()
        self._rebuild_index()

    def build_index(self) -> None:
        """Build (or retrain) the FAISS index now if the store is past `faiss_min_rows`, and save it; waits for
        a background build in flight. Benchmarks and bulk loaders call this; normal use never needs to."""
        self._life.ensure_open()
        self._rebuild_index()

    def _rebuild_index(self) -> None:
        self._index.wait()
        self._index.build()
        self._index.save(force=True)

    def wait_for_index(self, timeout: float | None = None) -> bool:
        """Block until no FAISS build is running (tests and benchmarks use this)."""
        return self._index.wait(timeout)

    def wait_for_maintenance(self, timeout: float | None = None) -> bool:
        """Block until queued background upkeep has run (tests and benchmarks use this)."""
        return self._upkeep.wait_idle(timeout)

    def stats(self) -> dict:
        """Figures of the table, the search path, the FAISS index, the mirror, upkeep and the log in one dict (the
        log is flushed first, so the table's counts include every row)."""
        self._life.ensure_open()
        self._writer.flush_before_stats()  # the table's figures below then count every row
        with self._lock:
            self._life.ensure_open()
            self._follower.sync_locked()
            table, vector_index = self._tables.figures()
            view = self._follower.figures()
            faiss = self._index.figures()
        return {
            "path": self._path,
            "dim": self._dim,
            **table,
            "search_path": self._index.search_path(view["mirror_rows"], vector_index),
            **faiss,
            **view,
            **self._upkeep.figures(),
            "wal": self._wal is not None,
            "wal_generation": self._follower.log_generation,
            **self._writer.figures(),
        }
