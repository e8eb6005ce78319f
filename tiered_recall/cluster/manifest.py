"""The directory's durable state: a JSON manifest kept as versioned rows of a LanceDB table in the cluster's storage
(so s3://, gs://, az:// and folders alike), written as a compare-and-set on its version: the first row committed for
a version wins (LanceDB commits with a conditional put), a writer that finds another's row first fails."""
from __future__ import annotations

import json
import time
import uuid
from typing import Any

from ..errors import TieredRecallError
from .config import ClusterConfig
from .objectstore import connect, guarded

TABLE = "manifest"
FORMAT = 1
# Manifest rows kept behind the newest (older ones are deleted now and then, with the table versions they made).
_KEEP_ROWS = 32
_PRUNE_EVERY = 64


class ManifestConflict(TieredRecallError):
    """Another writer wrote this version of the manifest first: two directories over one storage prefix (two Ray
    clusters started with the same storage). Stop one of them."""


def _schema():
    import pyarrow as pa

    return pa.schema([("version", pa.int64()), ("writer", pa.string()), ("written_at", pa.float64()),
                      ("body", pa.string())])


class ManifestStore:
    """The manifest rows of one cluster (`<storage>/_cluster/manifest`)."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.writer = uuid.uuid4().hex
        self._db = connect(config.directory_uri, config, consistent=True)
        self._writes = 0

        def open_or_create():
            try:
                return self._db.open_table(TABLE)
            except (FileNotFoundError, ValueError):
                return self._db.create_table(TABLE, schema=_schema(), exist_ok=True)

        self._table = guarded(f"open the cluster manifest at {config.directory_uri}", config, open_or_create)

    def _rows(self, where: str | None, columns: list[str]):
        """The rows (of `where`) in commit order: row ids grow with each append's fragment."""
        def read():
            query = self._table.search().with_row_id(True).select(columns).limit(None)
            return (query.where(where) if where else query).to_arrow().sort_by("_rowid")
        return guarded("read the cluster manifest", self.config, read)

    def _first_writer(self, version: int) -> str | None:
        writers = self._rows(f"version = {version}", ["writer"]).column("writer").to_pylist()
        return writers[0] if writers else None

    def load(self) -> tuple[int, dict[str, Any]] | None:
        """(version, body) of the newest manifest, or None when none was ever written."""
        versions = self._rows(None, ["version"]).column("version").to_pylist()
        if not versions:
            return None
        newest = max(versions)
        # The first row committed for a version is the one that counts.
        body = self._rows(f"version = {newest}", ["body"]).column("body")[0].as_py()
        return newest, json.loads(body)

    def write(self, expected: int, body: dict[str, Any]) -> int:
        """Writes version expected + 1; ManifestConflict when another writer's row for it came first."""
        import pyarrow as pa

        version = expected + 1
        row = pa.Table.from_pylist([{"version": version, "writer": self.writer, "written_at": time.time(),
                                     "body": json.dumps({**body, "format": FORMAT}, sort_keys=True)}],
                                   schema=_schema())
        guarded("write the cluster manifest", self.config, lambda: self._table.add(row))
        if self._first_writer(version) != self.writer:
            try:  # this row lost: take it out, so one row remains for each version
                self._table.delete(f"version = {version} AND writer = '{self.writer}'")
            except Exception:  # a stray row loses again wherever it is read: load() takes a version's first row
                pass
            raise ManifestConflict(
                f"another directory wrote version {version} of the manifest at {self.config.directory_uri} first: two "
                "clusters use one storage prefix; stop the other (`tiered-recall cluster down` on its Ray), or give "
                "this one its own storage")
        self._writes += 1
        if self._writes % _PRUNE_EVERY == 0:
            self._prune(version)
        return version

    def _prune(self, version: int) -> None:
        try:
            self._table.delete(f"version < {version - _KEEP_ROWS}")
            from datetime import timedelta

            self._table.optimize(cleanup_older_than=timedelta(seconds=60))
        except Exception:  # a prune that fails leaves old rows behind: tried again later
            pass
