"""The one-pass path of a vector search the hot tier answers whole (TieredSearch.hot_alone): the same hits and the same
bookkeeping as the general path, and the general path wherever it does not apply."""
from __future__ import annotations

import time

import numpy as np
import pytest

from tiered_recall.scoring import Scoring
from tiered_recall.coordinator.search import TieredSearch
from tiered_recall.errors import InvalidInput

DIM = 16


def unit_rows(rng, n, dim=DIM):
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture
def count_one_pass(monkeypatch):
    """Counts the searches hot_alone answered and those it handed to the general path."""
    counts = {"answered": 0, "declined": 0}
    original = TieredSearch.hot_alone

    def counted(self, *args):
        hits = original(self, *args)
        counts["answered" if hits is not None else "declined"] += 1
        return hits

    monkeypatch.setattr(TieredSearch, "hot_alone", counted)
    return counts


def filled(memory, rng):
    """Three namespaces; duplicated vectors (exact ties, broken by id); memories that expire and one that has."""
    x = unit_rows(rng, 300)
    x[100:120] = x[0]  # twenty ties with row 1
    names = ["a"] * 150 + ["b"] * 100 + ["c"] * 50
    for name in "abc":
        rows = [i for i, n in enumerate(names) if n == name]
        memory.add([f"{name}-{i}" for i in rows], vectors=x[rows], namespace=name, ids=np.array(rows) + 1,
                   metadata=[{"row": i} for i in rows])
    memory.add(["lives a while"], vectors=x[1:2] * 0.999 + x[2:3] * 0.001, namespace="a", ttl=3600.0, ids=[1001])
    memory.add(["gone soon"], vectors=x[0:1], namespace="a", ttl=0.2, ids=[1002])
    time.sleep(0.3)
    return x


@pytest.mark.parametrize("hits_built", ["compiled", "python"])
def test_the_one_pass_gives_the_general_paths_hits(open_memory, count_one_pass, hits_built):
    rng = np.random.default_rng(3)
    memory = open_memory(hot_capacity=4096, ttl_sweep_s=3600.0)
    built = []
    if hits_built == "python":
        memory._search.build_hot_hits = None
    elif memory._search.build_hot_hits is None:
        pytest.skip("this build has no _trstages (no Python headers or numpy when it was compiled)")
    else:
        compiled = memory._search.build_hot_hits
        memory._search.build_hot_hits = lambda *args: built.append(compiled(*args)) or built[-1]
    x = filled(memory, rng)
    queries = list(unit_rows(rng, 120)) + [x[0], x[1], x[0] * 3.0]  # ties, a memory with a TTL, a query to normalise
    for q in queries:
        for name in "abc":
            for k in (1, 5, 25):
                fast = memory.search(q, k=k, namespace=name)
                general = memory.search(q, k=k, namespace=name, explain=True)  # explain always takes live()
                assert general.rule == "complete"
                assert fast == general.hits
                assert [h.__dict__ for h in fast] == [h.__dict__ for h in general.hits]  # the same fields, no more
                assert 1002 not in [h.id for h in fast]
    # Every search whose hits hold the expired memory goes to live(), which steps over it; all others take one pass.
    assert count_one_pass["answered"] >= 0.9 * (count_one_pass["answered"] + count_one_pass["declined"])
    if hits_built == "compiled":  # it built the hits of the one pass, and left those with a time to live to Python
        assert 0.8 * count_one_pass["answered"] <= sum(h is not None for h in built) < count_one_pass["answered"]
    hits = memory.search(x[0], k=25, namespace="a")
    assert [h.id for h in hits[:21]] == [1] + list(range(101, 121))  # ties by smaller id
    assert {h.tier for h in hits} == {"hot"}


def test_the_one_pass_keeps_the_same_books_as_the_general_path(open_memory, count_one_pass, monkeypatch):
    rng = np.random.default_rng(4)
    one_pass = open_memory(hot_capacity=4096, ttl_sweep_s=3600.0)
    general = open_memory(hot_capacity=4096, ttl_sweep_s=3600.0)
    filled(one_pass, np.random.default_rng(5))
    filled(general, np.random.default_rng(5))
    queries = unit_rows(rng, 60)
    for q in queries:
        one_pass.search(q, k=7, namespace="b")
    assert count_one_pass["answered"] == len(queries)
    monkeypatch.setattr(TieredSearch, "hot_alone", lambda self, *args: None)
    for q in queries:
        general.search(q, k=7, namespace="b")
    a, b = one_pass._placement, general._placement
    assert a.tick == b.tick
    for field in ("freq", "freq_at", "last_use"):
        np.testing.assert_array_equal(getattr(a.hotset, field), getattr(b.hotset, field))
    assert one_pass.policy.describe() == general.policy.describe()
    assert one_pass.stats()["rules"]["complete"]["searches"] == general.stats()["rules"]["complete"]["searches"]
    assert one_pass.stats()["latency"]["hot"]["searches"] == general.stats()["latency"]["hot"]["searches"]


def test_the_general_path_answers_what_the_one_pass_does_not_take(open_memory, count_one_pass):
    rng = np.random.default_rng(6)
    memory = open_memory(hot_capacity=4096, ttl_sweep_s=3600.0)
    x = filled(memory, rng)
    q = unit_rows(rng, 1)[0]
    memory._cache.clear()  # memories not cached: the general path reads them, and the next search takes one pass
    first = memory.search(q, k=5, namespace="b")
    assert count_one_pass == {"answered": 0, "declined": 1}
    assert memory.search(q, k=5, namespace="b") == first
    assert count_one_pass == {"answered": 1, "declined": 1}
    assert memory.search(q.astype(np.float64), k=5, namespace="b") == first  # not float32: checked and converted
    with pytest.raises(InvalidInput, match="NaN"):
        memory.search(np.full(DIM, np.nan, np.float32), k=5, namespace="b")
    with pytest.raises(InvalidInput, match="zeros"):
        memory.search(np.zeros(DIM, np.float32), k=5, namespace="b")
    with pytest.raises(InvalidInput, match="namespace"):
        memory.search(q, k=5, namespace="")
    with pytest.raises(InvalidInput, match="k must be"):
        memory.search(q, k=0, namespace="b")
    scored = open_memory(hot_capacity=4096, scoring=Scoring(recency_weight=0.1, half_life_s=3600.0))
    scored.add(["s"], vectors=x[:1], namespace="b")
    before = dict(count_one_pass)
    assert [h.text for h in scored.search(x[0], k=1, namespace="b")] == ["s"]
    assert count_one_pass["answered"] == before["answered"]  # a Scoring ranks in the general path


def test_the_compiled_hits_are_hit_ofs_or_none():
    """_trstages.hot_hits builds what records.hit_of builds of each cached memory, and builds nothing (None) where a
    memory is not cached, is not a Memory, or has a time to live."""
    from tiered_recall.coordinator.records import Hit, Memory, hit_of, to_datetime
    from tiered_recall.coordinator.stages import compiled_stages

    loops = compiled_stages()
    if loops is None:
        pytest.skip("this build has no _trstages (no Python headers or numpy when it was compiled)")
    at = to_datetime(1_765_000_000_000_000)
    rows = {i: Memory(i, f"text {i}", "n", "s" if i % 2 else None, "user", at, {"i": i}) for i in range(1, 80)}
    rows[200] = Memory(200, "expires", "n", None, None, at, {}, to_datetime(1_865_000_000_000_000), 60.0)
    rows[300] = {"id": 300}
    ids, scores = [5, 1, 70, 33], [0.9, 0.8, 0.8, -0.25]
    hits = loops.hot_hits(rows, ids, scores, Memory, Hit, "hot")
    expected = [hit_of(rows[i], s, "hot") for i, s in zip(ids, scores)]
    assert hits == expected and [repr(h) for h in hits] == [repr(h) for h in expected]
    assert all(type(h) is Hit and h.shard is None for h in hits)
    assert loops.hot_hits(rows, [], [], Memory, Hit, "hot") == []
    for odd in (999, 200, 300):  # not cached, a time to live, not a Memory
        assert loops.hot_hits(rows, [5, odd], [0.9, 0.1], Memory, Hit, "hot") is None
    assert loops.hot_hits(rows, list(range(1, 66)), [0.5] * 65, Memory, Hit, "hot") is None  # past 64
    with pytest.raises(TypeError, match="same length"):
        loops.hot_hits(rows, [5, 1], [0.9], Memory, Hit, "hot")
    with pytest.raises(TypeError):
        loops.hot_hits(rows, (5,), [0.9], Memory, Hit, "hot")


def test_the_compiled_scaling_gives_numpys_unit_vector_to_the_last_bit_of_the_length():
    """_trstages.scaled_to_unit, which every search that normalises a query calls: numpy's unit vector but for the
    last bit of the length (it sums the squares in another order), None where numpy's is None, any stride."""
    import math

    from tiered_recall.coordinator.stages import compiled_stages

    loops = compiled_stages()
    if loops is None:
        pytest.skip("this build has no _trstages (no Python headers or numpy when it was compiled)")

    def numpys(arr):
        wide = arr.astype(np.float64)
        norm = math.sqrt(float(np.dot(wide, wide)))
        return arr / np.float32(norm) if 1e-30 < norm < 1e30 else None

    rng = np.random.default_rng(12)
    same = 0
    for n in (1, 7, 8, 9, 384, 768, 1000):
        for scale in (1e-20, 1e-3, 1.0, 7.0, 1e20):
            arr = (rng.standard_normal(n) * scale).astype(np.float32)
            got, expected = loops.scaled_to_unit(arr), numpys(arr)
            assert got.dtype == np.float32 and got.shape == (n,)
            np.testing.assert_array_max_ulp(got, expected, maxulp=1)
            same += np.array_equal(got, expected)
            wide = np.zeros(2 * n, np.float32)
            wide[::2] = arr
            assert np.array_equal(loops.scaled_to_unit(wide[::2]), got)  # a strided view reads the same values
    assert same >= 25  # most lengths round the same way
    for odd in (np.zeros(8, np.float32), np.full(8, np.nan, np.float32), np.array([1, np.inf], np.float32),
                np.full(4, 1e-36, np.float32), np.full(4, 3e38, np.float32), np.zeros(0, np.float32)):
        assert loops.scaled_to_unit(odd) is None and numpys(odd) is None
    for wrong in (np.ones(4, np.float64), np.ones((2, 2), np.float32), [1.0, 2.0]):
        with pytest.raises(TypeError, match="1-D float32"):
            loops.scaled_to_unit(wrong)
