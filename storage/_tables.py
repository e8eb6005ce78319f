"""The cold tier's LanceDB side: the connection and table handles, reconnects, and LanceDB failures as StorageError."""
from __future__ import annotations

import time
from datetime import timedelta
from typing import Callable, TypeVar

from ..errors import InvalidInput, StorageError, TieredRecallError
from ._schema import TABLE_NAME, VECTOR_COLUMN, memory_schema, schema_dim

T = TypeVar("T")

_COMMIT_RETRIES = 5
# LanceDB caches metadata for every table version a process sees (up to 1 GiB by default), so a long-lived process
# grows with every commit other processes make. The mirror answers this store's reads, so a small cache loses nothing.
_LANCE_METADATA_CACHE_BYTES = 4 << 20
# LanceDB's index cache keeps one entry per table version a connection works on, never evicted below its cap, so a
# long-lived writer on a busy shared store grows without end. Capping that cache would evict the real indices of big
# tables (BTREE on id, IVF_PQ) long before it bounded those entries; instead maintenance opens a new connection (both
# caches empty) once the table is this many versions past the one the connection was opened at.
_LANCE_RECONNECT_VERSIONS = 5_000


# LanceDB imports lance_namespace, which takes the models of the generated REST namespace client from this package;
# the package's own __init__ also imports every API class of that client (pydantic validate_call over hundreds of
# methods): more than half of `import lancedb`, for a client a store in a folder or a bucket never calls.
_REST_CLIENT = "lance_namespace_urllib3_client"


def _defer_rest_client() -> None:
    """Registers the REST client's package without running its __init__: its submodules (the models lance_namespace
    imports) load as usual, and the first read of a name of the package itself runs the __init__ then."""
    import importlib.util
    import sys

    if _REST_CLIENT in sys.modules:
        return
    spec = importlib.util.find_spec(_REST_CLIENT)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return  # not installed as a package: lancedb's import says what is missing
    package = importlib.util.module_from_spec(spec)

    def load_on_first_use(name: str):
        del package.__dict__["__getattr__"]
        spec.loader.exec_module(package)
        return getattr(package, name)

    package.__getattr__ = load_on_first_use
    sys.modules[_REST_CLIENT] = package


def lancedb():
    """The lancedb module, imported on first use so that LANCE_CPU_THREADS set by the caller takes effect before
    LanceDB's runtime starts, with the REST namespace client's API classes left until something uses them."""
    _defer_rest_client()
    import lancedb as _lancedb
    return _lancedb


def is_conflict(exc: BaseException) -> bool:
    """True when a LanceDB failure reads like a commit conflict another writer caused (worth retrying)."""
    text = str(exc).lower()
    return "conflict" in text or "retryable" in text


def is_vanished_version(exc: BaseException) -> bool:
    """A read that listed or opened a table version which another process's cleanup deleted meanwhile."""
    text = str(exc)
    return "Not found" in text and ".manifest" in text


def retry(fn: Callable[[], T], transient: Callable[[BaseException], bool], pause_s: float) -> T:
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


def storage_message(what: str, path: str, exc: BaseException) -> str:
    """The failure, led by the fix where the cause is known (nothing of the failed write was kept)."""
    detail = f"failed to {what} at {path}: {type(exc).__name__}: {exc}"
    lowered = str(exc).lower()
    if "no space left" in lowered or "os error 28" in lowered:
        return f"cold tier: the disk is full: free space or move the store (nothing of this write was kept); {detail}"
    if "permission denied" in lowered or "os error 13" in lowered:
        return f"cold tier: this user cannot write the store: fix the folder's owner or permissions; {detail}"
    return f"cold tier: {detail}"


def guard(path: str, what: str, fn: Callable[[], T]) -> T:
    """Run a LanceDB/OS call; failures become StorageError saying what was being done."""
    try:
        return fn()
    except TieredRecallError:
        raise
    except Exception as exc:  # LanceDB raises OSError, RuntimeError, ValueError, ... for storage failures
        raise StorageError(storage_message(what, path, exc)) from exc


def same_rows(before: dict, after: dict) -> bool:
    """From two consecutive versions' summaries: the later kept the rows as they were (same live rows, no more data
    rows, no more deleted rows). Inserts, deletes and updates all fail this."""
    try:
        return (int(after["total_rows"]) == int(before["total_rows"])
                and int(after["total_data_file_rows"]) <= int(before["total_data_file_rows"])
                and int(after["total_deletion_file_rows"]) <= int(before["total_deletion_file_rows"]))
    except (KeyError, ValueError):
        return False


def version_summaries(table) -> dict[int, dict]:
    """Each kept table version's summary (list_versions(): one listing of the table's _versions)."""
    return {v["version"]: v.get("metadata") or {} for v in table.list_versions()}


def row_keeping_versions(summaries: dict[int, dict], start: int) -> list[int]:
    """The listed versions after `start` that kept the rows of the version before them (compactions, index builds)."""
    out = []
    for v in range(start + 1, max(summaries, default=start) + 1):
        before, after = summaries.get(v - 1), summaries.get(v)
        if before and after and same_rows(before, after):
            out.append(v)
    return out


class LanceTables:
    """The LanceDB connection of one store. `table` serves reads and the writes that bypass the log; flushes and
    maintenance commit outside the store's lock, each through a handle of its own (opened on first use). Every
    handle is replaced by reconnect()."""

    def __init__(self, path: str, dim: int, *, read_only: bool, read_consistency_interval_s: float,
                 uri: str | None = None, storage_options: dict[str, str] | None = None) -> None:
        self.path = path  # the store's local folder: its locks, log and messages
        # Where LanceDB keeps the table: the folder itself, or an object store (s3://, gs://, az://) with the options
        # LanceDB takes for it (endpoint, region, keys); the log, mirror and locks stay in the local folder.
        self.uri = uri or path
        self._storage_options = dict(storage_options) if storage_options else None
        self.dim = dim
        self.read_only = read_only
        self._read_interval = timedelta(seconds=float(read_consistency_interval_s))
        # A handle may then lag behind other processes' commits (and the mirror loaded from a newer one).
        self.lagging_reads = read_consistency_interval_s > 0
        self.reconnects = 0
        self.db = self._connect()
        self.table = self._open_or_create()
        self.connected_at_version = self.table.version
        self.schema = self.table.schema  # fetched once: each .schema call is a round trip into LanceDB
        self._flush_table = None
        self._maintenance_table = None

    def guard(self, what: str, fn: Callable[[], T]) -> T:
        """fn(), its failures raised as StorageError saying what was being done (see guard())."""
        return guard(self.path, what, fn)

    def commit(self, what: str, fn: Callable[[], T]) -> T:
        """A write that may race with compaction or another process: retried on commit conflicts (the writes are
        idempotent)."""
        return self.guard(what, lambda: retry(fn, is_conflict, 0.01))

    def _connect(self):
        session = lancedb().Session(metadata_cache_size_bytes=_LANCE_METADATA_CACHE_BYTES)
        return self.guard("connect to LanceDB", lambda: lancedb().connect(
            self.uri, read_consistency_interval=self._read_interval, session=session,
            storage_options=self._storage_options))

    def _open_or_create(self):
        def open_or_create():
            try:
                return self.db.open_table(TABLE_NAME)
            except (FileNotFoundError, ValueError):
                if self.read_only:
                    raise InvalidInput(f"no memories table in {self.path}: a read-only store must exist (open it "
                                       "writable once to create it)") from None
                # exist_ok covers a concurrent creator; the dim check below catches a mismatch either way.
                return self.db.create_table(TABLE_NAME, schema=memory_schema(self.dim), exist_ok=True)
        table = self.guard("open or create the table", open_or_create)
        found = schema_dim(table.schema)
        if found != self.dim:
            raise InvalidInput(
                f"the cold store at {self.path} holds vectors of dim {found}, but dim={self.dim} was requested; "
                f"open it with dim={found} or use another folder")
        return table

    def open_table(self):
        """A fresh handle on the table's latest version (a mirror load pins it)."""
        return self.db.open_table(TABLE_NAME)

    @property
    def flush_table(self):
        """The handle the log's flushes commit through (opened on first use)."""
        if self._flush_table is None:
            self._flush_table = self.guard("open the table", self.open_table)
        return self._flush_table

    @property
    def maintenance_table(self):
        """The handle compaction and index builds commit through (opened on first use)."""
        if self._maintenance_table is None:
            self._maintenance_table = self.open_table()
        return self._maintenance_table

    def reconnect_due(self, latest: int) -> bool:
        """True once the table is _LANCE_RECONNECT_VERSIONS versions past the one this connection opened at, so its
        caches have grown enough for reconnect()."""
        return latest - self.connected_at_version >= _LANCE_RECONNECT_VERSIONS

    def reconnect(self) -> None:
        """A new connection, with empty caches, and new handles. The caller holds the flush lock (no flush or direct
        write commits meanwhile) and the store's lock (no read or write uses the table); the old connection's caches
        go with its last handle."""
        db = self._connect()
        table = self.guard("open the table", lambda: db.open_table(TABLE_NAME))
        self.db, self.table = db, table
        self._flush_table = None
        self._maintenance_table = None
        self.connected_at_version = table.version
        self.reconnects += 1

    def vector_index_type(self) -> str | None:
        """The type of the table's vector index as LanceDB names it, or None without one."""
        for idx in self.table.list_indices():
            if tuple(idx.columns) == (VECTOR_COLUMN,):
                return str(idx.index_type)
        return None

    def figures(self) -> tuple[dict, str | None]:
        """stats()'s figures of the table, and the type of its vector index (None without one)."""
        table = self.table

        def collect():
            table_stats, versions = table.stats(), len(table.list_versions())
            indices = [{"columns": list(i.columns), "type": str(i.index_type), "name": i.name}
                       for i in table.list_indices()]
            return table_stats, versions, indices, table.version

        # Another process's maintenance may delete old versions while this lists them: list again.
        table_stats, versions, indices, version = self.guard(
            "read table statistics", lambda: retry(collect, is_vanished_version, 0.01))
        fragments = table_stats.get("fragment_stats", {})
        vector_index = next((i["type"] for i in indices if i["columns"] == [VECTOR_COLUMN]), None)
        return {
            "rows": int(table_stats.get("num_rows", 0)),
            "bytes": int(table_stats.get("total_bytes", 0)),
            "fragments": int(fragments.get("num_fragments", 0)),
            "small_fragments": int(fragments.get("num_small_fragments", 0)),
            "versions": versions,
            "table_version": version,
            "indices": indices,
            "index_kind": vector_index or "none",
        }, vector_index

    def close(self) -> None:
        """Drops every handle and the connection."""
        self.table = self.db = None
        self._flush_table = self._maintenance_table = None
