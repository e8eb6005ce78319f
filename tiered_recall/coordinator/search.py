"""A search across both tiers, in five steps: plan (whether to ask the hot tier), ask the hot tier, decide (whether
its answer may skip the cold tier), maybe ask the cold tier, merge; then, on the cold path, repair and promote. The
decisions are the planner's (planner.py); this module gathers their evidence and carries them out, for one scope, a
prefix, the hybrid and staged text searches, and the deeper search that steps over expired memories."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import InvalidInput, SidecarUnavailable, TieredRecallError
from ..namespaces import namespace_hash, under_prefix
from . import planner as P
from . import validate as check
from .records import Hit, Memory, PathStats, hit_of
from .stages import FeatureCache, Stages, compiled_stages, fused_pool, rank_pool

# A prefix search over at most this many namespaces searches each (hot tier and skip rules included) and merges the
# answers; over more it is one cold-tier search filtered to the namespaces (docs/frameworks.md gives the figures).
PREFIX_FANOUT_MAX = 64
# A CPU sidecar with no spare core (HotTier.no_spare_core): a scope whose exact scan of this process's mirror reads at
# most this many elements (rows x dim; 1 MiB of float32, about 0.1 ms of numpy) is answered from the mirror, since the
# round trip then costs a wait for a core and its context switches. Larger scopes still go to the sidecar.
OWN_COPY_SCAN_MAX_ELEMENTS = 1 << 18


def within(names: list[str], where: str | None) -> str:
    """A cold-tier filter to these namespaces (at least one), and to `where` when given."""
    listed = "namespace IN (" + ", ".join(P.sql_string(n) for n in names) + ")"
    return listed if where is None else f"({where}) AND {listed}"


@dataclass
class HotAnswer:
    """The hot side of one search: its candidates, the rule that decided, whether they may be trusted, and whether
    the hot tier was asked at all."""

    ids: np.ndarray
    scores: np.ndarray
    rule: str
    trusted: bool
    hot_kth: float | None = None
    cold_bound: float | None = None
    asked: bool = True


_NO_IDS = np.empty(0, np.int64)
_NO_SCORES = np.empty(0, np.float32)


def _not_asked(rule: str, trusted: bool) -> HotAnswer:
    """The plan left the hot tier out: the cold tier alone answers, by `rule`."""
    return HotAnswer(_NO_IDS, _NO_SCORES, rule, trusted, asked=False)


def _hot_lost() -> HotAnswer:
    """The sidecar was found gone while it was being asked."""
    return HotAnswer(_NO_IDS, _NO_SCORES, "no-hot", False)


class TieredSearch:
    """The search path of one TieredMemory, over its parts: the cold tier, the link to the sidecar (and its
    certificates), the placement (policy, hot set, bounds), the memory cache, the store's locks. It is also the
    planner's ScopeFacts: each fact is read only when a decision asks for it."""

    def __init__(self, memory, *, rules: tuple[str, ...], confidence: float | None, scoring, policy, cold, link,
                 placement, cache, lock, write_lock, moves, expiry, metrics, refresh: Callable) -> None:
        self.memory = memory  # for its public get() when a search refreshes time to live
        self.rules, self.confidence, self.scoring, self.policy = rules, confidence, scoring, policy
        self.cold, self.link, self.placement, self.cache = cold, link, placement, cache
        self.lock, self.write_lock, self.moves, self.expiry, self.metrics = lock, write_lock, moves, expiry, metrics
        self._refresh = refresh
        self.dim = memory.dim
        self.paths, self.rule_seconds = PathStats(), PathStats()  # per search path, and per deciding rule
        self.features = FeatureCache()  # what the retrieval stages read of each pooled memory
        loops = compiled_stages()
        self.build_hot_hits = None if loops is None else loops.hot_hits  # else hit_of of each, in Python

    # ---- the whole search -----------------------------------------------------------------------
    def live(self, q: np.ndarray, text: str | None, k: int, namespace: str | None, prefix: str | None,
             where: str | None, hybrid: bool, refresh_ttl: bool, stages: Stages | None,
             started: float) -> tuple[list[Hit], P.Answer, float]:
        """The k best live memories (expired ones stepped over by searching deeper), the answer that decided them,
        and the seconds since `started`; recorded in the store's metrics. text: the query text (staged and hybrid
        searches read it)."""
        fetch = k
        while True:
            if stages is not None:
                answer = self.staged(q, text, fetch, namespace, prefix, where, stages)
            elif prefix is None and not hybrid:
                answer = self.one(q, fetch, namespace, where)
            else:
                answer = self.scope(q, text if hybrid else None, fetch, namespace, prefix, where)
            now_us = time.time_ns() // 1000
            expired = [h.id for h in answer.hits if h.expires_at is not None and
                       h.expires_at.timestamp() * 1e6 <= now_us]
            if not expired:
                break
            self.expiry.found(expired)
            if len(answer.hits) < fetch:  # every live memory of the scope is in this answer
                break
            if fetch >= check.MAX_K:  # as deep as a search goes: delete them now, then search again
                if self.memory.read_only:
                    break
                self.expiry.run_once()
                fetch = k
                continue
            fetch = min(check.MAX_K, max(2 * fetch, k + 2 * len(expired)))
        if expired:
            gone = set(expired)
            hits = [h for h in answer.hits if h.id not in gone][:k]
        else:
            hits = answer.hits[:k]
        if refresh_ttl and any(h.ttl_s is not None for h in hits):
            fresh = self._refresh([m for m in self.memory.get([h.id for h in hits if h.ttl_s is not None])
                                   if m is not None])
            hits = [hit_of(fresh[h.id], h.score, h.tier) if h.id in fresh else h for h in hits]
        seconds = time.perf_counter() - started
        self._record(answer.path, answer.rule, seconds)
        return hits, answer, seconds

    def _record(self, path: str, rule: str, seconds: float) -> None:
        """One search's latency, by the path that served it and the rule that decided it, here and in the metrics."""
        self.paths.record(path, seconds)
        self.rule_seconds.record(rule, seconds)
        self.metrics.observe_search(path, rule, seconds)

    def _count_search(self, namespace: str | None) -> None:
        """A search of the scope counts for the placement policy: its tick, the namespace's reads. Under the store's
        lock."""
        placement = self.placement
        placement.tick += 1
        if namespace is not None:
            self.policy.observe(namespace, placement.tick)

    # ---- the hot tier's answer alone, in one pass ---------------------------------------------
    def hot_alone(self, query: np.ndarray, k: int, namespace: str) -> list[Hit] | None:
        """A vector search of one namespace that the hot tier holds whole (rule "complete"), carried out in one
        pass: the same hits, and the same bookkeeping (the placement policy's tick and uses, the latency records
        and metrics), as live() gives it. None, having changed nothing, when the search is not one it takes (a
        Scoring, no "complete" rule, a query that needs checking or normalising in float64, no certified sidecar,
        a namespace not held whole, a write between the certificate's two reads, a hit whose memory is not cached or
        has expired): live() then answers. query: a float32 array of shape (dim,); namespace: a stored name."""
        started = time.perf_counter()
        if self.scoring is not None or "complete" not in self.rules or k > check.MAX_K:
            return None
        link = self.link
        hot = link.hot
        if hot is None or link.backlog or not hot.serving() or (hot.backend == "cpu" and hot.no_spare_core):
            return None  # the plan may not ask the hot tier, or must catch it up first
        if query.dtype != np.float32 or query.shape != (self.dim,):
            return None
        q = check.scaled_to_unit(query)  # the unit vector validate.unit_query gives
        if q is None:
            return None  # zeros, NaN or infinities, or far outside float32's range: the checks say what is wrong
        ns_hash = namespace_hash(namespace)
        with self.lock:
            if link.hot is not hot:
                return None
            token = link.token(ns_hash)
            if token is None:
                return None
            hot_rows, total_rows = hot.namespace_rows(ns_hash)
            if hot_rows != total_rows:
                return None
            try:
                res = hot.search(q, k=min(k, hot.max_k), namespace_hash=ns_hash)
            except SidecarUnavailable:
                return None  # live() asks again and finds it gone
            hot_rows, total_rows = hot.namespace_rows(ns_hash)
            if hot_rows != total_rows or not link.still(token):
                return None
            n = res.hits
            ids = res.ids[0, :n].tolist()
            scores = res.scores[0, :n].tolist()
            if any(scores[i] <= scores[i + 1] for i in range(n - 1)):  # a tie: the smaller id first, as rank()
                order = sorted(range(n), key=lambda j: (-scores[j], ids[j]))
                ids, scores = [ids[j] for j in order], [scores[j] for j in order]
            build = self.build_hot_hits
            hits = None if build is None else self.cache.cached_hits(ids, scores, "hot", build)
            if hits is None:  # a memory not cached, or one with a time to live: read here
                memories = self.cache.cached(ids)
                if memories is None:
                    return None
                now_us = time.time_ns() // 1000
                if any(m.expired(now_us) for m in memories):
                    return None  # live() steps over it
                hits = [hit_of(m, s, "hot") for m, s in zip(memories, scores)]
            self._count_search(namespace)
            hot.note_work()
            self.placement.use(ids)
        self._record("hot", "complete", time.perf_counter() - started)
        return hits

    # ---- scopes ---------------------------------------------------------------------------------
    def scope(self, q: np.ndarray, text: str | None, k: int, namespace: str | None, prefix: str | None,
              where: str | None) -> P.Answer:
        """One search of a namespace, of every namespace under a prefix, or of the whole store."""
        if prefix is None:
            return self.hybrid(q, text, k, namespace, where) if text is not None else self.one(q, k, namespace, where)
        names = self.names_under(prefix)
        if not names:
            return P.Answer([], "cold", "cold", None, None)
        if text is None and where is None and len(names) <= PREFIX_FANOUT_MAX:
            # Each namespace's answer is exact, so the best k of their union are the scope's best k.
            return P.union_of_answers([self.one(q, k, name, None) for name in names], k)
        scoped = within(names, where)
        return self.hybrid(q, text, k, None, scoped) if text is not None else self.one(q, k, None, scoped)

    def names_under(self, prefix: str) -> list[str]:
        """The store's namespaces under a prefix, sorted."""
        return sorted(n for n in self.cold.namespace_counts() if under_prefix(n, prefix))

    def hybrid(self, q: np.ndarray, text: str, k: int, namespace: str | None, where: str | None) -> P.Answer:
        """BM25 over the memory texts fused with the vector ranking, by the cold tier (which holds the text index)."""
        with self.lock:
            ids, scores = self.cold.search(q, k=k, namespace=namespace, where=where, text=text)
            found = self.cache.lookup(int(i) for i in ids)
        hits = [hit_of(m, float(sc), "cold") for i, sc in zip(ids, scores) if (m := found.get(int(i))) is not None]
        return P.Answer(hits, "hybrid", "cold", None, None)

    def staged(self, q: np.ndarray, text: str, k: int, namespace: str | None, prefix: str | None,
               where: str | None, stages: Stages) -> P.Answer:
        """The retrieval stages over an exact pool: the tiered vector search's best `pool` (the skip rules hold for
        it), fused with the cold tier's BM25 ranking when the stages ask, then re-ranked (stages.py). The placement
        policy is told of the hits returned, not of the whole pool."""
        depth = max(stages.pool, k)
        ranking_depth = max(stages.depth, depth) if stages.bm25_weight else depth  # fused this deep, then pooled
        if prefix is None:
            ranked, memories, answer, path = self.ranked_one(q, ranking_depth, namespace, where, use=False)
            vector = [(i, score, tier) for score, i, tier in ranked if i in memories]
            rule, hot_kth, cold_bound = answer.rule, answer.hot_kth, answer.cold_bound
        else:
            scoped_answer = self.scope(q, None, ranking_depth, namespace, prefix, where)
            memories = {hit.id: hit for hit in scoped_answer.hits}
            vector = [(hit.id, hit.score, hit.tier) for hit in scoped_answer.hits]
            rule, path = scoped_answer.rule, scoped_answer.path
            hot_kth, cold_bound = scoped_answer.hot_kth, scoped_answer.cold_bound
        tier_of = {i: tier for i, _, tier in vector}
        if stages.bm25_weight:
            names = None if prefix is None else self.names_under(prefix)
            keyword_ids = [] if names == [] else self.cold.text_search(
                text, k=ranking_depth, namespace=namespace, where=where if names is None else within(names, where)
            )[0].tolist()
            pooled = fused_pool([i for i, _, _ in vector], keyword_ids, stages.bm25_weight, depth)
            missing = [i for i, _ in pooled if i not in memories]
            if missing:  # ranked by BM25 alone; the vector pool's expired memories are the caller's to step over
                with self.lock:
                    found = self.cache.lookup(missing)
                now_us = time.time_ns() // 1000
                memories.update((i, m) for i, m in found.items() if not m.expired(now_us))
            pooled = [(i, score) for i, score in pooled if i in memories]
        else:
            pooled = [(i, score) for i, score, _ in vector[:depth]]  # every one of them in memories
        pool = [memories[i] for i, _ in pooled]
        places, scores = rank_pool([score for _, score in pooled], self.features.of(pool),
                                   [m.session for m in pool] if stages.session_spread else None, text, k, stages)
        chosen = [pool[place] for place in places]
        with self.lock:
            self.placement.use(m.id for m in chosen if tier_of.get(m.id) == "hot")
        hits = [hit_of(m, score, tier_of.get(m.id, "cold")) for m, score in zip(chosen, scores)]
        return P.Answer(hits, rule, path, hot_kth, cold_bound)

    def one(self, q: np.ndarray, k: int, namespace: str | None, where: str | None) -> P.Answer:
        """The tiered search of one scope (a namespace, or all) as hits."""
        ranked, found, answer, path = self.ranked_one(q, k, namespace, where, use=True)
        hits = [hit_of(m, score, tier) for score, i, tier in ranked if (m := found.get(i)) is not None]
        return P.Answer(hits, answer.rule, path, answer.hot_kth, answer.cold_bound)

    def ranked_one(self, q: np.ndarray, k: int, namespace: str | None, where: str | None, *,
                   use: bool) -> tuple[list, dict[int, Memory], HotAnswer, str]:
        """The five steps for one scope: the ranked (score, id, tier) triples, the memories by id, the hot answer and
        the path. use=False leaves the placement policy untold (a caller that keeps only some of them tells it
        itself)."""
        scoring = self.scoring
        fetch = k if scoring is None else min(check.MAX_K, k * scoring.candidates)
        now_us = time.time_ns() // 1000
        with self.lock:
            placement = self.placement
            self._count_search(namespace)
            hot = self.link.ensure()
            if hot is not None:
                # Counted as work on the store whether or not the sidecar is asked: the sidecar's sweep takes the
                # larger of the processes that sent requests and those that moved their activity on.
                hot.note_work()
            try:
                step = P.plan(self.rules, self.confidence, self, hot, namespace, where is not None)
                answer = self._ask_hot(hot, q, k, fetch, namespace, now_us) if step.ask_hot else \
                    _not_asked(step.rule, step.trusted)
            except SidecarUnavailable as exc:
                self.link.drop(str(exc))
                answer = _hot_lost()
            hot = self.link.hot
            cold = None if answer.rule in P.SKIPPING_RULES else \
                self.cold.search(q, k=fetch, namespace=namespace, where=where)
            candidates = P.merge(answer.ids, answer.scores, None if cold is None else cold[0],
                                 None if cold is None else cold[1], trust_hot=answer.trusted)
            found = self.cache.lookup(i for _, i, _ in candidates)
            ranked = P.rank(candidates, found, scoring, now_us, k)
            if use:
                placement.use(i for _, i, tier in ranked if tier == "hot")
            path = "hot" if cold is None else ("hot+cold" if answer.rule == "cold" and answer.asked else "cold")
            if answer.rule == "cold" and hot is not None:  # not after "no-spare-core": nothing was missed
                self.after_cold_path(hot, namespace, ranked, answer.trusted)
        return ranked, found, answer, path

    # ---- the hot tier's answer and its evidence -------------------------------------------------
    def _ask_hot(self, hot, q: np.ndarray, k: int, fetch: int, namespace: str | None, now_us: int) -> HotAnswer:
        """The hot tier's candidates and the rule they answer by. The certificate is read before the hot answer and
        checked again after it and its counts: a write that began in between (any process's) makes it "cold"."""
        link = self.link
        ns_hash = None if namespace is None else namespace_hash(namespace)
        token = link.token(ns_hash)
        if token is None:
            token = link.catch_up(ns_hash)
            if link.hot is not hot:  # the catch-up found the sidecar gone (and closed this handle)
                return _hot_lost()
            if token is None:  # uncertified hot rows are never merged (planner.merge): no need to ask for them
                return HotAnswer(_NO_IDS, _NO_SCORES, "cold", False)
        fetched = min(fetch, hot.max_k)
        res = hot.search(q, k=fetched, namespace_hash=ns_hash)
        ids, scores = res.ids[0, : res.hits], res.scores[0, : res.hits]
        rules = self.rules
        complete = "complete" in rules and self._hot_is_complete(hot, namespace)
        kth, unfetched, bound = None, -np.inf, None
        if not complete and ("bound" in rules or "threshold" in rules):
            finals = self._finals(ids, scores, now_us)
            max_bonus = 0.0 if self.scoring is None else self.scoring.max_bonus(None, now_us)
            kth, unfetched = P.hot_kth(scores, k, fetched, finals, max_bonus)
            if "bound" in rules and self.bounds_usable(hot, namespace):
                bound = self.placement.cold_bound(q, namespace, self.scoring, now_us)
        certified = link.still(token)
        evidence = P.Evidence(certified, complete, bound is not None, kth, bound, unfetched, hot.dtype == "f16")
        return HotAnswer(ids, scores, P.decide(rules, self.confidence, evidence), certified, kth, bound)

    def _finals(self, ids: np.ndarray, scores: np.ndarray, now_us: int) -> list[float] | None:
        """The hot candidates' final scores under the store's Scoring, best first (None without one)."""
        if self.scoring is None:
            return None
        found = self.cache.lookup(int(i) for i in ids)
        return sorted((self.scoring.score(float(s), found[int(i)], now_us) for i, s in zip(ids, scores)
                       if int(i) in found), reverse=True)

    # planner.ScopeFacts
    @staticmethod
    def sidecar_takes_a_core(hot) -> bool:
        """A CPU sidecar with no core to spare (HotTier.no_spare_core): whatever it is asked to do (a scan, a
        promotion's rows) takes a core from a client, and its caller waits for a core to run again."""
        return hot.backend == "cpu" and hot.no_spare_core

    def own_copy_small(self, namespace: str | None) -> bool:
        """The cold tier answers the scope by an exact scan of this process's mirror of at most
        OWN_COPY_SCAN_MAX_ELEMENTS."""
        rows = self.cold.exact_scan_rows(namespace)
        return rows is not None and rows * self.dim <= OWN_COPY_SCAN_MAX_ELEMENTS

    def complete_hint(self, hot, namespace: str | None) -> bool:
        """Rule 1's counts, as followed (see _hot_is_complete)."""
        return self._hot_is_complete(hot, namespace, as_followed=True)

    def bounds_usable(self, hot, namespace: str | None) -> bool:
        """This process's bounds describe the hot tier and cover every cold-only row of the scope."""
        placement = self.placement
        return placement.tracking_ok(hot, self.cold.generations.writes(), bool(self.link.backlog)) \
            and placement.counts_agree(hot, namespace)

    def _hot_is_complete(self, hot, namespace: str | None, *, as_followed: bool = False) -> bool:
        """Rule 1: the hot tier holds every memory of the namespace (every process sees the same counts).
        as_followed: over every namespace, compare with the rows as this process last followed them instead of
        reading the log for an exact count (a hint for the plan; True when no count is at hand)."""
        if self.link.backlog:
            return False
        if namespace is None:
            total = self.cold.count_followed() if as_followed else self.cold.count()
            return total is None or hot.hot_rows == total
        hot_rows, total_rows = hot.namespace_rows(namespace_hash(namespace))
        return hot_rows == total_rows

    # ---- after the cold path --------------------------------------------------------------------
    def after_cold_path(self, hot, namespace: str | None, ranked: list, trusted: bool) -> None:
        """The disk was read anyway: repair a stale slot (an uncertified hot answer), promote per policy
        (planner.promotion), and tighten or resync the bounds."""
        link, placement, policy = self.link, self.placement, self.policy
        if not trusted:
            link.repair(namespace)
        # What is already hot is not promoted again: an uncertified hot answer makes every hit "cold", and taking the
        # write lock to re-place rows the hot tier holds only makes the writers queue behind the search.
        whole = namespace is not None and policy.whole_namespace(namespace, placement.tick, hot.capacity)
        to_load = whole and placement.namespace_to_load(namespace)
        cold_hits = [] if whole or not policy.promote else \
            placement.not_hot([i for _, i, tier in ranked if tier == "cold"])
        current = link.hot  # the repair above may have dropped (and closed) the handle the search used
        chosen = P.promotion(whole_namespace=whole, namespace_to_load=to_load, cold_hits=bool(cold_hits),
                             sidecar_takes_a_core=current is not None and self.sidecar_takes_a_core(current))
        if chosen == "skipped":
            self.moves["promotions_skipped"] += 1
        elif chosen is not None:
            with self.write_lock.held(wait=False) as got:  # a writer is at work: promote on a later cold hit
                if got and chosen == "namespace":
                    link.call(lambda h: placement.promote_namespace(h, namespace))
                elif got:
                    link.call(lambda h: placement.promote(h, cold_hits))
        if "bound" not in self.rules or link.hot is None:
            return
        try:
            writes = self.cold.generations.writes()
            if not placement.tracking_ok(link.hot, writes, bool(link.backlog)):
                if placement.resync_due(writes):
                    placement.resync(link.hot, write_lock=self.write_lock, rewarm=link.rewarm, cache=self.cache)
            elif namespace is not None:
                nb = placement.bounds.by_namespace.get(namespace)
                if nb is not None and nb.loose:
                    placement.rebuild_bound(namespace)
        except SidecarUnavailable as exc:
            link.drop(str(exc))
        except TieredRecallError as exc:
            link.error = str(exc)
            placement.invalidate()


def query_vector(query: Any, embedder, dim: int) -> np.ndarray:
    """The unit query vector of a search: the text embedded, or the vector checked."""
    if isinstance(query, str):
        text = check.query_text(query, embedder is not None)
        return check.embedded_rows(embedder.embed_queries([text]), 1, dim)[0]
    return check.unit_query(query, dim)


__all__ = ["HotAnswer", "InvalidInput", "OWN_COPY_SCAN_MAX_ELEMENTS", "PREFIX_FANOUT_MAX", "TieredSearch",
           "query_vector", "within"]
