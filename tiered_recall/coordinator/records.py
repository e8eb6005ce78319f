"""What the store hands back (Memory, Hit, SearchReport), this process's cache of them, and per-path latency stats."""
from __future__ import annotations

import json
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable

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
    """One search result; `tier` says which tier served it ("hot" or "cold"), `shard` which shard of a cluster did
    (None outside a cluster)."""

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
    shard: str | None = None


@dataclass(frozen=True)
class SearchReport:
    """What search(..., explain=True) returns: the hits and how the answer was decided.

    rule: "complete" (rule 1: the hot tier holds the whole namespace), "bound" (rule 2: no cold
    row can reach the top k), "threshold" (rule 3: hot k-th score >= confidence), "cold" (the
    cold tier was searched and merged), "no-spare-core" (a CPU sidecar with no core to spare: the cold tier's
    in-memory copy answered a small scope alone), "no-hot" (no hot tier, or a where filter: cold only), or
    "hybrid" (BM25 fused with the vector ranking, by the cold tier).
    hot_kth: the hot k-th (final) score or None; cold_bound: the best score a cold-only row could
    reach (rule 2), None when not evaluated. stages: the retrieval stages (a tiered_recall.Stages) that re-ranked an
    exact pool of candidates, whose rule and path these are; None for a search without them.
    """

    hits: list
    rule: str
    path: str
    hot_kth: float | None
    cold_bound: float | None
    seconds: float
    stages: Any = None

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


_new_object = object.__new__
_set_attribute = object.__setattr__


def hit_of(memory: Memory, score: float, tier: str) -> Hit:
    """The Hit of a memory with its score and the tier ("hot" or "cold") that served it. Built from the memory's own
    attribute dict, not through Hit(...): a frozen dataclass's __init__ sets each of its eleven fields through
    object.__setattr__, which made building the hits the largest cost of a hot search after the hot tier itself.
    The Hit is the same (fields, equality, repr)."""
    fields = memory.__dict__.copy()
    fields["score"] = score
    fields["tier"] = tier
    hit = _new_object(Hit)
    _set_attribute(hit, "__dict__", fields)
    return hit


class PathStats:
    """Latencies per search path (or rule), kept in this process (bounded)."""

    def __init__(self, keep: int = 10_000) -> None:
        self.keep = keep
        self.samples: dict[str, deque[float]] = {}
        self.counts: dict[str, int] = {}

    def record(self, path: str, seconds: float) -> None:
        """Adds one search's latency to path (the newest `keep` samples are kept; counts are not bounded)."""
        bucket = self.samples.get(path)
        if bucket is None:
            bucket = self.samples[path] = deque(maxlen=self.keep)
        bucket.append(seconds)
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
    """Texts and metadata of rows this process wrote, searches returned or other processes logged, newest kept
    (METADATA_CACHE_ROWS), so a hot answer needs no disk read; the cold tier fills what is missing. It listens to the
    cold tier's follower (ColdStore.add_row_listener): a row another process replaced is replaced here, a deleted one
    dropped, and a reload of the table (a write that bypassed the log) empties it, so it never hands back an old
    text or metadata."""

    def __init__(self, cold, limit: int = METADATA_CACHE_ROWS) -> None:
        self._cold = cold
        self._limit = limit
        # id -> Memory, or the fields of a logged row (text, namespace, session, role, created_at_us, metadata JSON)
        # until a lookup makes it one
        self._rows: OrderedDict[int, Memory | tuple] = OrderedDict()
        self._lock = threading.RLock()  # the follower calls in from whichever thread syncs the cold tier
        self._warming: set[int] | None = None  # while warm() runs: the ids deleted since it began reading
        self._warm_abandoned = False
        if hasattr(cold, "add_row_listener"):
            cold.add_row_listener(self)

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, row_id: int) -> bool:
        return row_id in self._rows

    def remember(self, memory: Memory) -> None:
        """Caches a memory as the newest; the oldest is dropped past the limit."""
        with self._lock:
            self._rows[memory.id] = memory
            self._rows.move_to_end(memory.id)
            if len(self._rows) > self._limit:
                self._rows.popitem(last=False)

    def clear(self) -> None:
        """Forgets every cached memory."""
        with self._lock:
            self._rows.clear()

    def drop(self, ids: Iterable[int]) -> None:
        """Forgets the memories of ids (deleted rows); ids not cached are ignored."""
        with self._lock:
            for i in ids:
                self._rows.pop(int(i), None)

    def keep_only(self, live_ids: np.ndarray) -> None:
        """Drops cached memories whose rows are gone (deleted by another process; this process's own deletes drop
        theirs at once): nothing else removes them before the cache is full, so a long-lived process among other
        writers would keep every row any search ever showed it."""
        with self._lock:
            if not self._rows:
                return
            cached = np.fromiter(self._rows.keys(), dtype=np.int64, count=len(self._rows))
            for i in cached[~np.isin(cached, live_ids)].tolist():
                del self._rows[i]

    def lookup(self, ids: Iterable[int]) -> dict[int, Memory]:
        """The memories of `ids` that exist (cached, else read from the cold tier)."""
        ids = [int(i) for i in ids]
        with self._lock:
            rows = self._rows
            found = {i: rows[i] for i in ids if i in rows}
            for i, entry in found.items():
                if type(entry) is tuple:  # a row another process logged, kept as its fields until asked for
                    found[i] = rows[i] = make_memory(i, entry[0], entry[1], entry[2], entry[3], entry[4],
                                                     json.loads(entry[5]) if entry[5] else {})
        missing = [i for i in ids if i not in found]
        if missing:
            for row in self._cold.get(missing):
                if row is None:
                    continue
                memory = memory_of(row)
                self.remember(memory)
                found[memory.id] = memory
        return found

    def cached(self, ids: list[int]) -> list[Memory] | None:
        """The memories of ids in their order when every one is cached as a Memory, else None (lookup() then reads
        what is missing): a hot answer's fast path reads nothing else."""
        rows = self._rows
        with self._lock:
            try:
                found = [rows[i] for i in ids]
            except KeyError:
                return None
        for memory in found:
            if type(memory) is not Memory:
                return None
        return found

    def cached_hits(self, ids: list[int], scores: list[float], tier: str, build: Callable) -> list[Hit] | None:
        """The hits of ids with their scores when every one is cached as a Memory with no time to live, else None
        (cached() then, and the caller reads the expiry): built by build (the compiled hot_hits), under the cache's
        lock, as hit_of builds each."""
        with self._lock:
            return build(self._rows, ids, scores, Memory, Hit, tier)

    def warm(self, batch: int = 5000, stop=lambda: False) -> int:
        """Reads the newest rows' texts and metadata (up to the cache's limit) from the cold tier in batches, so
        that a process which did not write them needs no disk read when searches return them. Never replaces what
        is cached (which is as new or newer) and skips rows deleted while it read; returns how many it added."""
        with self._lock:
            self._warming, self._warm_abandoned = set(), False
        added = 0
        try:
            ids = self._cold.recent(self._limit)["ids"]
            for lo in range(0, ids.shape[0], batch):
                if stop():
                    break
                rows = self._cold.get(ids[lo:lo + batch])
                with self._lock:
                    if self._warm_abandoned:
                        break
                    for row in rows:
                        if row is None or int(row["id"]) in self._rows or int(row["id"]) in self._warming:
                            continue
                        if len(self._rows) >= self._limit:
                            return added
                        self._rows[int(row["id"])] = memory_of(row)
                        self._rows.move_to_end(int(row["id"]), last=False)  # older than what searches cached
                        added += 1
        finally:
            with self._lock:
                self._warming = None
        return added

    # ---- the cold tier's follower (storage._follower.RowListener) ------------------------------
    def rows_logged(self, rows) -> None:
        """Rows added or replaced, by any process: cached as they are now. Each is kept as its fields, and becomes a
        Memory when a lookup first asks for it: every process hears of every row written, and most are never
        returned by this one's searches."""
        entries = zip(rows.ids.tolist(), rows.texts, rows.namespaces, rows.sessions, rows.roles,
                      rows.created_at_us.tolist(), rows.metadata_json)
        with self._lock:
            cached = self._rows
            for row_id, *fields in entries:
                cached[row_id] = tuple(fields)
                cached.move_to_end(row_id)
            while len(cached) > self._limit:
                cached.popitem(last=False)

    def rows_deleted(self, ids) -> None:
        """Rows deleted, by any process."""
        with self._lock:
            if self._warming is not None:
                self._warming.update(ids.tolist())
            self.drop(ids.tolist())

    def rows_reloaded(self) -> None:
        """The table was reloaded: any row may have changed."""
        with self._lock:
            self._warm_abandoned = self._warming is not None
            self.clear()
