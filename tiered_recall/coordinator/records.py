"""What the store hands back (Memory, Hit, SearchReport), this process's cache of them, and per-path latency stats."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterable

import numpy as np

METADATA_CACHE_ROWS = 200_000


# Where a memory's expiry is kept: two keys of its stored metadata, which Memory and Hit hand back as expires_at and
# ttl_s, not as metadata.
EXPIRES_KEY = "_tr_expires_at_us"
TTL_KEY = "_tr_ttl_s"


@dataclass(frozen=True)
class Memory:
    """One stored memory as `get` returns it; expires_at and ttl_s are None for a memory that never expires."""

    id: int
    text: str
    namespace: str
    session: str | None
    role: str | None
    created_at: datetime
    metadata: dict = field(default_factory=dict)
    expires_at: datetime | None = None
    ttl_s: float | None = None

    def expired(self, now_us: int) -> bool:
        """True when the memory's time to live has run out at now_us (microseconds since the epoch)."""
        return self.expires_at is not None and self.expires_at.timestamp() * 1e6 <= now_us

    @property
    def stored_metadata(self) -> dict:
        """The metadata as the cold tier stores it: the user's, plus the expiry keys."""
        if self.expires_at is None:
            return dict(self.metadata)
        return {**self.metadata, EXPIRES_KEY: int(round(self.expires_at.timestamp() * 1e6)), TTL_KEY: self.ttl_s}


@dataclass(frozen=True)
class Hit:
    """One search result; `tier` says which tier served it ("hot" or "cold")."""

    id: int
    text: str
    score: float
    tier: str
    namespace: str
    session: str | None
    role: str | None
    created_at: datetime
    metadata: dict = field(default_factory=dict)
    expires_at: datetime | None = None
    ttl_s: float | None = None


@dataclass(frozen=True)
class SearchReport:
    """What search(..., explain=True) returns: the hits and how the answer was decided.

    rule: "complete" (rule 1: the hot tier holds the whole namespace), "bound" (rule 2: no cold
    row can reach the top k), "threshold" (rule 3: hot k-th score >= confidence), "cold" (the
    cold tier was searched and merged), "no-hot" (no hot tier, or a where filter: cold only), or
    "hybrid" (BM25 fused with the vector ranking, by the cold tier).
    hot_kth: the hot k-th (final) score or None; cold_bound: the best score a cold-only row could
    reach (rule 2), None when not evaluated.
    """

    hits: list
    rule: str
    path: str
    hot_kth: float | None
    cold_bound: float | None
    seconds: float

    def __iter__(self):
        """The hits, best first: a report reads like the list search() returns without explain."""
        return iter(self.hits)

    def __len__(self) -> int:
        return len(self.hits)

    def __getitem__(self, index):
        return self.hits[index]


def to_datetime(us: int) -> datetime:
    """A UTC datetime from microseconds since the epoch."""
    return datetime.fromtimestamp(us / 1e6, tz=timezone.utc)


def memory_of(row: dict) -> Memory:
    """A Memory from a cold-tier row (ColdStore.get)."""
    return make_memory(int(row["id"]), row["text"], row["namespace"], row["session"], row["role"],
                       int(row["created_at_us"]), row["metadata"] or {})


def make_memory(memory_id: int, text: str, namespace: str, session: str | None, role: str | None,
                created_at_us: int, stored_metadata: dict) -> Memory:
    """A Memory from its stored fields, the expiry keys taken out of the metadata."""
    if EXPIRES_KEY not in stored_metadata:
        return Memory(memory_id, text, namespace, session, role, to_datetime(created_at_us), stored_metadata)
    metadata = {k: v for k, v in stored_metadata.items() if k not in (EXPIRES_KEY, TTL_KEY)}
    return Memory(memory_id, text, namespace, session, role, to_datetime(created_at_us), metadata,
                  to_datetime(int(stored_metadata[EXPIRES_KEY])), stored_metadata.get(TTL_KEY))


def hit_of(memory: Memory, score: float, tier: str) -> Hit:
    """The Hit of a memory with its score and the tier ("hot" or "cold") that served it."""
    return Hit(memory.id, memory.text, score, tier, memory.namespace, memory.session, memory.role, memory.created_at,
               memory.metadata, memory.expires_at, memory.ttl_s)


class PathStats:
    """Latencies per search path (or rule), kept in this process (bounded)."""

    def __init__(self, keep: int = 10_000) -> None:
        self.keep = keep
        self.samples: dict[str, list[float]] = {}
        self.counts: dict[str, int] = {}

    def record(self, path: str, seconds: float) -> None:
        """Adds one search's latency to path (the newest `keep` samples are kept; counts are not bounded)."""
        bucket = self.samples.setdefault(path, [])
        bucket.append(seconds)
        if len(bucket) > self.keep:
            del bucket[: len(bucket) - self.keep]
        self.counts[path] = self.counts.get(path, 0) + 1

    def summary(self) -> dict:
        """Per path: searches, p50_us and p99_us over the samples kept."""
        out = {}
        for path, values in self.samples.items():
            arr = np.asarray(values) * 1e6
            out[path] = {"searches": self.counts[path], "p50_us": float(np.percentile(arr, 50)),
                         "p99_us": float(np.percentile(arr, 99))}
        return out


class MemoryCache:
    """Texts and metadata of rows this process wrote or searches returned, newest kept (METADATA_CACHE_ROWS), so a
    hot answer needs no disk read; the cold tier fills what is missing."""

    def __init__(self, cold, limit: int = METADATA_CACHE_ROWS) -> None:
        self._cold = cold
        self._limit = limit
        self._rows: OrderedDict[int, Memory] = OrderedDict()

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, row_id: int) -> bool:
        return row_id in self._rows

    def remember(self, memory: Memory) -> None:
        """Caches a memory as the newest; the oldest is dropped past the limit."""
        self._rows[memory.id] = memory
        self._rows.move_to_end(memory.id)
        if len(self._rows) > self._limit:
            self._rows.popitem(last=False)

    def clear(self) -> None:
        """Forgets every cached memory."""
        self._rows.clear()

    def drop(self, ids: Iterable[int]) -> None:
        """Forgets the memories of ids (deleted rows); ids not cached are ignored."""
        for i in ids:
            self._rows.pop(int(i), None)

    def keep_only(self, live_ids: np.ndarray) -> None:
        """Drops cached memories whose rows are gone (deleted by another process; this process's own deletes drop
        theirs at once): nothing else removes them before the cache is full, so a long-lived process among other
        writers would keep every row any search ever showed it."""
        if not self._rows:
            return
        cached = np.fromiter(self._rows.keys(), dtype=np.int64, count=len(self._rows))
        for i in cached[~np.isin(cached, live_ids)].tolist():
            del self._rows[i]

    def lookup(self, ids: Iterable[int]) -> dict[int, Memory]:
        """The memories of `ids` that exist (cached, else read from the cold tier)."""
        ids = [int(i) for i in ids]
        rows = self._rows
        found = {i: rows[i] for i in ids if i in rows}
        missing = [i for i in ids if i not in found]
        if missing:
            for row in self._cold.get(missing):
                if row is None:
                    continue
                memory = memory_of(row)
                self.remember(memory)
                found[memory.id] = memory
        return found
