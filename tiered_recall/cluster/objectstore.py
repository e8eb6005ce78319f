"""The cluster's own use of object storage through LanceDB (the shards' tables are the cold tier's business): the
connection, failures turned into errors that name the fix without a credential in them, and the staging tables that
carry a namespace's rows from one shard to another."""
from __future__ import annotations

import json
import re
from typing import Any, Callable, TypeVar

import numpy as np

from ..errors import StorageError, TieredRecallError
from .config import ClusterConfig
from .redaction import redact

T = TypeVar("T")
_DETAIL_CHARS = 400
# What an object store says when it refuses the credentials: its error codes, or an HTTP status 401 / 403 named as a
# status (never the digits of a port number, or of a time such as "in 403.8ms" in an unreachable store's retries).
_REFUSED_CREDENTIALS = re.compile(r"signaturedoesnotmatch|invalidaccesskeyid|accessdenied|forbidden|unauthorized|"
                                  r"invalidtoken|expiredtoken|authorization|"
                                  r"\b(?:status|statuscode|http)\W{0,3}40[13](?![\d.])")


def lancedb_module():
    """The lancedb module, imported on first use."""
    import lancedb  # imported on first use, as the cold tier does

    return lancedb


def storage_hint(text: str, config: ClusterConfig) -> str:
    """The fix for an object-store failure, read from its text."""
    lowered = text.lower()
    endpoint = config.storage_options.get("aws_endpoint") or config.storage_options.get("endpoint")
    where = f"the object store at {endpoint}" if endpoint else f"the object store of {config.storage}"
    if endpoint:  # its port or address may hold a status code's digits (127.0.0.1:40113)
        lowered = lowered.replace(str(endpoint).lower(), "")
    if _REFUSED_CREDENTIALS.search(lowered):
        return (f"{where} refused the credentials: check the keys (storage options aws_access_key_id / "
                "aws_secret_access_key, or the AWS_* / GOOGLE_* / AZURE_* environment of every node)")
    if "nosuchbucket" in lowered or "bucket does not exist" in lowered or "specified bucket" in lowered:
        return f"the bucket of {config.storage} does not exist: create it, or point storage at one that does"
    if any(word in lowered for word in ("connect", "connection refused", "dns error", "timed out", "timeout",
                                        "unreachable", "error sending request")):
        return (f"{where} cannot be reached: check the endpoint (storage option aws_endpoint=http://HOST:PORT, with "
                "allow_http=true for http) and that the store is up and reachable from every node")
    if "http" in lowered and "allow_http" in lowered:
        return "the endpoint is http://: add the storage option allow_http=true"
    return f"{where} failed"


def storage_error(what: str, config: ClusterConfig, exc: BaseException) -> StorageError:
    """A StorageError for a failed object-store operation: the fix first, then what failed, credentials masked."""
    detail = redact(f"{type(exc).__name__}: {exc}", config.secrets())
    if len(detail) > _DETAIL_CHARS:
        detail = detail[:_DETAIL_CHARS] + "..."
    return StorageError(f"{storage_hint(str(exc), config)} (while trying to {what}; {detail})")


def guarded(what: str, config: ClusterConfig, fn: Callable[[], T]) -> T:
    """fn(); a failure other than the package's own errors becomes storage_error()."""
    try:
        return fn()
    except TieredRecallError:
        raise
    except Exception as exc:
        raise storage_error(what, config, exc) from None


def connect(uri: str, config: ClusterConfig, *, consistent: bool = False):
    """A LanceDB connection to a folder of the cluster's storage; consistent: every read sees the latest commit of
    any writer (else a table handle reads the version it opened)."""
    from datetime import timedelta

    options = config.storage_options.plain() or None
    interval = timedelta(0) if consistent else None
    return guarded(f"connect to {uri}", config,
                   lambda: lancedb_module().connect(uri, storage_options=options, read_consistency_interval=interval))


def _move_schema(dim: int):
    import pyarrow as pa

    return pa.schema([
        ("id", pa.int64()), ("namespace", pa.string()), ("text", pa.string()), ("session", pa.string()),
        ("role", pa.string()), ("created_at_us", pa.int64()), ("metadata", pa.string()),
        ("expires_at_us", pa.int64()), ("ttl_s", pa.float64()), ("vector", pa.list_(pa.float32(), dim)),
    ])


def _us(value) -> int | None:
    return None if value is None else int(round(value.timestamp() * 1e6))


class MoveStaging:
    """Tables under the cluster's storage (_moves/) that hold the rows of namespaces on their way from one shard to
    another: the old owner writes them, the new one reads them, the directory drops them once the move is done."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self._db = connect(config.moves_uri, config)

    def write(self, name: str, memories: list, vectors: list, dim: int) -> None:
        """Stages memories (tiered_recall Memory objects) with their vectors, replacing a table of that name."""
        import pyarrow as pa

        schema = _move_schema(dim)
        columns: dict[str, list[Any]] = {f.name: [] for f in schema}
        for memory, vector in zip(memories, vectors):
            columns["id"].append(memory.id)
            columns["namespace"].append(memory.namespace)
            columns["text"].append(memory.text)
            columns["session"].append(memory.session)
            columns["role"].append(memory.role)
            columns["created_at_us"].append(_us(memory.created_at))
            columns["metadata"].append(json.dumps(memory.metadata or {}))
            columns["expires_at_us"].append(_us(memory.expires_at))
            columns["ttl_s"].append(memory.ttl_s)
            columns["vector"].append(np.asarray(vector, dtype=np.float32))
        table = pa.Table.from_pydict(columns, schema=schema)
        guarded(f"stage {len(memories)} memories for a move", self.config,
                lambda: self._db.create_table(name, data=table, mode="overwrite"))

    def read(self, name: str) -> dict[str, Any]:
        """The staged rows as columns (numpy for id, times and vectors; lists for the rest)."""
        table = guarded("read the rows staged for a move", self.config,
                        lambda: self._db.open_table(name).to_arrow())
        out: dict[str, Any] = {column: table.column(column).to_pylist()
                               for column in ("namespace", "text", "session", "role", "metadata", "expires_at_us",
                                              "ttl_s")}
        out["id"] = table.column("id").to_numpy()
        out["created_at_us"] = table.column("created_at_us").to_numpy()
        flat = table.column("vector").combine_chunks()
        dim = flat.type.list_size
        out["vector"] = np.asarray(flat.values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, dim) \
            if len(flat) else np.empty((0, dim), np.float32)
        return out

    def drop(self, name: str) -> None:
        """Drops a staging table (nothing when it is gone already)."""
        def drop() -> None:
            try:
                self._db.drop_table(name)
            except (FileNotFoundError, ValueError):
                pass
        guarded("drop a move's staging table", self.config, drop)
