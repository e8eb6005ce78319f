"""Skip rule 2 (provable bound): the cone bound is an upper bound, and a search it decides equals exact search."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tiered_recall.coordinator.bounds import BoundIndex, NamespaceBound, cone_bounds, spherical_kmeans
from tiered_recall.scoring import Scoring

DIM = 24
LOCOMO = Path(__file__).resolve().parents[3] / "shared" / "data" / "locomo" / "locomo_dev.json"



def tracking_ok(memory) -> bool:
    """Whether this process's hot set and bounds are valid (rule 2 may be used)."""
    return memory._placement.tracking_ok(memory._link.hot, memory.cold.generations.writes(), False)


def resync(memory) -> None:
    """A resync now (the coordinator paces them; tests call one when they need it)."""
    memory._placement._resync_now(memory._link.hot, memory._write_lock, memory._link.rewarm, memory._cache)

def unit(x):
    x = np.asarray(x, dtype=np.float32)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def clustered(rng, n, centers, spread=0.25):
    """Rows near a few topic centres: the structure real embeddings have and bounds can use."""
    which = rng.integers(len(centers), size=n)
    return unit(centers[which] + spread * rng.standard_normal((n, centers.shape[1])) / np.sqrt(centers.shape[1]))




def test_cluster_bound_is_an_upper_bound_and_no_looser_than_centroid_plus_radius():
    rng = np.random.default_rng(0)
    for trial in range(20):
        x = clustered(rng, 200, unit(rng.standard_normal((5, DIM))), spread=float(rng.uniform(0.1, 2.0)))
        axes, assign = spherical_kmeans(x, int(rng.integers(1, 12)), seed=trial)
        cos_alpha = np.ones(axes.shape[0])
        np.minimum.at(cos_alpha, assign, np.einsum("nd,nd->n", x, axes[assign]).astype(np.float64))
        queries = np.vstack([unit(rng.standard_normal((50, DIM))), x[:20]])
        for q in queries:
            centers = np.stack([x[assign == j].mean(axis=0) for j in range(axes.shape[0])]).astype(np.float64)
            radius = np.array([np.linalg.norm(x[assign == j] - centers[j], axis=1).max() for j in range(axes.shape[0])])
            b = cone_bounds(q, axes, cos_alpha, centers, radius)
            cone_only = cone_bounds(q, axes, cos_alpha)
            true_max = np.full(axes.shape[0], -np.inf)
            np.maximum.at(true_max, assign, x @ q)
            assert (b >= true_max - 1e-6).all() and (cone_only >= true_max - 1e-6).all()
            for j in range(axes.shape[0]):  # DESIGN's bound q.c + r with c the mean, r the radius
                members = x[assign == j]
                c = members.mean(axis=0)
                r = np.linalg.norm(members - c, axis=1).max()
                assert b[j] <= float(q @ c) + r + 1e-6


def test_incremental_cones_cover_every_row_added():
    rng = np.random.default_rng(1)
    nb = NamespaceBound(DIM)
    x = clustered(rng, 300, unit(rng.standard_normal((4, DIM))))
    for start in range(0, 300, 7):
        nb.add(range(start, min(start + 7, 300)), x[start:start + 7], np.arange(len(x[start:start + 7])))
    assert nb.axes.shape[0] <= 64
    for q in np.vstack([unit(rng.standard_normal((100, DIM))), x[:50]]):
        assert nb.bound(q) >= float((x @ q).max()) - 1e-6
    nb.rebuild(range(300), x, np.zeros(300, dtype=np.int64))
    for q in unit(rng.standard_normal((100, DIM))):
        assert nb.bound(q) >= float((x @ q).max()) - 1e-6
    index = BoundIndex(DIM)
    index.add("a", [1, 2], x[:2], [0, 0])
    index.add("b", [2], x[2:3], [0])  # id 2 moved namespace
    assert index.cold_only_count("a") == 1 and index.cold_only_count("b") == 1 and index.cold_only_count() == 2


def exact_top(vectors: dict, namespaces: dict, q, k, namespace, scores_of=None):
    ids = np.array(sorted(i for i in vectors if namespaces[i] == namespace), dtype=np.int64)
    s = np.stack([vectors[i] for i in ids]) @ q
    if scores_of is not None:
        s = s + np.array([scores_of(int(i)) for i in ids])
    order = np.lexsort((ids, -s))[:k]
    return ids[order].tolist(), s[order]


def assert_same_answer(hits, want_ids, want_scores):
    got = np.array([h.score for h in hits])
    assert len(hits) == len(want_ids)
    np.testing.assert_allclose(got, want_scores, atol=1e-5)
    clearly = {i for i, s in zip(want_ids, want_scores) if s > want_scores[-1] + 1e-5}
    assert clearly <= {h.id for h in hits}


@pytest.mark.parametrize("policy", ["lru", "lfu", "recency"])
def test_bound_rule_never_changes_an_answer_on_random_data(open_memory, policy):
    rng = np.random.default_rng(hash(policy) % 1000)
    memory = open_memory(hot_capacity=60, policy=policy)
    centers = unit(rng.standard_normal((12, DIM)))
    vectors, namespaces, recent = {}, {}, {"a": [], "b": []}
    next_id, decided, skipped = 1, {}, 0
    for step in range(30):
        ns = "ab"[step % 2]
        topic = centers[rng.integers(12)]  # each add is one episode around one topic
        x = clustered(rng, int(rng.integers(4, 10)), topic[None, :], spread=0.3)
        ids = list(range(next_id, next_id + len(x)))
        next_id += len(x)
        memory.add(["m"] * len(x), vectors=x, ids=ids, namespace=ns)
        for i, v in zip(ids, x):
            vectors[i], namespaces[i] = v, ns
        recent[ns] += ids
        if step % 6 == 5:
            victims = [int(v) for v in rng.choice(sorted(vectors), 3, replace=False)]
            memory.delete(victims)
            for v in victims:
                del vectors[v], namespaces[v]
        for _ in range(6):
            ns = "ab"[int(rng.integers(2))]
            live = [i for i in recent[ns] if i in vectors]
            if not live:
                continue
            # references biased to recent memories, sometimes anything, sometimes a random direction
            pick = rng.random()
            if pick < 0.6:
                q = unit(vectors[live[-1 - int(rng.integers(min(8, len(live))))]] + 0.05 * rng.standard_normal(DIM))
            elif pick < 0.8:
                q = unit(vectors[live[int(rng.integers(len(live)))]] + 0.05 * rng.standard_normal(DIM))
            else:
                q = unit(rng.standard_normal(DIM))
            k = int(rng.choice([1, 3, 5]))
            report = memory.search(q, k=k, namespace=ns, explain=True)
            decided[report.rule] = decided.get(report.rule, 0) + 1
            want_ids, want_scores = exact_top(vectors, namespaces, q, k, ns)
            if report.rule == "bound":
                skipped += 1
                assert all(h.tier == "hot" for h in report.hits)
                assert report.hot_kth > report.cold_bound
            # every rule used here is exact: every answer equals exact search
            assert_same_answer(report.hits, want_ids, want_scores)
    assert skipped >= 5, f"rule 2 should fire on clustered data with recent references: {decided}"
    assert decided.get("cold", 0) > 0
    assert memory.stats()["rules"]["bound"]["searches"] == skipped


def test_bound_rule_with_recency_weighting_equals_exact_scored_search(open_memory):
    rng = np.random.default_rng(3)
    scoring = Scoring(recency_weight=0.05, half_life_s=3600.0, candidates=3)
    memory = open_memory(hot_capacity=30, scoring=scoring)
    centers = unit(rng.standard_normal((12, DIM)))
    vectors, namespaces, created = {}, {}, {}
    import time as _t
    t0 = _t.time() - 12 * 1800  # recent enough that the recency bonus matters (half-life one hour)
    for step in range(12):
        x = clustered(rng, 8, centers[step][None, :], spread=0.3)
        ids = list(range(step * 8 + 1, step * 8 + 9))
        memory.add(["m"] * 8, vectors=x, ids=ids, namespace="n", created_at=t0 + step * 1800)
        for i, v in zip(ids, x):
            vectors[i], namespaces[i], created[i] = v, "n", int((t0 + step * 1800) * 1e6)
    skipped = 0
    for j in range(40):
        q = unit(vectors[96 - int(rng.integers(12))] + 0.05 * rng.standard_normal(DIM)) if j % 2 else unit(rng.standard_normal(DIM))
        report = memory.search(q, k=5, namespace="n", explain=True)
        now_us = _t.time_ns() // 1000
        want_ids, want_scores = exact_top(vectors, namespaces, q, 5, "n",
                                          scores_of=lambda i: scoring.recency_bonus(created[i], now_us))
        if report.rule == "bound":
            skipped += 1
            assert_same_answer(report.hits, want_ids, want_scores)
    assert skipped > 0


def test_another_writer_makes_the_bound_rule_wait_for_a_resync(open_memory, tmp_path):
    rng = np.random.default_rng(4)
    path = tmp_path / "shared"
    first = open_memory(path, hot_capacity=20)
    centers = unit(rng.standard_normal((3, DIM)))
    x = clustered(rng, 40, centers, spread=0.3)
    first.add(["m"] * 40, vectors=x, ids=list(range(40)), namespace="n")
    assert tracking_ok(first)
    second = open_memory(path, hot_capacity=20)
    second.add(["m"] * 5, vectors=clustered(rng, 5, centers), ids=list(range(100, 105)), namespace="n")
    assert not tracking_ok(first), "another process's upsert must invalidate this one's bounds"
    report = first.search(x[39], k=3, namespace="n", explain=True)
    assert report.rule != "bound"


def test_a_resync_forgets_memories_another_process_deleted(open_memory, tmp_path):
    """A process's metadata cache keeps every memory its searches showed it; rows another process deletes leave
    it at the next resync (nothing else removes them before the cache is full)."""
    rng = np.random.default_rng(8)
    path = tmp_path / "shared"
    first = open_memory(path, hot_capacity=100)
    x = unit(rng.standard_normal((20, DIM)))
    first.add([f"m{i}" for i in range(20)], vectors=x, ids=list(range(20)), namespace="n")
    assert [m.text for m in first.get([3, 4])] == ["m3", "m4"]
    assert 3 in first._cache and 4 in first._cache
    second = open_memory(path, hot_capacity=100)
    assert second.delete([3]) == 1
    resync(first)
    assert 3 not in first._cache and 4 in first._cache
    assert first.get([3]) == [None] and first.get([4])[0].text == "m4"


def test_a_resync_torn_by_another_writer_keeps_the_hot_tier(open_memory, tmp_path):
    """Another process's add landing between a resync's cold read and its CONTAINS is not a foreign row:
    the hot tier is not cleared and refilled (that storm took the 8-process soak from ~650 to ~250 ops/s)."""
    rng = np.random.default_rng(5)
    path = tmp_path / "shared"
    first = open_memory(path, hot_capacity=100)
    first.add(["m"] * 30, vectors=unit(rng.standard_normal((30, DIM))), ids=list(range(30)), namespace="n")
    second = open_memory(path, hot_capacity=100)
    real_recent = first.cold.recent

    def recent_then_another_writer(*args, **kwargs):
        rows = real_recent(*args, **kwargs)
        first.cold.recent = real_recent  # once
        second.add(["m"], vectors=unit(rng.standard_normal((1, DIM))), ids=[500], namespace="n")
        return rows

    first.cold.recent = recent_then_another_writer
    upserted = first._link.hot.stats()["upserted_rows"]
    resync(first)
    assert first._moves["rewarms"] == 0
    assert first._link.hot.stats()["upserted_rows"] == upserted + 1, "only the other writer's row: no clear-and-refill"
    assert first._link.hot.hot_rows == 31
    assert not first._placement.bounds.valid, "a torn read must not be trusted for rule 2"
    resync(first)
    assert first._placement.bounds.valid and len(first._placement.hotset) == 31


def test_a_resync_clears_a_hot_row_the_cold_tier_lacks(open_memory, tmp_path):
    from tiered_recall.namespaces import namespace_hash

    rng = np.random.default_rng(6)
    memory = open_memory(tmp_path / "s", hot_capacity=100)
    memory.add(["m"] * 10, vectors=unit(rng.standard_normal((10, DIM))), ids=list(range(10)), namespace="n")
    memory._link.hot.upsert([999], unit(rng.standard_normal((1, DIM))), namespace_hash("n"))  # e.g. a raced promotion
    resync(memory)
    assert memory._moves["rewarms"] == 1
    assert not memory._link.hot.contains([999])[0] and memory._link.hot.hot_rows == 10
    assert memory._placement.bounds.valid and len(memory._placement.hotset) == 10


def test_hotset_fill_matches_put_one_by_one():
    from tiered_recall.coordinator.placement import HotSet

    rng = np.random.default_rng(7)
    ids = rng.permutation(1000)[:50].astype(np.int64)
    namespaces = [f"n{i % 3}" for i in range(50)]
    vectors = unit(rng.standard_normal((50, DIM))).astype(np.float32)
    created = rng.integers(0, 10**12, 50)
    one, bulk = HotSet(DIM, 64), HotSet(DIM, 64)
    bulk.put(1, "x", vectors[0], 5, now=1)
    bulk.remove(1)  # fill takes any empty table, not only a fresh one
    for i, ns, v, c in zip(ids, namespaces, vectors, created):
        one.put(int(i), ns, v, int(c), now=9)
    bulk.fill(ids, namespaces, vectors, created, now=9)
    assert len(bulk) == 50 and bulk.per_namespace == one.per_namespace
    for i in ids.tolist():
        a, b = one.slot[i], bulk.slot[i]
        assert one.namespace[a] == bulk.namespace[b] and one.created_us[a] == bulk.created_us[b]
        assert (one.vectors[a] == bulk.vectors[b]).all()
        assert (one.freq[a], one.freq_at[a], one.last_use[a]) == (bulk.freq[b], bulk.freq_at[b], bulk.last_use[b])
    assert sorted(bulk.free + list(bulk.slot.values())) == list(range(64))
    for _ in range(14):
        bulk.put(int(rng.integers(10**6, 10**7)), "n0", vectors[0], 1, now=10)  # the free slots are all usable
    assert len(bulk) == 64
    with pytest.raises(ValueError):
        bulk.fill(ids, namespaces, vectors, created, now=11)


@pytest.mark.skipif(not LOCOMO.exists(), reason=f"LoCoMo development split not found at {LOCOMO}")
def test_bound_rule_never_changes_an_answer_on_locomo(open_memory):
    from tiered_recall.embedders import WordLlamaEmbedder

    data = json.loads(LOCOMO.read_text())
    embed = WordLlamaEmbedder(dim=64)
    memory = open_memory(dim=64, hot_capacity=120, rules=("complete", "bound"))
    vectors, namespaces = {}, {}
    bound_checks = decided_cold = 0
    next_id = 1
    for conv in data[:1]:
        ns = conv["sample_id"]
        c = conv["conversation"]
        sessions = sorted((int(key.split("_")[1]) for key in c if key.startswith("session_") and
                           not key.endswith("date_time") and c[key]))
        questions = [qa["question"] for qa in conv["qa"]][:80]
        qv = unit(embed(questions))
        for s in sessions:
            turns = c[f"session_{s}"]
            x = unit(embed([f"{t['speaker']}: {t['text']}" for t in turns]))
            ids = list(range(next_id, next_id + len(turns)))
            next_id += len(turns)
            memory.add([t["text"] for t in turns], vectors=x, ids=ids, namespace=ns)
            for i, v in zip(ids, x):
                vectors[i], namespaces[i] = v, ns
            for q in qv[s % 7::7]:  # a slice of the questions after every session
                for k in (1, 5, 10):
                    report = memory.search(q, k=k, namespace=ns, explain=True)
                    want_ids, want_scores = exact_top(vectors, namespaces, q, k, ns)
                    if report.rule == "bound":
                        bound_checks += 1
                    decided_cold += report.rule == "cold"
                    assert_same_answer(report.hits, want_ids, want_scores)
    assert decided_cold > 0
    print(f"LoCoMo: rule 2 decided {bound_checks} searches")


def test_a_resync_waits_until_the_store_s_writes_stand_still(open_memory, tmp_path, monkeypatch):
    """A resync reads the whole store, and any other process's write makes it stale at once: while the write count
    keeps moving none is due; once it has stood still for RESYNC_QUIET_S (and the pacing allows) one is."""
    from tiered_recall.coordinator import placement as placement_module

    memory = open_memory(tmp_path / "store", hot_capacity=20)
    placement = memory._placement
    clock = [1000.0]
    monkeypatch.setattr(placement_module.time, "monotonic", lambda: clock[0])
    placement.next_resync = 0.0
    assert not placement.resync_due(7)  # the count is new to it: it may still be moving
    clock[0] += placement_module.RESYNC_QUIET_S / 2
    assert not placement.resync_due(8)  # it moved
    clock[0] += placement_module.RESYNC_QUIET_S / 2
    assert not placement.resync_due(8)  # still for only half the window
    clock[0] += placement_module.RESYNC_QUIET_S
    assert placement.resync_due(8)
    placement.next_resync = clock[0] + 1.0
    assert not placement.resync_due(8)  # still, but the pacing says not yet
