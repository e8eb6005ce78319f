"""ClusterMemory: TieredMemory's methods and results over a cluster of shards on Ray. A request for one namespace goes
to the shard that owns it (a co-located shard is read in this process, with no Ray hop); a request over many
namespaces goes to every shard at one ownership view and their exact answers are merged; every hit names its shard."""
from __future__ import annotations

import heapq
import secrets
import time
from collections.abc import Sequence
from typing import Any, Iterator

import numpy as np

from ..coordinator import Hit, Memory, SearchReport, Stages
from ..errors import InvalidInput
from ..namespaces import namespace_name, select_namespaces
from .session import ClusterSession
from .shard_core import merge_hits

_PAGE = 1000


def _named(hits: list, shard: str) -> list:
    """The hits, each naming the shard that served it (they are this process's own copies)."""
    for hit in hits:
        hit.__dict__["shard"] = shard
    return hits


def _count(texts: Any, vectors: Any) -> int:
    """How many memories an add holds (the shard checks the rest of its input)."""
    if texts is not None:
        return 1 if isinstance(texts, str) else len(texts)
    if vectors is None:
        return 0
    array = np.asarray(vectors)
    return 1 if array.ndim == 1 else int(array.shape[0])


class ClusterMemory:
    """A tiered-recall cluster through TieredMemory's methods (add, search, get, vectors, delete, count, namespaces,
    list_namespaces, memories, stats, pin, unpin, close): memories sharded by namespace over shards on Ray.

    ClusterMemory(address=None, *, name="default", wait_s=30.0, timeout_s=120.0, colocated=True)

    address: the Ray cluster ("host:port"; None: the one this machine runs, or this process's Ray); name: the
    cluster's name (`tiered-recall cluster up --name`). wait_s: how long a request waits for a shard that restarts or
    a namespace that moves before it raises ShardUnavailable (retryable: nothing partial is returned); timeout_s: the
    longest one call to a shard may take. colocated: read the shards that run on this node in this process (their
    hot tier through shared memory, no Ray hop); writes always go through the shard.
    Adds without ids get ids drawn here, so an add retried after a shard failed is stored once.
    """

    def __init__(self, address: str | None = None, *, name: str = "default", wait_s: float = 30.0,
                 timeout_s: float = 120.0, colocated: bool = True) -> None:
        for value, what in ((wait_s, "wait_s"), (timeout_s, "timeout_s")):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise InvalidInput(f"{what} must be a number of seconds > 0, got {value!r}")
        self._session = ClusterSession(address, name, wait_s=float(wait_s), timeout_s=float(timeout_s),
                                       colocated=bool(colocated))
        self.name = name
        self.address = self._session.address
        self.config = self._session.config
        self.dim = self.config.dim
        self.path = f"{self.config.storage} (cluster {name})"
        self._closed = False

    # ---- writes ------------------------------------------------------------------------------
    def add(self, texts: str | Sequence[str] | None = None, *, vectors: Any = None, namespace: Any = "default",
            ids: Sequence[int] | None = None, session: Any = None, role: Any = None, metadata: Any = None,
            created_at: Any = None, ttl: float | None = None, expires_at: Any = None) -> list[int]:
        """TieredMemory.add, on the shard that owns the namespace; returns when the cluster's durability says
        ("object": committed to object storage; "local": in the shard's node-local log)."""
        self._check_open()
        namespace = namespace_name(namespace)
        if ids is None:
            n = _count(texts, vectors)
            ids = [secrets.randbits(62) + 1 for _ in range(n)] if n else None
        payload = {"texts": texts, "vectors": None if vectors is None else np.asarray(vectors, dtype=np.float32),
                   "ids": None if ids is None else list(ids), "session": session, "role": role,
                   "metadata": metadata, "created_at": created_at, "ttl": ttl, "expires_at": expires_at}
        value, _ = self._session.one(namespace, "add", (namespace, payload), local=False)
        return value

    def delete(self, ids: Sequence[int] | int) -> int:
        """Removes memories from whichever shard holds them; returns how many there were."""
        self._check_open()
        wanted = [int(i) for i in np.atleast_1d(np.asarray(ids, dtype=np.int64))] if not isinstance(ids, int) \
            else [int(ids)]
        deleted = 0
        deadline = time.monotonic() + self._session.wait_s
        while wanted:
            answers = self._session.many("delete_many", (wanted,), local=False)
            deleted += sum(n for n, _ in answers.values())
            wanted = sorted({i for _, retry in answers.values() for i in retry})
            if wanted:
                if time.monotonic() > deadline:
                    self._session._give_up(None, f"{len(wanted)} ids in namespaces that are moving")
                time.sleep(0.05)
        return deleted

    def pin(self, *, namespace: Any = None, ids: Sequence[int] | None = None) -> None:
        """TieredMemory.pin on the shards concerned (pins are each shard's hot-tier policy, kept while it runs)."""
        self._pin(namespace, ids, unpin=False)

    def unpin(self, *, namespace: Any = None, ids: Sequence[int] | None = None) -> None:
        """Lets the shards' policies evict these again."""
        self._pin(namespace, ids, unpin=True)

    def _pin(self, namespace: Any, ids: Sequence[int] | None, unpin: bool) -> None:
        self._check_open()
        name = None if namespace is None else namespace_name(namespace)
        listed = None if ids is None else [int(i) for i in ids]
        shards = self._session.view.shards if listed is not None else (self._session.view.route(name),)
        for shard in shards:
            reply = self._session.call(shard, "pin", name, listed, unpin, local=False)
            if reply.kind == "error":
                from .replies import raise_error

                raise_error(reply, shard)

    # ---- reads -------------------------------------------------------------------------------
    def search(self, query: str | np.ndarray, *, k: int = 10, namespace: Any = None, namespace_prefix: Any = None,
               where: str | None = None, hybrid: bool = False, stages: Stages | bool | None = None,
               explain: bool = False, refresh_ttl: bool = False) -> list[Hit] | SearchReport:
        """TieredMemory.search: one namespace on its shard; a prefix, or every namespace, on every shard at one
        view, their exact top-k merged (best first, ties by id). Each hit names its tier and its shard."""
        self._check_open()
        if namespace is not None and namespace_prefix is not None:
            raise InvalidInput("pass namespace=... (one namespace) or namespace_prefix=... (every namespace under "
                               "it), not both")
        if not isinstance(query, str):
            query = np.asarray(query, dtype=np.float32)
        options = {"where": where, "hybrid": hybrid, "stages": stages, "explain": explain,
                   "refresh_ttl": refresh_ttl}
        if namespace is not None:
            name = namespace_name(namespace)
            if not refresh_ttl:  # the usual case on a shard's node: read in this process, nothing else to decide
                here = self._session.search_here(name, query, k, options)
                if here is not None:
                    return here
            found, shard = self._session.one(name, "search_one", (name, query, k, options), local=not refresh_ttl)
            _named(found.hits if isinstance(found, SearchReport) else found, shard)
            return found
        t0 = time.perf_counter()
        prefix = None if namespace_prefix is None else namespace_name(namespace_prefix)
        answers = self._session.many("search_many", (query, k, prefix, {**options, "refresh_ttl": False}))
        hits = merge_hits([_named(a.hits if isinstance(a, SearchReport) else a, s) for s, a in answers.items()], k)
        if refresh_ttl and any(h.ttl_s is not None for h in hits):
            hits = self._refreshed(hits)
        if not explain:
            return hits
        reports = list(answers.values())
        rules, paths = {r.rule for r in reports}, {r.path for r in reports}
        return SearchReport(hits, rules.pop() if len(rules) == 1 else "prefix",
                            paths.pop() if len(paths) == 1 else "hot+cold", None, None, time.perf_counter() - t0,
                            reports[0].stages if reports else None)

    def _refreshed(self, hits: list[Hit]) -> list[Hit]:
        fresh = {m.id: m for m in self.get([h.id for h in hits if h.ttl_s is not None], refresh_ttl=True)
                 if m is not None}
        out = []
        for hit in hits:
            memory = fresh.get(hit.id)
            if memory is not None:
                fields = {**hit.__dict__, "expires_at": memory.expires_at}
                hit = Hit(**fields)
            out.append(hit)
        return out

    def get(self, ids: Sequence[int] | int, *, refresh_ttl: bool = False) -> list[Memory | None]:
        """Memories by id from whichever shard serves them, in the order asked (None where absent or expired)."""
        self._check_open()
        listed = [int(i) for i in np.atleast_1d(np.asarray(ids, dtype=np.int64))]
        found: dict[int, Memory] = {}
        for part in self._session.many("get_many", (listed, refresh_ttl), local=not refresh_ttl).values():
            found.update(part)
        return [found.get(i) for i in listed]

    def vectors(self, ids: Sequence[int] | int) -> list[np.ndarray | None]:
        """The stored vectors of memories by id, in the order asked (None where absent)."""
        self._check_open()
        listed = [int(i) for i in np.atleast_1d(np.asarray(ids, dtype=np.int64))]
        if not listed:
            return []
        found: dict[int, np.ndarray] = {}
        for part in self._session.many("vectors_many", (listed,)).values():
            found.update(part)
        return [found.get(i) for i in listed]

    def count(self, namespace: Any = None) -> int:
        """Memories in the cluster (of one namespace)."""
        self._check_open()
        if namespace is not None:
            name = namespace_name(namespace)
            value, _ = self._session.one(name, "count_one", (name,))
            return int(value)
        return sum(v["memories"] for v in self.namespaces().values())

    def namespaces(self) -> dict[str, dict[str, int]]:
        """Every namespace, by name, with its memories and hot rows on the shard that serves it."""
        self._check_open()
        merged: dict[str, dict[str, int]] = {}
        for part in self._session.many("counts_many", ()).values():
            merged.update(part)
        return dict(sorted(merged.items()))

    def list_namespaces(self, *, prefix: Sequence[str] | None = None, suffix: Sequence[str] | None = None,
                        max_depth: int | None = None, limit: int = 100, offset: int = 0) -> list[tuple[str, ...]]:
        """TieredMemory.list_namespaces over every shard."""
        from ..coordinator import validate as check

        self._check_open()
        prefix = check.labels_pattern(prefix, "prefix")
        suffix = check.labels_pattern(suffix, "suffix")
        max_depth = check.positive_int(max_depth, "max_depth", optional=True)
        limit = check.positive_int(limit, "limit")
        offset = check.non_negative_int(offset, "offset")
        listed = select_namespaces(self.namespaces(), prefix=prefix, suffix=suffix, max_depth=max_depth)
        return listed[offset:offset + limit]

    def memories(self, namespace: Any = None, *, batch: int = _PAGE) -> Iterator[Memory]:
        """Every live memory (of one namespace), oldest first, ties by id; across shards, their streams merged."""
        self._check_open()
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise InvalidInput(f"batch must be a positive int, got {batch!r}")
        if namespace is not None:
            name = namespace_name(namespace)
            yield from self._pages(lambda after: self._session.one(
                name, "memories_page", (self._session.view.version, name, after, batch))[0])
            return
        version = self._session.view.version
        streams = [self._pages(lambda after, s=shard: self._shard_page(s, version, after, batch))
                   for shard in self._session.view.shards]
        yield from heapq.merge(*streams, key=lambda m: (m.created_at, m.id))

    @staticmethod
    def _pages(fetch) -> Iterator[Memory]:
        after = None
        while True:
            page = fetch(after)
            yield from page
            if not page:
                return
            last = page[-1]
            after = (round(last.created_at.timestamp() * 1e6), last.id)

    def _shard_page(self, shard: str, version: int, after, limit: int) -> list[Memory]:
        from ..errors import ShardUnavailable
        from .replies import ERROR, OK, raise_error

        reply = self._session.call(shard, "memories_page", version, None, after, limit)
        if reply.kind == OK:
            return reply.value
        if reply.kind == ERROR:
            raise_error(reply, shard)
        raise ShardUnavailable(f"the cluster's namespaces moved (or {shard} restarted) while they were listed: list "
                               "them again", retry_after_s=1.0)

    def stats(self) -> dict:
        """Each shard's TieredMemory stats, its group commits and its node, the ownership view, the totals, and what
        this process served from co-located shards."""
        self._check_open()
        session = self._session
        shards = {}
        for shard in session.view.shards:
            reply = session.call(shard, "stats", local=False)
            shards[shard] = reply.value if reply.kind == "ok" else {"unavailable": str(reply.value or reply.kind)}
        rows = sum(s["memory"]["cold_rows"] for s in shards.values() if "memory" in s)
        return {"cluster": self.name, "storage": self.config.storage, "durability": self.config.durability,
                "view": session.view.to_json(), "cold_rows": rows, "shards": shards,
                "colocated": session.colocated_figures()}

    # ---- life cycle ----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise InvalidInput("this ClusterMemory is closed: make another")

    def close(self) -> None:
        """Closes this client (the co-located stores it opened); the cluster runs on."""
        if self._closed:
            return
        self._closed = True
        self._session.close()

    def __enter__(self) -> "ClusterMemory":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ClusterMemory(address={self.address!r}, name={self.name!r})"
