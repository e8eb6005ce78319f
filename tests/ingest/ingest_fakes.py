"""An in-memory stand-in for TieredMemory with the surface ingestion uses (embedder, add, get)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from tiered_recall.embedders import Embedder
from tiered_recall.errors import InvalidInput


@dataclass
class FakeMemoryRecord:
    id: int
    text: str
    namespace: str
    session: str | None
    role: str | None
    created_at: datetime | None
    metadata: dict[str, Any]
    vector: np.ndarray = field(repr=False)


def _per_row(value: Any, count: int) -> list[Any]:
    if isinstance(value, list):
        if len(value) != count:
            raise InvalidInput(f"expected {count} values, got {len(value)}")
        return value
    return [value] * count


class FakeMemory:
    """Upsert by id, all-or-nothing per add (everything is checked before anything is written)."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.records: dict[int, FakeMemoryRecord] = {}
        self.add_calls = 0
        self.fail_on_add: int | None = None  # raise on this add call number (1-based) to simulate a crash

    def add(self, texts: list[str], *, vectors: np.ndarray | None = None, namespace: str,
            ids: Sequence[int] | None = None, session: Any = None, role: Any = None, metadata: Any = None,
            created_at: Any = None) -> list[int]:
        self.add_calls += 1
        if self.fail_on_add == self.add_calls:
            raise RuntimeError("simulated crash inside add")
        count = len(texts)
        if vectors is None:
            vectors = self.embedder(texts)
        assert vectors.shape == (count, self.embedder.dim) and vectors.dtype == np.float32
        assert ids is not None and len(ids) == count and len(set(ids)) == count
        assert all(isinstance(i, int) and 0 < i < 2**63 for i in ids)
        rows = zip(ids, texts, vectors, _per_row(session, count), _per_row(role, count),
                   _per_row(metadata, count), _per_row(created_at, count))
        staged = [FakeMemoryRecord(i, t, namespace, s, r, c, dict(m or {}), v.copy()) for i, t, v, s, r, m, c in rows]
        for record in staged:
            self.records[record.id] = record
        return list(ids)

    def get(self, ids: Sequence[int]) -> list[FakeMemoryRecord | None]:
        return [self.records.get(i) for i in ids]

    def search(self, query: str, *, k: int, namespace: str) -> list[FakeMemoryRecord]:
        members = [r for r in self.records.values() if r.namespace == namespace]
        if not members:
            return []
        matrix = np.stack([r.vector for r in members])
        scores = matrix @ self.embedder([query])[0]
        return [members[i] for i in np.argsort(-scores, kind="stable")[:k]]


class SqliteMemory:
    """A durable fake: every add is one SQLite transaction (all-or-nothing, durable on return).

    Used to SIGKILL an ingest run in a subprocess and check that a re-run ends exactly like a clean run.
    add_delay_s slows each add so the test can kill the process between batches.
    """

    def __init__(self, path: str, embedder: Embedder, *, add_delay_s: float = 0.0) -> None:
        import sqlite3

        self.embedder = embedder
        self.add_delay_s = add_delay_s
        # ingest writes on its writer thread and reads on the caller's (MemorySink)
        self.connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.connection.execute("PRAGMA journal_mode=WAL")
        self.connection.execute("PRAGMA synchronous=FULL")
        self.connection.execute(
            "CREATE TABLE IF NOT EXISTS memories (id INTEGER PRIMARY KEY, text TEXT, namespace TEXT, "
            "session TEXT, role TEXT, created_at TEXT, metadata TEXT, vector BLOB)"
        )

    def add(self, texts: list[str], *, vectors: np.ndarray | None = None, namespace: str,
            ids: Sequence[int] | None = None, session: Any = None, role: Any = None, metadata: Any = None,
            created_at: Any = None) -> list[int]:
        import json
        import time

        count = len(texts)
        assert vectors is not None and ids is not None
        rows = [
            (i, t, namespace, s, r, c.isoformat() if c else None, json.dumps(m or {}, sort_keys=True), v.tobytes())
            for i, t, v, s, r, m, c in zip(ids, texts, vectors, _per_row(session, count), _per_row(role, count),
                                           _per_row(metadata, count), _per_row(created_at, count))
        ]
        self.connection.execute("BEGIN IMMEDIATE")
        self.connection.executemany("INSERT OR REPLACE INTO memories VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
        if self.add_delay_s:
            time.sleep(self.add_delay_s)  # inside the transaction: a kill here must leave nothing
        self.connection.execute("COMMIT")
        return list(ids)

    def get(self, ids: Sequence[int]) -> list[FakeMemoryRecord | None]:
        import json

        found = {}
        for row in self.connection.execute(
            f"SELECT id, text, namespace, session, role, created_at, metadata, vector FROM memories "
            f"WHERE id IN ({','.join('?' * len(ids))})", list(ids),
        ):
            found[row[0]] = FakeMemoryRecord(row[0], row[1], row[2], row[3], row[4], row[5], json.loads(row[6]),
                                             np.frombuffer(row[7], dtype=np.float32))
        return [found.get(i) for i in ids]

    def snapshot(self) -> list[tuple]:
        return list(self.connection.execute(
            "SELECT id, text, namespace, session, role, created_at, metadata, vector FROM memories ORDER BY id"))

    def close(self) -> None:
        self.connection.close()
