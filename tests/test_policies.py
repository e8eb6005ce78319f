"""Placement policies (LRU, LFU with ageing, recency window, pinning), capacity in bytes, rules recorded, scoring."""
from __future__ import annotations

import time
from datetime import datetime, timezone

import numpy as np
import pytest

from tiered_recall import InvalidInput
from tiered_recall.policies import LFU, LRU, HotSet, RecencyWindow, resolve_policy
from tiered_recall.scoring import Boost, Scoring

DIM = 16


def unit_rows(rng, n):
    x = rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)




def hot_ids(memory, ids):
    mask = memory._hot.contains(np.asarray(ids, dtype=np.int64))
    return {int(i) for i, m in zip(ids, mask) if m}


def add_one_by_one(memory, x, ids, namespace="n", t0=1_700_000_000.0):
    for j, (i, v) in enumerate(zip(ids, x)):
        memory.add(["m"], vectors=v[None, :], ids=[i], namespace=namespace, created_at=t0 + i)


def test_lru_keeps_the_most_recently_used_and_promotes_cold_hits(open_memory):
    rng = np.random.default_rng(1)
    memory = open_memory(hot_capacity=5, policy="lru")
    x = unit_rows(rng, 10)
    add_one_by_one(memory, x, range(10))
    assert hot_ids(memory, range(10)) == {5, 6, 7, 8, 9}
    assert memory.search(x[5], k=1, namespace="n")[0].tier == "hot"  # 5 is used now: 6 is the LRU row
    hit = memory.search(x[0], k=1, namespace="n")[0]
    assert hit.id == 0 and hit.tier == "cold"
    assert hot_ids(memory, range(10)) == {0, 5, 7, 8, 9}
    moved = memory.stats()["rows_moved"]
    assert moved["promoted"] == 1 and moved["evicted"] == 6 and moved["sidecar_evicted"] == 0


def test_lfu_with_ageing_keeps_frequently_used_rows_through_a_flood(open_memory):
    rng = np.random.default_rng(2)
    memory = open_memory(hot_capacity=6, policy=LFU(half_life=50))
    x = unit_rows(rng, 20)
    add_one_by_one(memory, x[:6], range(6))
    for _ in range(5):
        for i in (0, 1):
            memory.search(x[i], k=1, namespace="n")
    add_one_by_one(memory, x[6:14], range(6, 14))
    assert {0, 1} <= hot_ids(memory, range(14)), "frequently used rows survive new writes"
    # ageing: after many ticks without use, old counts decay and the favourites can leave
    for _ in range(400):
        memory.search(x[13], k=1, namespace="n")
    add_one_by_one(memory, x[14:20], range(14, 20))
    assert not {0, 1} <= hot_ids(memory, range(20))


def test_recency_window_per_namespace_and_no_promotion(open_memory):
    rng = np.random.default_rng(3)
    memory = open_memory(hot_capacity=100, policy=RecencyWindow(rows_per_namespace=3))
    x = unit_rows(rng, 12)
    add_one_by_one(memory, x[:6], range(6), namespace="a")
    add_one_by_one(memory, x[6:], range(6, 12), namespace="b")
    assert hot_ids(memory, range(12)) == {3, 4, 5, 9, 10, 11}
    hit = memory.search(x[0], k=1, namespace="a")[0]
    assert hit.id == 0 and hit.tier == "cold"
    assert 0 not in hot_ids(memory, [0]), "the recency window does not promote old rows"
    # a batch bigger than the window keeps its newest rows
    memory.add(["m"] * 5, vectors=unit_rows(rng, 5), ids=list(range(20, 25)), namespace="c")
    assert hot_ids(memory, range(20, 25)) == {22, 23, 24}


def test_pinned_namespace_is_never_evicted_and_pin_loads_cold_rows(open_memory):
    rng = np.random.default_rng(4)
    memory = open_memory(hot_capacity=8, policy=LRU(pin_namespaces=["vip"]))
    x = unit_rows(rng, 30)
    memory.add(["m"] * 3, vectors=x[:3], ids=[0, 1, 2], namespace="vip")
    add_one_by_one(memory, x[3:20], range(3, 20), namespace="other")
    assert {0, 1, 2} <= hot_ids(memory, range(20))
    assert memory.search(x[1], k=3, namespace="vip", explain=True).rule == "complete"
    # pin ids that went cold: they come back and stay
    memory.pin(ids=[3, 4])
    add_one_by_one(memory, x[20:30], range(20, 30), namespace="other")
    assert {0, 1, 2, 3, 4} <= hot_ids(memory, range(30))
    memory.unpin(ids=[3, 4])
    add_one_by_one(memory, unit_rows(rng, 6), range(40, 46), namespace="other")
    assert not {3, 4} & hot_ids(memory, [3, 4])
    assert {0, 1, 2} <= hot_ids(memory, [0, 1, 2])


def test_hot_capacity_in_bytes(open_memory):
    memory = open_memory(hot_capacity_bytes=10 * (DIM * 4 + 24) + 5)
    assert memory.hot_capacity == 10 and memory.stats()["hot_capacity"] == 10
    with pytest.raises(InvalidInput):
        open_memory(hot_capacity_bytes=0)
    with pytest.raises(InvalidInput):
        open_memory(rules=("complete", "magic"))
    with pytest.raises(InvalidInput):
        resolve_policy("fifo")


def test_each_search_records_the_rule_that_decided_it(open_memory):
    rng = np.random.default_rng(5)
    memory = open_memory(hot_capacity=10, rules=("complete",), confidence=0.9)
    x = unit_rows(rng, 20)
    memory.add(["m"] * 20, vectors=x, ids=list(range(20)), namespace="n")
    memory.add(["m"] * 2, vectors=x[:2], ids=[100, 101], namespace="small")
    assert memory.search(x[0], k=1, namespace="small", explain=True).rule == "complete"
    report = memory.search(x[19], k=1, namespace="n", explain=True)  # hot k-th = 1.0 >= 0.9
    assert report.rule == "threshold" and report.hot_kth >= 0.9
    q = rng.standard_normal(DIM).astype(np.float32)
    assert memory.search(q, k=3, namespace="n", explain=True).rule == "cold"
    rules = memory.stats()["rules"]
    assert rules["complete"]["searches"] == 1 and rules["threshold"]["searches"] == 1 and rules["cold"]["searches"] == 1
    hits = memory.search(x[19], k=1, namespace="n", where="role IS NULL", explain=True)
    assert hits.rule == "no-hot" and hits.hits[0].id == 19


def test_scoring_recency_and_boosts_apply_to_both_tiers_alike(open_memory):
    rng = np.random.default_rng(6)
    now = time.time()
    scoring = Scoring(recency_weight=0.5, half_life_s=3600.0, boosts=(Boost("role", "user", 0.3),))
    memory = open_memory(hot_capacity=1, scoring=scoring)
    base = unit_rows(rng, 1)[0]
    near = base + 0.05 * rng.standard_normal(DIM).astype(np.float32)
    memory.add(["old"], vectors=base[None, :], ids=[1], namespace="n", created_at=now - 10 * 3600, role="assistant")
    memory.add(["new"], vectors=near[None, :], ids=[2], namespace="n", created_at=now, role="assistant")
    memory.add(["boosted"], vectors=near[None, :], ids=[3], namespace="n", created_at=now - 10 * 3600, role="user")
    hits = memory.search(base, k=3, namespace="n")
    assert [h.id for h in hits] == [2, 3, 1]
    assert {h.tier for h in hits} == {"hot", "cold"}
    cos = float(near / np.linalg.norm(near) @ base)
    assert hits[0].score == pytest.approx(cos + 0.5, abs=1e-3)
    assert hits[1].score == pytest.approx(cos + 0.3 + 0.5 * 0.5 ** 10, abs=1e-3)
    with pytest.raises(InvalidInput):
        Boost("colour", "red", 1.0)
    assert Scoring(boosts=(Boost("role", "a", 0.2), Boost("role", "b", 0.3), Boost("metadata.x", 1, 0.1))).max_boost == pytest.approx(0.4)
    assert scoring.recency_bonus(int(datetime.now(timezone.utc).timestamp() * 1e6)) == pytest.approx(0.5, abs=1e-3)


def test_hotset_victims_skip_pinned_and_excluded():
    hs = HotSet(4, 5)
    policy = LRU(pin_ids=[2])
    for t, i in enumerate([1, 2, 3, 4]):
        hs.put(i, "n", np.ones(4, np.float32), created_us=t, now=t)
    assert hs.victims(policy, 2, now=10) == [1, 3]
    assert hs.victims(policy, 2, now=10, exclude={1}) == [3, 4]
    assert hs.victims(RecencyWindow(), 1, now=10) == [1]
    assert hs.remove(1)[0] == "n" and len(hs) == 3 and 1 not in hs
