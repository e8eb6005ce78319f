"""A shard's reads over its TieredMemory under an ownership view: a request for one namespace is served, redirected
or told to retry by the view's rule; a request over many namespaces (a prefix, every namespace, ids) is answered for
the namespaces this shard serves at its view's version, which the caller checks is the same on every shard. Used by
the shard's actor and, with no Ray hop, by a client process on the shard's own node."""
from __future__ import annotations

import threading
import time
from typing import Any

from ..coordinator import Memory, SearchReport, TieredMemory
from ..namespaces import under_prefix
from . import replies
from .hashing import owner
from .ownership import REDIRECT, RETRY, SERVE, View
from .replies import Reply

# A search over more of this shard's namespaces than this, while some of its rows are not its to answer for (a move in
# progress), is one cold-tier search filtered to the namespaces it serves, instead of one search per namespace.
FANOUT_PER_NAMESPACE_MAX = 64
RETRY_MOVING_S = 0.05


def sql_string(value: str) -> str:
    """value as a SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def within(names: list[str], where: str | None) -> str:
    """A cold-tier filter to these namespaces (and `where` when given)."""
    listed = "namespace IN (" + ", ".join(sql_string(n) for n in names) + ")"
    return listed if where is None else f"({where}) AND {listed}"


def merge_hits(answers: list[list], k: int) -> list:
    """The best k of several exact answers over disjoint namespaces, best first, ties by smaller id."""
    merged: dict[int, Any] = {}
    for hits in answers:
        for hit in hits:
            merged.setdefault(hit.id, hit)
    return sorted(merged.values(), key=lambda h: (-h.score, h.id))[:k]


class ReadGate:
    """Many requests at once, or one change of view alone (a writer preferred over new readers, so a view change
    waits only for the requests already running)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    def __enter__(self) -> "ReadGate":
        with self._cond:
            while self._writing or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        with self._cond:
            self._readers -= 1
            if self._readers == 0:
                self._cond.notify_all()

    def exclusive(self) -> "_Exclusive":
        """A context in which no request runs (a view change)."""
        return _Exclusive(self)


class _Exclusive:
    def __init__(self, gate: ReadGate) -> None:
        self._gate = gate

    def __enter__(self) -> None:
        gate = self._gate
        with gate._cond:
            gate._writers_waiting += 1
            while gate._writing or gate._readers:
                gate._cond.wait()
            gate._writers_waiting -= 1
            gate._writing = True

    def __exit__(self, *exc: Any) -> None:
        gate = self._gate
        with gate._cond:
            gate._writing = False
            gate._cond.notify_all()


class ShardCore:
    """The reads of one shard: `memory` its TieredMemory, `view` the ownership view it applies."""

    def __init__(self, shard: str, memory: TieredMemory, view: View, secrets: tuple[str, ...] = ()) -> None:
        self.shard = shard
        self.memory = memory
        self.view = view
        self.secrets = secrets
        self.gate = ReadGate()
        self._excluded: frozenset[str] = frozenset()
        self.refresh_excluded()

    # ---- the view -----------------------------------------------------------------------------
    def holds(self, namespace: str) -> bool:
        """Whether this shard holds rows of the namespace."""
        return self.memory.count(namespace) > 0

    def refresh_excluded(self) -> None:
        """The namespaces this shard holds rows of but does not answer for at its view (a copy arriving, a copy
        left behind): searches over many namespaces leave them out."""
        view = self.view
        held = self.memory.cold.namespace_counts()
        self._excluded = frozenset(ns for ns, n in held.items() if n and not view.serves_held(self.shard, ns))

    def decide(self, namespace: str, *, write: bool, vouched: bool) -> Reply | None:
        """None to serve, else the Reply that sends the caller elsewhere or asks it to retry."""
        view = self.view
        if view.target is None and not view.moving and not view.placed and owner(namespace, view.ring) == self.shard:
            return None  # the usual case, outside any move: this shard owns the namespace
        decision = self.view.decide(self.shard, namespace, write=write, holds=lambda: self.holds(namespace),
                                    vouched=vouched)
        if decision.kind == SERVE:
            return None
        if decision.kind == RETRY:
            return Reply(replies.RETRY, version=self.view.version, retry_s=RETRY_MOVING_S)
        return Reply(REDIRECT, version=self.view.version, to=decision.to, vouched=decision.vouched)

    def _stale(self, version: int) -> Reply | None:
        if version != self.view.version:
            return Reply(replies.STALE, version=self.view.version)
        return None

    def guarded(self, fn, *args: Any, **kwargs: Any) -> Reply:
        """fn(...) under the gate; the package's errors (and any other failure) as an ERROR reply."""
        try:
            with self.gate:
                return fn(*args, **kwargs)
        except Exception as exc:
            return replies.failure(exc, self.secrets)

    # ---- one namespace ------------------------------------------------------------------------
    def search_one(self, namespace: str, query: Any, k: int, options: dict[str, Any], vouched: bool = False) -> Reply:
        """TieredMemory.search of one namespace, when the view lets this shard serve it."""
        write = bool(options.get("refresh_ttl"))
        redirect = self.decide(namespace, write=write, vouched=vouched)
        if redirect is not None:
            return redirect
        return replies.ok(self.memory.search(query, k=k, namespace=namespace, **options), self.view.version)

    def count_one(self, namespace: str, vouched: bool = False) -> Reply:
        """Memories of one namespace, when the view lets this shard serve it."""
        redirect = self.decide(namespace, write=False, vouched=vouched)
        if redirect is not None:
            return redirect
        return replies.ok(self.memory.count(namespace), self.view.version)

    def memories_page(self, version: int, namespace: str | None, after: tuple[int, int] | None, limit: int,
                      vouched: bool = False) -> Reply:
        """Up to `limit` memories (of one namespace, or of every namespace this shard serves), oldest first, past
        the (created_at_us, id) key `after`."""
        if namespace is not None:
            redirect = self.decide(namespace, write=False, vouched=vouched)
            if redirect is not None:
                return redirect
        elif (stale := self._stale(version)) is not None:
            return stale
        excluded = self._excluded
        page: list[Memory] = []
        for memory in self.memory.memories(namespace):
            key = (round(memory.created_at.timestamp() * 1e6), memory.id)
            if after is not None and key <= tuple(after):
                continue
            if memory.namespace in excluded:
                continue
            page.append(memory)
            if len(page) >= limit:
                break
        return replies.ok(page, self.view.version)

    # ---- many namespaces (the caller checks every shard answered at one version) ----------------
    def search_many(self, version: int, query: Any, k: int, prefix: str | None, options: dict[str, Any]) -> Reply:
        """The exact top k over the namespaces this shard serves under `prefix` (all when None), at `version`."""
        if (stale := self._stale(version)) is not None:
            return stale
        explain = bool(options.get("explain"))
        t0 = time.perf_counter()
        excluded = [ns for ns in self._excluded if prefix is None or under_prefix(ns, prefix)]
        if not excluded:
            found = self.memory.search(query, k=k, namespace_prefix=prefix, **options)
            return replies.ok(found, self.view.version)
        names = sorted(ns for ns, n in self.memory.cold.namespace_counts().items()
                       if n and ns not in self._excluded and (prefix is None or under_prefix(ns, prefix)))
        if not names:
            hits: list = []
            rule, path, stages = "cold", "cold", None
        elif (len(names) <= FANOUT_PER_NAMESPACE_MAX and options.get("where") is None
              and not options.get("hybrid")):
            answers = [self.memory.search(query, k=k, namespace=name, **{**options, "explain": True})
                       for name in names]
            hits = merge_hits([a.hits for a in answers], k)
            rules, paths = {a.rule for a in answers}, {a.path for a in answers}
            rule = rules.pop() if len(rules) == 1 else "prefix"
            path = paths.pop() if len(paths) == 1 else "hot+cold"
            stages = answers[0].stages
        else:
            scoped = {**options, "where": within(names, options.get("where")), "explain": True}
            answer = self.memory.search(query, k=k, **scoped)
            hits, rule, path, stages = answer.hits, answer.rule, answer.path, answer.stages
        if explain:
            return replies.ok(SearchReport(hits, rule, path, None, None, time.perf_counter() - t0, stages),
                              self.view.version)
        return replies.ok(hits, self.view.version)

    def get_many(self, version: int, ids: list[int], refresh_ttl: bool = False) -> Reply:
        """The memories of `ids` this shard serves: {id: Memory}."""
        if (stale := self._stale(version)) is not None:
            return stale
        found = self.memory.get(ids)
        served = {m.id: m for m in found if m is not None and m.namespace not in self._excluded}
        if refresh_ttl and served:
            if any(self.view.moving.get(m.namespace, ("", ""))[0] == self.shard for m in served.values()):
                return Reply(replies.RETRY, version=self.view.version, retry_s=RETRY_MOVING_S)
            again = self.memory.get(list(served), refresh_ttl=True)
            served = {m.id: m for m in again if m is not None}
        return replies.ok(served, self.view.version)

    def vectors_many(self, version: int, ids: list[int]) -> Reply:
        """The stored vectors of `ids` this shard serves: {id: vector}."""
        if (stale := self._stale(version)) is not None:
            return stale
        found = self.memory.get(ids)
        served = [m.id for m in found if m is not None and m.namespace not in self._excluded]
        vectors = self.memory.vectors(served) if served else []
        return replies.ok({i: v for i, v in zip(served, vectors) if v is not None}, self.view.version)

    def counts_many(self, version: int) -> Reply:
        """{namespace: {"memories": n, "hot": h}} of the namespaces this shard serves."""
        if (stale := self._stale(version)) is not None:
            return stale
        listed = self.memory.namespaces()
        return replies.ok({ns: v for ns, v in listed.items() if ns not in self._excluded}, self.view.version)

    def held(self) -> dict[str, int]:
        """Every namespace this shard holds rows of, served or not (what a move reads)."""
        return {ns: int(n) for ns, n in self.memory.cold.namespace_counts().items() if n}

