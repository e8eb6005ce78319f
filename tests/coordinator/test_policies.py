"""Placement policies (LRU, LFU with ageing, recency window, pinning), capacity in bytes, rules recorded, scoring."""
from __future__ import annotations

import math
import time
from datetime import datetime, timezone

import numpy as np
import pytest

from tiered_recall import InvalidInput
from tiered_recall.namespaces import namespace_hash
from tiered_recall.coordinator.placement import HotSet
from tiered_recall.policies import (LFU, LRU, NamespacePolicy, RecencyWindow, _posterior_rates, _zipf_law,
                                    fit_zipf_exponent, resolve_policy, zipf_read_rates)
from tiered_recall.scoring import Boost, Scoring

DIM = 16


def unit_rows(rng, n):
    x = rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)




def hot_ids(memory, ids):
    mask = memory._link.hot.contains(np.asarray(ids, dtype=np.int64))
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


def test_a_cpu_sidecar_with_no_core_to_spare_gets_no_promotions(open_memory, monkeypatch):
    """While the processes at work fill the cores (HotTier.no_spare_core), a search that read the cold tier promotes
    none of its cold hits into a CPU sidecar: the promotion would hold the store's write lock across a round trip to
    the sidecar. The hits are returned as ever; a CUDA sidecar, or a spare core, gets them promoted as before."""
    from tiered_recall.coordinator import search as search_module
    from tiered_recall.hot import HotTier

    rng = np.random.default_rng(41)
    memory = open_memory(hot_capacity=5, policy="lru")
    x = unit_rows(rng, 10)
    add_one_by_one(memory, x, range(10))
    assert hot_ids(memory, range(10)) == {5, 6, 7, 8, 9}
    monkeypatch.setattr(search_module, "OWN_COPY_SCAN_MAX_ELEMENTS", 0)  # no scope is answered from the mirror
    monkeypatch.setattr(HotTier, "no_spare_core", property(lambda self: True))
    for i in (0, 1):
        report = memory.search(x[i], k=1, namespace="n", explain=True)
        assert report.rule == "cold" and [(h.id, h.tier) for h in report.hits] == [(i, "cold")]
    assert hot_ids(memory, range(10)) == {5, 6, 7, 8, 9}
    moved = memory.stats()["rows_moved"]
    assert moved["promoted"] == 0 and moved["promotions_skipped"] == 2

    monkeypatch.setattr(memory._link.hot, "backend", "cuda")  # a GPU sidecar's work takes no core from the clients
    assert [(h.id, h.tier) for h in memory.search(x[0], k=1, namespace="n")] == [(0, "cold")]
    monkeypatch.setattr(memory._link.hot, "backend", "cpu")
    monkeypatch.setattr(HotTier, "no_spare_core", property(lambda self: False))
    assert [(h.id, h.tier) for h in memory.search(x[1], k=1, namespace="n")] == [(1, "cold")]
    assert {0, 1} <= hot_ids(memory, range(10))
    moved = memory.stats()["rows_moved"]
    assert moved["promoted"] == 2 and moved["promotions_skipped"] == 2


def test_a_cold_path_whose_sidecar_handle_was_dropped_on_the_way_still_promotes(open_memory):
    """The cold path's repair can drop the hot tier's handle (a sidecar that stopped answering): the promotion
    after it asks the link for the current handle, never the closed one, and the next attach gets the row."""
    rng = np.random.default_rng(43)
    memory = open_memory(hot_capacity=5, policy="lru")
    x = unit_rows(rng, 10)
    add_one_by_one(memory, x, range(10))
    hot = memory._link.hot
    memory._link.drop("the test dropped the sidecar's handle")  # closes `hot`, as a failed repair does
    memory._search.after_cold_path(hot, "n", [(1.0, 0, "cold")], trusted=True)
    assert memory._link.hot is not None and 0 in hot_ids(memory, range(10))
    assert memory.stats()["rows_moved"]["promoted"] == 1


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


def test_hot_capacity_in_bytes_counts_the_codes_unless_they_are_off(open_memory):
    from tiered_recall.hot import code_bytes_a_row

    row = DIM * 4 + 24  # the f32 vector and the id, namespace hash and created_at
    memory = open_memory(hot_capacity_bytes=10 * (row + code_bytes_a_row(DIM, "cpu")) + 5)
    assert memory.hot_capacity == 10 and memory.stats()["hot_capacity"] == 10
    assert memory.stats()["sidecar"]["codes"] == "int8"
    memory = open_memory(hot_capacity_bytes=10 * row + 5, codes="off")
    assert memory.hot_capacity == 10 and memory.stats()["sidecar"]["codes"] == "off"
    with pytest.raises(InvalidInput, match="codes"):
        open_memory(codes="int4")
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


@pytest.mark.parametrize("half_life", [None, 3.0])
def test_hotset_use_counts_each_tracked_id_as_use_slot_does(half_life):
    """use() counts the uses of a search's hits in array operations: the same frequencies, ageing and last uses as
    use_slot() of each tracked id, and untracked ids are ignored."""
    one, many = HotSet(4, 8), HotSet(4, 8)
    for hs in (one, many):
        for t, i in enumerate([10, 11, 12, 13]):
            hs.put(i, "n", np.ones(4, np.float32), created_us=t, now=t, half_life=half_life)
    for now, hits in ((5, [11, 13, 99]), (9, [13, 10]), (20, [12]), (21, [])):
        many.use(hits, now, half_life)
        for i in hits:
            if i in one:
                one.use_slot(one.slot[i], now, 1.0, half_life)
    for i in (10, 11, 12, 13):
        a, b = one.slot[i], many.slot[i]
        assert math.isclose(one.freq[a], many.freq[b], rel_tol=1e-12)
        assert (one.freq_at[a], one.last_use[a]) == (many.freq_at[b], many.last_use[b])
    assert 99 not in many


def test_hotset_use_counts_the_same_through_the_compiled_loop_and_numpy():
    """Without a half-life, use() of a list of ints goes through _trstages.count_uses: over random searches (ids
    given twice, untracked, numpy integers, generators) with rows put and removed between them, every column is
    bit for bit what the numpy path leaves."""
    from tiered_recall.coordinator.stages import compiled_stages

    if compiled_stages() is None:
        pytest.skip("this build has no _trstages (no Python headers or numpy when it was compiled)")
    rng = np.random.default_rng(11)
    compiled, python = HotSet(4, 64), HotSet(4, 64)
    assert compiled._count_uses is not None
    python._count_uses = None
    for now in range(1, 400):
        if rng.random() < 0.3:
            row = int(rng.integers(1, 90))
            if row in compiled and rng.random() < 0.5:
                compiled.remove(row), python.remove(row)
            elif row not in compiled and len(compiled) < 64:
                for hs in (compiled, python):
                    hs.put(row, "n", np.ones(4, np.float32), created_us=now, now=now)
        ids = [int(i) for i in rng.integers(1, 100, size=int(rng.integers(0, 80)))]  # past 64: the heap's buffer
        shape = rng.integers(0, 3)
        given = ids if shape == 0 else (np.array(ids, dtype=np.int64).tolist() if shape == 1 else
                                        [np.int64(i) for i in ids])
        compiled.use(given if rng.random() < 0.8 else iter(given), now)
        python.use(given, now)
    assert compiled.slot == python.slot
    for column in ("freq", "freq_at", "last_use"):
        assert np.array_equal(getattr(compiled, column), getattr(python, column)), column
    assert compiled.freq.max() > 5  # the searches did count uses


def test_the_compiled_use_count_refuses_what_is_not_a_hotsets():
    from tiered_recall.coordinator.stages import compiled_stages

    loops = compiled_stages()
    if loops is None:
        pytest.skip("this build has no _trstages (no Python headers or numpy when it was compiled)")
    hs = HotSet(4, 4)
    hs.put(7, "n", np.ones(4, np.float32), created_us=0, now=1)
    before = hs.freq.copy()
    assert loops.count_uses(hs.slot, [7.0], hs.freq, hs.freq_at, hs.last_use, 2) is NotImplemented
    assert loops.count_uses(hs.slot, [np.int64(7)], hs.freq, hs.freq_at, hs.last_use, 2) is NotImplemented
    assert np.array_equal(hs.freq, before)
    with pytest.raises(TypeError, match="freq"):
        loops.count_uses(hs.slot, [7], hs.freq.astype(np.float32), hs.freq_at, hs.last_use, 2)
    with pytest.raises(TypeError, match="last_use"):
        loops.count_uses(hs.slot, [7], hs.freq, hs.freq_at, hs.last_use[:2], 2)
    with pytest.raises(ValueError, match="outside"):
        loops.count_uses({7: 4}, [7], hs.freq, hs.freq_at, hs.last_use, 2)
    with pytest.raises(TypeError):
        loops.count_uses(hs.slot, (7,), hs.freq, hs.freq_at, hs.last_use, 2)
    assert loops.count_uses(hs.slot, [7, 7], hs.freq, hs.freq_at, hs.last_use, 2) is None
    assert (hs.freq[hs.slot[7]], hs.freq_at[hs.slot[7]], hs.last_use[hs.slot[7]]) == (before[hs.slot[7]] + 1.0, 2, 2)


# ---- namespace-granular placement ------------------------------------------------------------

def test_namespace_policy_keeps_read_namespaces_whole_and_rule_1_answers_them(open_memory):
    rng = np.random.default_rng(7)
    memory = open_memory(hot_capacity=20, policy="namespace", rules=("complete",))
    assert isinstance(memory.policy, NamespacePolicy)
    xa, xb, xbig = unit_rows(rng, 6), unit_rows(rng, 5), unit_rows(rng, 40)
    memory.add(["m"] * 6, vectors=xa, ids=list(range(6)), namespace="a", created_at=1_600_000_000.0)
    memory.add(["m"] * 5, vectors=xb, ids=list(range(10, 15)), namespace="b", created_at=1_600_000_000.0)
    add_one_by_one(memory, xbig[:30], range(100, 130), namespace="big")  # pushes a and b out (nobody read them yet)
    assert not set(range(6)) <= hot_ids(memory, range(6))
    first = memory.search(xa[0], k=3, namespace="a", explain=True)
    assert first.rule == "cold" and first.hits[0].id == 0
    assert hot_ids(memory, range(6)) == set(range(6)), "a cold-path search of a chosen namespace loads all of it"
    assert memory.search(xa[3], k=3, namespace="a", explain=True).rule == "complete"
    memory.search(xb[0], k=3, namespace="b")
    report = memory.search(xb[1], k=3, namespace="b", explain=True)
    assert report.rule == "complete" and report.hits[0].id == 11 and all(h.tier == "hot" for h in report.hits)
    # writes to an unread namespace do not break the chosen ones: they keep only the room left
    add_one_by_one(memory, xbig[30:], range(130, 140), namespace="big")
    assert hot_ids(memory, range(6)) == set(range(6)) and hot_ids(memory, range(10, 15)) == set(range(10, 15))
    assert hot_ids(memory, range(100, 140)) == set(range(131, 140)), "big keeps its newest rows in the room left"
    # a write to a chosen namespace keeps it complete
    memory.add(["m"], vectors=unit_rows(rng, 1), ids=[6], namespace="a")
    assert memory.search(xa[0], k=3, namespace="a", explain=True).rule == "complete"
    assert memory.policy.chosen(memory._placement.tick, 20) == {"a", "b"}
    stats = memory.stats()
    assert stats["hot_rows"] <= 20 and stats["rows_moved"]["sidecar_evicted"] == 0
    assert stats["policy"] == "namespace(half_life=1000)"


def test_namespace_policy_prefers_reads_per_row_and_falls_back_to_recency_for_a_namespace_too_large(open_memory):
    rng = np.random.default_rng(8)
    memory = open_memory(hot_capacity=12, policy=NamespacePolicy(half_life=10_000), rules=("complete",))
    xs, xl, xh = unit_rows(rng, 4), unit_rows(rng, 8), unit_rows(rng, 20)
    memory.add(["m"] * 4, vectors=xs, ids=list(range(4)), namespace="small", created_at=1_600_000_000.0)
    memory.add(["m"] * 8, vectors=xl, ids=list(range(10, 18)), namespace="large", created_at=1_600_000_000.0)
    add_one_by_one(memory, xh, range(100, 120), namespace="huge")  # larger than the whole hot tier
    for _ in range(3):  # small and large read as often: small is denser, so chosen first; large no longer fits
        memory.search(xs[0], k=2, namespace="small")
        memory.search(xl[0], k=2, namespace="large")
    for _ in range(30):  # huge is read the most, but it can never be complete
        memory.search(xh[-1], k=2, namespace="huge")
    assert memory.policy.chosen(memory._placement.tick, 12) == {"small", "large"}
    assert hot_ids(memory, range(4)) == set(range(4)) and hot_ids(memory, range(10, 18)) == set(range(10, 18))
    assert memory.search(xs[1], k=2, namespace="small", explain=True).rule == "complete"
    assert memory.search(xl[1], k=2, namespace="large", explain=True).rule == "complete"
    # new rows of huge replace only its own older rows, never rows of the chosen namespaces
    add_one_by_one(memory, unit_rows(rng, 3), range(120, 123), namespace="huge")
    assert hot_ids(memory, range(4)) == set(range(4)) and hot_ids(memory, range(10, 18)) == set(range(10, 18))
    assert memory.stats()["hot_rows"] <= 12


def test_namespace_policy_with_pinning(open_memory):
    rng = np.random.default_rng(9)
    memory = open_memory(hot_capacity=10, policy=NamespacePolicy(pin_namespaces=["vip"]))
    memory.add(["m"] * 4, vectors=unit_rows(rng, 4), ids=[0, 1, 2, 3], namespace="vip")
    xa, xb = unit_rows(rng, 5), unit_rows(rng, 3)
    memory.add(["m"] * 5, vectors=xa, ids=list(range(10, 15)), namespace="a")
    memory.add(["m"] * 3, vectors=xb, ids=list(range(20, 23)), namespace="b")
    for _ in range(3):
        memory.search(xa[0], k=2, namespace="a")
    memory.search(xb[0], k=2, namespace="b")
    # 10 rows, 4 pinned: a (5 rows, read most per row) fits the 6 left, b (3) does not
    assert memory.policy.chosen(memory._placement.tick, 10) == {"a"}
    assert {0, 1, 2, 3} <= hot_ids(memory, range(4))
    assert hot_ids(memory, range(10, 15)) == set(range(10, 15))
    assert memory.search(xa[2], k=2, namespace="a", explain=True).rule == "complete"
    assert memory.search(unit_rows(rng, 1)[0], k=2, namespace="vip", explain=True).rule == "complete"
    assert memory.stats()["hot_rows"] <= 10


@pytest.mark.parametrize("new_share, prior, popularity",
                         [(0.0, 0.0, "counts"), (0.3, 0.0, "counts"), (0.0, 0.5, "counts"), (0.2, 0.3, "counts"),
                          (0.0, 0.0, "zipf")])
def test_namespace_policy_is_exact_across_adds_deletes_and_evictions(open_memory, new_share, prior, popularity):
    rng = np.random.default_rng(10)
    cap = 40
    policy = NamespacePolicy(half_life=200, new_share=new_share, prior=prior, popularity=popularity)
    memory = open_memory(hot_capacity=cap, policy=policy, rules=("complete", "bound"))
    names = [f"n{i}" for i in range(8)]
    weight = np.array([8, 6, 4, 3, 2, 1, 1, 1], dtype=np.float64)
    weight /= weight.sum()
    truth: dict[int, tuple[str, np.ndarray]] = {}
    next_id = 0
    rules_seen = set()
    for step in range(260):
        ns = names[int(rng.choice(len(names), p=weight))]
        op = rng.random()
        if op < 0.35 or not any(v[0] == ns for v in truth.values()):
            m = int(rng.integers(1, 5))
            x = unit_rows(rng, m)
            ids = list(range(next_id, next_id + m))
            next_id += m
            memory.add(["m"] * m, vectors=x, ids=ids, namespace=ns, created_at=1_700_000_000.0 + step)
            truth.update({i: (ns, v) for i, v in zip(ids, x)})
        elif op < 0.42:
            victims = [i for i, (n, _) in truth.items() if n == ns][:2]
            assert memory.delete(victims) == len(victims)
            for i in victims:
                truth.pop(i)
        else:
            own = [(i, v) for i, (n, v) in truth.items() if n == ns]
            target = own[int(rng.integers(len(own)))][1]
            q = target + 0.3 * rng.standard_normal(DIM).astype(np.float32)
            q /= np.linalg.norm(q)
            k = 5
            report = memory.search(q, k=k, namespace=ns, explain=True)
            ids = np.array([i for i, _ in own])
            scores = np.stack([v for _, v in own]) @ q
            want = ids[np.lexsort((ids, -scores))][:k].tolist()
            assert [h.id for h in report.hits] == want, (step, report.rule)
            rules_seen.add(report.rule)
            _, total = memory._link.hot.namespace_rows(namespace_hash(ns))
            assert total == len(own)
        assert memory.stats()["hot_rows"] <= cap
    assert "complete" in rules_seen and "cold" in rules_seen
    stats = memory.stats()
    assert stats["rows_moved"]["sidecar_evicted"] == 0 and stats["rows_moved"]["promoted"] > 0
    assert stats["rules"]["complete"]["searches"] > 10


def test_namespace_policy_validation():
    assert isinstance(resolve_policy("namespace"), NamespacePolicy)
    with pytest.raises(InvalidInput):
        NamespacePolicy(half_life=0)
    p = NamespacePolicy()
    p.set_sizes({"a": 3, "b": 50, "c": 2})
    p.observe("a", 1)
    p.observe("b", 1)
    assert p.chosen(1, 10) == {"a"} and p.whole_namespace("a", 1, 10) and not p.whole_namespace("c", 1, 10)
    p.set_sizes({"a": 0})
    assert p.chosen(1, 10) == set()


@pytest.mark.parametrize("new_share", [0.0, 0.25])
def test_namespace_policy_reserve_keeps_small_new_namespaces_complete_for_their_first_read(open_memory, new_share):
    rng = np.random.default_rng(11)
    memory = open_memory(hot_capacity=20, policy=NamespacePolicy(half_life=10_000, new_share=new_share),
                         rules=("complete",))
    assert memory.policy.reserve(20) == int(new_share * 20)
    xa, xb = unit_rows(rng, 6), unit_rows(rng, 5)
    memory.add(["m"] * 6, vectors=xa, ids=list(range(6)), namespace="a", created_at=1_600_000_000.0)
    memory.add(["m"] * 5, vectors=xb, ids=list(range(10, 15)), namespace="b", created_at=1_600_000_000.0)
    for _ in range(2):
        memory.search(xa[0], k=2, namespace="a")
        memory.search(xb[0], k=2, namespace="b")
    assert memory.policy.chosen(memory._placement.tick, 20) == {"a", "b"}  # 11 rows, within 20 - reserve
    add_one_by_one(memory, unit_rows(rng, 12), range(100, 112), namespace="big")  # fills the room left
    assert memory.stats()["hot_rows"] == 20
    fresh, fresh2, fresh3 = unit_rows(rng, 2), unit_rows(rng, 3), unit_rows(rng, 2)
    memory.add(["m"] * 2, vectors=fresh, ids=[200, 201], namespace="fresh", created_at=1_700_001_000.0)
    admitted = hot_ids(memory, [200, 201])
    if new_share == 0.0:  # no reserve: a never-read namespace finds no room in a tier full of better rows
        assert admitted == set()
        assert memory.search(fresh[0], k=2, namespace="fresh", explain=True).rule == "cold"
        return
    assert admitted == {200, 201}, "the reserve admits a small new namespace whole"
    add_one_by_one(memory, unit_rows(rng, 3), range(112, 115), namespace="big", t0=1_700_001_100.0)
    assert hot_ids(memory, [200, 201]) == {200, 201}, "an incomplete namespace's rows leave before the reserve's"
    memory.add(["m"] * 3, vectors=fresh2, ids=[300, 301, 302], namespace="fresh2", created_at=1_700_002_000.0)
    assert hot_ids(memory, [200, 201, 300, 301, 302]) == {200, 201, 300, 301, 302}  # 2 + 3 fill the 5
    memory.add(["m"] * 2, vectors=fresh3, ids=[400, 401], namespace="fresh3", created_at=1_700_003_000.0)
    # eviction order: rows outside the reserve (big, incomplete; then fresh, the oldest namespace that
    # no longer fits the reserve), then the reserve oldest first, then the chosen namespaces
    order = memory._placement.hotset.victims(memory.policy, 20, memory._placement.tick)
    big_hot = hot_ids(memory, range(100, 115))
    assert len(order) == 20 and set(order[:len(big_hot) + 2]) == big_hot | {200, 201}  # by age among them
    rest = order[len(big_hot) + 2:]
    assert rest[:5] == [300, 301, 302, 400, 401] and set(rest[5:]) == set(range(6)) | set(range(10, 15))
    add_one_by_one(memory, unit_rows(rng, 4), range(115, 119), namespace="big", t0=1_700_003_100.0)
    assert hot_ids(memory, [300, 301, 302, 400, 401]) == {300, 301, 302, 400, 401}
    # first reads of the namespaces the reserve holds are answered by rule 1, exactly
    for x, ids, ns in ((fresh3, [400, 401], "fresh3"), (fresh2, [300, 301, 302], "fresh2")):
        report = memory.search(x[0], k=2, namespace=ns, explain=True)
        assert report.rule == "complete" and report.hits[0].id == ids[0]
        assert {h.id for h in report.hits} == set(ids[:2]) and all(h.tier == "hot" for h in report.hits)
    assert memory.search(fresh[0], k=2, namespace="fresh", explain=True).rule == "cold"
    # the chosen namespaces were never touched
    assert hot_ids(memory, range(6)) == set(range(6)) and hot_ids(memory, range(10, 15)) == set(range(10, 15))
    stats = memory.stats()
    assert stats["hot_rows"] <= 20 and stats["rows_moved"]["sidecar_evicted"] == 0
    assert stats["policy"] == "namespace(half_life=10000, new_share=0.25)"


def test_namespace_policy_new_share_validation():
    for bad in (-0.1, 1.0, 1.5, True, "0.2", None):
        with pytest.raises(InvalidInput):
            NamespacePolicy(new_share=bad)
    p = NamespacePolicy(new_share=0.3)
    p.set_sizes({"a": 3, "b": 8})
    p.observe("a", 1)
    p.observe("b", 1)
    assert p.reserve(10) == 3 and p.chosen(1, 10) == {"a"}, "the reserve leaves 7 rows: b (8) no longer fits"
    assert NamespacePolicy().reserve(10) == 0 and NamespacePolicy().chosen(0, 10) == set()


# ---- namespace policy with a prior: small namespaces whole before any read --------------------

def test_namespace_policy_prior_values_unread_namespaces_by_size_and_validates():
    for bad in (-0.1, math.inf, math.nan, True, "0.3", None):
        with pytest.raises(InvalidInput):
            NamespacePolicy(prior=bad)
    p = NamespacePolicy(half_life=10_000, prior=0.5)
    p.set_sizes({"tiny": 1, "small": 3, "mid": 6, "big": 30})
    # no reads yet: value prior / rows, so the smallest namespaces fill the capacity first
    assert p.chosen(0, 10) == {"tiny", "small", "mid"}
    assert p.chosen(0, 4) == {"tiny", "small"}
    assert p.warm_namespaces(0, 4) == {"tiny", "small"}
    assert NamespacePolicy().warm_namespaces(0, 4) == set(), "without a prior nothing unread is chosen"
    assert LRU().warm_namespaces(0, 4) is None, "row policies warm with the newest rows"
    # reads move the choice: mid read 3 times is worth (3 + 0.5) / 6 per row, above small's 0.5 / 3
    for t in (1, 2, 3):
        p.observe("mid", t)
    assert p.chosen(3, 9) == {"mid", "tiny"}  # mid (6), tiny (1); small (3) no longer fits
    assert p.density("big", 3) == pytest.approx(0.5 / 30)
    assert p.describe() == "namespace(half_life=10000, prior=0.5)"
    p.set_sizes({"tiny": 0})
    assert "tiny" not in p.chosen(3, 9)


def test_namespace_policy_prior_warms_small_namespaces_whole_and_answers_their_first_reads(open_memory, tmp_path):
    rng = np.random.default_rng(12)
    path = tmp_path / "prior-store"
    sizes = {"s1": 1, "s2": 2, "s3": 3, "m8": 8, "big": 30}
    rows: dict[str, tuple[list[int], np.ndarray]] = {}
    writer = open_memory(path, device="none")
    next_id = 0
    for step, (ns, n) in enumerate(sizes.items()):
        x = unit_rows(rng, n)
        ids = list(range(next_id, next_id + n))
        next_id += n
        # big is written last, so warming by recency would fill the tier with big's rows
        writer.add(["m"] * n, vectors=x, ids=ids, namespace=ns, created_at=1_700_000_000.0 + step)
        rows[ns] = (ids, x)
    writer.close()
    memory = open_memory(path, hot_capacity=16, policy=NamespacePolicy(half_life=10_000, prior=0.3),
                         rules=("complete", "bound"))
    memory.stats()  # starts the sidecar, which warms the tier
    for ns in ("s1", "s2", "s3", "m8"):  # 14 rows: the smallest namespaces are loaded whole
        assert hot_ids(memory, rows[ns][0]) == set(rows[ns][0]), ns
    assert len(hot_ids(memory, rows["big"][0])) == 2, "the rows left over go to the newest rows of the rest"
    for ns in ("s1", "s2", "s3", "m8"):  # first reads, answered by rule 1, exactly
        ids, x = rows[ns]
        report = memory.search(x[0], k=3, namespace=ns, explain=True)
        want = np.array(ids)[np.lexsort((ids, -(x @ x[0])))][:3].tolist()
        assert report.rule == "complete" and [h.id for h in report.hits] == want
    assert memory.search(rows["big"][1][0], k=3, namespace="big", explain=True).rule == "cold"
    # a new small namespace is chosen at its first write (its 2 rows fit beside the 14 chosen ones)
    xn = unit_rows(rng, 2)
    memory.add(["m"] * 2, vectors=xn, ids=[500, 501], namespace="new", created_at=1_700_001_000.0)
    assert hot_ids(memory, [500, 501]) == {500, 501}
    assert memory.search(xn[1], k=2, namespace="new", explain=True).rule == "complete"
    stats = memory.stats()
    assert stats["hot_rows"] <= 16 and stats["rows_moved"]["sidecar_evicted"] == 0
    assert stats["policy"] == "namespace(half_life=10000, prior=0.3)"


# ---- namespace policy valued by a fitted Zipf popularity (empirical Bayes) ---------------------

def test_fit_zipf_exponent_recovers_the_law_that_drew_the_reads():
    rng = np.random.default_rng(21)
    for true_s in (0.8, 1.1, 1.5):
        law = np.arange(1, 1001, dtype=np.float64) ** -true_s
        law /= law.sum()
        reads = rng.choice(1000, size=5000, p=law)
        distinct = len(np.unique(reads))
        assert fit_zipf_exponent(1000, 5000, distinct) == pytest.approx(true_s, abs=0.08), true_s
    assert fit_zipf_exponent(50, 10, 10) == 0.05, "every read a new namespace: the flattest law allowed"
    assert fit_zipf_exponent(50, 1000, 1) == 4.0, "one namespace took every read: the steepest law allowed"


def test_zipf_read_rates_order_counts_and_weigh_them_by_the_reads_seen():
    assert zipf_read_rates(np.zeros(4)) == pytest.approx(np.full(4, 0.25)), "no reads: every namespace alike"
    rng = np.random.default_rng(22)
    law = np.arange(1, 201, dtype=np.float64) ** -1.1
    law /= law.sum()
    counts = np.bincount(rng.choice(200, size=800, p=law), minlength=200).astype(np.float64)
    rates = zipf_read_rates(counts)
    assert np.all(rates > 0) and np.all(rates < 1)
    order = np.argsort(counts, kind="stable")
    assert np.all(np.diff(rates[order]) >= -1e-12), "a namespace read more is never worth less"
    once, twice = rates[counts == 1][0], rates[counts == 2][0]
    assert twice > once, (once, twice)
    # what an unread namespace is worth next to one read once depends on how many reads went by
    # ((count + prior) would fix it at prior / (1 + prior)): after few reads, once is a real signal;
    # after many, a namespace read once is the law's long tail too
    ratio = {}
    for reads in (50, 5000):
        c = np.bincount(rng.choice(200, size=reads, p=law), minlength=200).astype(np.float64)
        r = zipf_read_rates(c)
        ratio[reads] = r[c == 0][0] / r[c == 1][0]
    assert ratio[50] < 0.5 * ratio[5000], ratio


def test_namespace_policy_zipf_keeps_small_namespaces_first_then_follows_reads():
    with pytest.raises(InvalidInput, match="popularity must be one of"):
        NamespacePolicy(popularity="pareto")
    p = NamespacePolicy(half_life=math.inf, popularity="zipf")
    p.set_sizes({f"s{i}": 1 for i in range(6)} | {"mid": 4, "big": 40})
    assert p.chosen(0, 6) == {f"s{i}" for i in range(6)}, "unread namespaces alike: the smallest first"
    assert p.warm_namespaces(0, 6) == {f"s{i}" for i in range(6)}
    for t in range(1, 13):
        p.observe("mid", t)
    p.observe("s0", 13)
    # mid was read 12 times: worth more per row than the single rows never read
    assert "mid" in p.chosen(13, 6) and "s0" in p.chosen(13, 6)
    assert p.density("mid", 13) > p.density("s1", 13)
    assert p.describe() == "namespace(half_life=inf, popularity=zipf)"


def test_zipf_read_rates_of_aged_counts_match_the_exact_posterior():
    # aged counts are nearly all distinct: they are interpolated on a grid, not evaluated one by one
    rng = np.random.default_rng(23)
    counts = rng.pareto(1.1, 500) * rng.random(500)
    assert len(np.unique(np.round(counts, 3))) > 256
    got = zipf_read_rates(counts)
    law = _zipf_law(500, fit_zipf_exponent(500, counts.sum(), int((counts > 1e-9).sum())))
    exact = _posterior_rates(counts, law, np.log(law), counts.sum())
    np.testing.assert_allclose(got, exact, rtol=1e-2)
