"""The CPU sidecar through its real process and the Python client: exactness, writes, eviction, errors."""
from __future__ import annotations

import numpy as np
import pytest

from tiered_recall.hot import layout as L
from tiered_recall.errors import HotTierFull, IncompatibleLayout, InvalidInput, SidecarError, SidecarUnavailable
from tiered_recall.hot import HotTier, start_sidecar

BACKENDS = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


def unit_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def exact_topk(x: np.ndarray, ids: np.ndarray, q: np.ndarray, k: int, mask: np.ndarray | None = None):
    scores = x @ q
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    order = np.lexsort((ids, -scores))[:k]  # best first, ties by smaller id
    order = order[np.isfinite(scores[order])]
    return ids[order], scores[order]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("filtered", [False, True])
def test_search_matches_numpy(start, backend, dtype, filtered):
    rng = np.random.default_rng([len(backend), len(dtype), int(filtered)])
    n, dim, k = 3000, 96, 17
    x = unit_rows(rng, n, dim)
    ids = rng.choice(10**12, size=n, replace=False).astype(np.int64)
    ns = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 7], dtype=np.uint64)[rng.integers(0, 3, size=n)]
    _, hot = start(dim=dim, capacity=n, dtype=dtype, backend=backend)
    assert hot.upsert(ids, x, ns).size == 0
    stored = x.astype(np.float16).astype(np.float32) if dtype == "f16" else x
    tol = 2e-3 if dtype == "f16" else 1e-5
    for qi in range(20):
        q = unit_rows(rng, 1, dim)[0]
        want_ns = int(ns[qi]) if filtered else None
        mask = (ns == ns[qi]) if filtered else None
        exp_ids, exp_scores = exact_topk(stored, ids, q, k, mask)
        got = hot.search(q, k=k, namespace_hash=want_ns)
        assert_same_topk(got, exp_ids, exp_scores, stored, ids, q, tol)


def assert_same_topk(got, exp_ids, exp_scores, stored, ids, q, tol):
    """Equal up to near-ties: same scores, every returned id truly scores what was reported, and
    every id clearly above the k-th score is present."""
    n = got.hits
    assert n == len(exp_ids)
    got_ids, got_scores = got.ids[0, :n], got.scores[0, :n]
    np.testing.assert_allclose(got_scores, exp_scores, rtol=0, atol=tol)
    assert np.all(np.diff(got_scores) <= 0), "best first"
    row_of = {int(i): r for r, i in enumerate(ids)}
    true_scores = np.array([stored[row_of[int(i)]] @ q for i in got_ids])
    np.testing.assert_allclose(got_scores, true_scores, rtol=0, atol=tol)
    clearly_in = set(exp_ids[exp_scores > exp_scores[-1] + 2 * tol].tolist())
    assert clearly_in <= set(got_ids.tolist())


def test_batched_queries_and_short_results(start):
    rng = np.random.default_rng(7)
    _, hot = start(dim=16, capacity=100)
    x = unit_rows(rng, 5, 16)
    hot.upsert(np.arange(5), x, 1)
    res = hot.search(x[:3].copy(), k=10)
    assert res.ids.shape == (3, 10) and res.hits == 5
    assert list(res.ids[:, 0]) == [0, 1, 2]
    assert (res.ids[:, 5:] == -1).all() and np.isneginf(res.scores[:, 5:]).all()
    empty = hot.search(x[0].copy(), k=3, namespace_hash=999)
    assert empty.hits == 0


def test_results_are_the_callers_own_across_changing_k(start):
    """One thread's searches share the client's scratch buffers (one tr_search_call, views kept per k): each
    result must be a copy of exactly k entries that a later search, with another k, does not overwrite."""
    rng = np.random.default_rng(11)
    dim, n = 32, 200
    _, hot = start(dim=dim, capacity=n)
    x = unit_rows(rng, n, dim)
    ids = np.arange(1000, 1000 + n, dtype=np.int64)
    hot.upsert(ids, x, 1)
    queries = unit_rows(rng, 6, dim)
    kept = []
    for q, k in zip(queries, (3, 7, 3, 1, 7, 12)):
        got = hot.search(q, k=k)
        exp_ids, exp_scores = exact_topk(x, ids, q, k)
        assert got.ids.shape == (1, k) and got.scores.shape == (1, k)
        np.testing.assert_array_equal(got.ids[0], exp_ids)
        np.testing.assert_allclose(got.scores[0], exp_scores, rtol=0, atol=1e-5)
        kept.append((got, exp_ids.copy()))
    for got, exp_ids in kept:  # earlier results are untouched by the searches after them
        np.testing.assert_array_equal(got.ids[0], exp_ids)
    batch = hot.search(queries[:2].copy(), k=4)  # several queries: their own buffers, not the scratch
    for row, q in enumerate(queries[:2]):
        np.testing.assert_array_equal(batch.ids[row], exact_topk(x, ids, q, 4)[0])


def test_every_way_of_waiting_gets_the_answer(start, segment_name):
    """A client waits by spinning, then polling with sched_yield, then sleeping on the slot's futex: each phase
    alone must see the answer (spin 0 and yield 0 sleeps at once; spin 0 and a long yield polls), for searches
    and for the other calls; out-of-range wait settings are refused at attach, naming the fix."""
    rng = np.random.default_rng(13)
    dim, n = 24, 300
    _, hot = start(dim=dim, capacity=n)
    x = unit_rows(rng, n, dim)
    ids = np.arange(n, dtype=np.int64)
    hot.upsert(ids, x, 1)
    queries = unit_rows(rng, 20, dim)
    for spin_us, yield_us in ((0, 0), (0, 10_000), (None, None)):
        other = HotTier.attach(segment_name, spin_us=spin_us, yield_us=yield_us)
        try:
            for q in queries:
                np.testing.assert_array_equal(other.search(q, k=5).ids[0], exact_topk(x, ids, q, 5)[0])
            other.upsert([10_000], queries[:1], 1)  # the other calls wait the same way
            assert other.search(queries[0], k=1).ids[0, 0] == 10_000
            other.delete([10_000])
            assert other.search(queries[0], k=1).ids[0, 0] != 10_000
        finally:
            other.close()
    for bad in ({"spin_us": -1}, {"yield_us": -5}, {"yield_us": 1e9}):
        with pytest.raises(InvalidInput, match="out of range"):
            HotTier.attach(segment_name, **bad)


def test_ties_broken_by_smaller_id(start):
    _, hot = start(dim=4, capacity=10)
    v = np.array([[1, 0, 0, 0]] * 4, dtype=np.float32)
    hot.upsert([40, 10, 30, 20], v, 5)
    res = hot.search(v[0].copy(), k=3)
    assert list(res.ids[0]) == [10, 20, 30]


def test_upsert_replaces_delete_removes_and_counts(start):
    rng = np.random.default_rng(3)
    _, hot = start(dim=8, capacity=50)
    x = unit_rows(rng, 10, 8)
    hot.upsert(np.arange(10), x, [1] * 5 + [2] * 5)
    assert hot.namespace_rows(1)[0] == 5 and hot.namespace_rows(2)[0] == 5
    # replace id 3's vector and move it to namespace 2
    hot.upsert([3], x[9:10], 2)
    assert hot.namespace_rows(1)[0] == 4 and hot.namespace_rows(2)[0] == 6
    res = hot.search(x[9].copy(), k=2)
    assert set(res.ids[0]) == {3, 9}
    assert hot.delete([3, 4, 999]) == 2
    assert list(hot.contains([2, 3, 4, 5])) == [True, False, False, True]
    assert hot.stats()["hot_rows"] == 8
    assert hot.clear() == 8
    assert hot.stats()["hot_rows"] == 0 and hot.namespace_rows(1)[0] == 0



@pytest.mark.parametrize("backend", BACKENDS)
def test_replacing_the_last_row_while_a_full_tier_evicts_keeps_the_new_vector(start, backend):
    """A full tier takes a batch that replaces the row in its last position and adds a new one: making room evicts
    the least recently used row by moving the last row into its place, so the replaced row moves before its new
    vector is written. Found by the random interleavings: the old vector and namespace stayed searchable."""
    rng = np.random.default_rng(12)
    dim = 8
    _, hot = start(dim=dim, capacity=4, backend=backend)
    x = unit_rows(rng, 6, dim)
    hot.upsert(np.arange(1, 5), x[:4], 1)  # rows 0..3 hold ids 1..4; id 1 is the least recently used
    evicted = hot.upsert([4, 5], x[4:6], [2, 2])  # id 4 replaced (new vector, namespace 2), id 5 new
    assert evicted.tolist() == [1]
    assert sorted(hot.list_ids().tolist()) == [2, 3, 4, 5]
    assert sorted(hot.list_ids(2).tolist()) == [4, 5] and hot.namespace_rows(2)[0] == 2
    res = hot.search(x[4].copy(), k=1, namespace_hash=2)
    assert res.ids[0, 0] == 4 and res.scores[0, 0] == pytest.approx(1.0, abs=2e-3)
    res = hot.search(x[3].copy(), k=4, namespace_hash=1)  # id 4's old vector and namespace are gone
    assert 4 not in res.ids[0, : res.hits].tolist()
    res = hot.search(x[5].copy(), k=1)
    assert res.ids[0, 0] == 5 and res.scores[0, 0] == pytest.approx(1.0, abs=2e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_list_ids_pages_through_every_row_and_filters_by_namespace(start, backend):
    """LIST_IDS (the coordinator's repair of a stale namespace reads it) returns each hot row once, across pages,
    and only the asked namespace's rows when filtered; deletes and moves between namespaces show at once."""
    rng = np.random.default_rng(11)
    dim, n = 4, 70_000  # more ids than one 256 KiB slot holds (32,767), so the listing takes three pages
    _, hot = start(dim=dim, capacity=n, backend=backend)
    ids = rng.choice(10**15, size=n, replace=False).astype(np.int64)
    ns = np.where(np.arange(n) % 7 == 0, 5, 6).astype(np.uint64)
    for lo in range(0, n, 10_000):
        hot.upsert(ids[lo:lo + 10_000], unit_rows(rng, min(10_000, n - lo), dim), ns[lo:lo + 10_000])
    listed = hot.list_ids()
    assert listed.shape == (n,) and set(listed.tolist()) == set(ids.tolist())
    assert sorted(hot.list_ids(5).tolist()) == sorted(ids[ns == 5].tolist())
    assert hot.list_ids(12345).size == 0
    gone, moved = ids[ns == 5][:3], ids[ns == 6][:2]
    hot.delete(gone)
    hot.upsert(moved, unit_rows(rng, 2, dim), 5)
    want = (set(ids[ns == 5].tolist()) - set(gone.tolist())) | set(moved.tolist())
    assert sorted(hot.list_ids(5).tolist()) == sorted(want)
    assert hot.list_ids().shape == (n - 3,)
    hot.clear()
    assert hot.list_ids().size == 0

@pytest.mark.parametrize("backend", BACKENDS)
def test_full_tier_evicts_least_recently_used(start, backend):
    rng = np.random.default_rng(4)
    _, hot = start(dim=8, capacity=4, dtype="f16", backend=backend)
    x = unit_rows(rng, 7, 8)
    hot.upsert([0, 1, 2, 3], x[:4], 1)
    hot.search(x[0].copy(), k=1)  # touches id 0: now most recent
    evicted = hot.upsert([4, 5], x[4:6], 1)
    assert sorted(evicted) == [1, 2]
    assert list(hot.contains([0, 1, 2, 3, 4, 5])) == [True, False, False, True, True, True]
    # searches with touch=False leave the order alone
    hot.search(x[3].copy(), k=1, touch=False)
    assert list(hot.upsert([6], x[6:7], 1)) == [3]
    with pytest.raises(HotTierFull):
        hot.upsert(np.arange(100, 105), unit_rows(rng, 5, 8), 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_search_of_several_queries_touches_each_querys_hits(start, backend):
    rng = np.random.default_rng(5)
    _, hot = start(dim=8, capacity=4, dtype="f16", backend=backend)
    x = unit_rows(rng, 6, 8)
    hot.upsert([0, 1, 2, 3], x[:4], 1)
    assert hot.search(np.stack([x[0], x[2]]), k=1).ids[:, 0].tolist() == [0, 2]  # touches ids 0 and 2
    assert sorted(hot.upsert([4, 5], x[4:6], 1)) == [1, 3]


def test_normalise_on_request(start):
    _, hot = start(dim=3, capacity=10)
    hot.upsert([1, 2], np.array([[3, 0, 0], [0, 0, 5]], dtype=np.float32), 1, normalize=True)
    res = hot.search(np.array([2, 0, 0], dtype=np.float32), k=2, normalize=True)
    assert list(res.ids[0]) == [1, 2]
    np.testing.assert_allclose(res.scores[0], [1.0, 0.0], atol=1e-6)


def test_client_validates_inputs(start):
    _, hot = start(dim=8, capacity=10)
    good = np.full(8, 1 / np.sqrt(8), dtype=np.float32)
    with pytest.raises(InvalidInput, match="float32"):
        hot.search(good.astype(np.float64))
    with pytest.raises(InvalidInput, match="shape"):
        hot.search(np.ones(7, dtype=np.float32))
    with pytest.raises(InvalidInput, match="k="):
        hot.search(good, k=0)
    with pytest.raises(InvalidInput, match="k="):
        hot.search(good, k=L.MAX_K + 1)
    with pytest.raises(InvalidInput, match="NaN"):
        hot.search(np.full(8, np.nan, dtype=np.float32))
    with pytest.raises(InvalidInput, match="NaN"):
        hot.upsert([1], np.full((1, 8), np.inf, dtype=np.float32), 1)
    with pytest.raises(InvalidInput, match="shape"):
        hot.upsert([1, 2], np.ones((1, 8), dtype=np.float32), 1)
    with pytest.raises(InvalidInput, match="integers"):
        hot.delete(np.array([1.5]))
    assert hot.stats()["hot_rows"] == 0


def test_sidecar_finds_every_bad_value_in_a_query(start):
    """The sidecar's vector check runs in 8 lanes plus a tail: a NaN or infinity anywhere in a 13-dim query (lanes
    and tail) is refused and named by its position; a zero query cannot be normalised; a huge finite one can."""
    _, hot = start(dim=13, capacity=10)
    hot.upsert([1, 2], np.eye(13, dtype=np.float32)[[0, 12]], 1)
    for j in range(13):
        for bad in (np.nan, np.inf, -np.inf):
            q = np.full(13, 0.1, dtype=np.float32)
            q[j] = bad
            with pytest.raises(InvalidInput, match=f"NaN or infinite value at {j}:"):
                hot.search(q, k=2)
    with pytest.raises(InvalidInput, match="all zeros"):
        hot.search(np.zeros(13, dtype=np.float32), k=2, normalize=True)
    huge = np.zeros(13, dtype=np.float32)
    huge[12] = 3e38  # its square overflows float32; the norm is summed in double
    res = hot.search(huge, k=2, normalize=True)
    assert list(res.ids[0]) == [2, 1]
    np.testing.assert_allclose(res.scores[0], [1.0, 0.0], atol=1e-6)


def test_attach_refuses_wrong_dim_and_missing(start, segment_name):
    start(dim=8, capacity=10)
    with pytest.raises(IncompatibleLayout, match="dim 8"):
        HotTier.attach(segment_name, dim=16)
    with pytest.raises(SidecarUnavailable, match="no sidecar segment"):
        HotTier.attach(segment_name + "-absent")
    with pytest.raises(InvalidInput):
        HotTier.attach("../etc/passwd")


def test_second_sidecar_on_same_name_is_refused(start, segment_name):
    start(dim=8, capacity=10)
    with pytest.raises(SidecarUnavailable, match="live sidecar"):
        start_sidecar(segment_name, dim=8, capacity=10)


def test_the_namespace_table_fills_and_then_says_so(start):
    """Every namespace the table takes reads back its own totals (the probe finds each past collisions), a full table
    refuses the next one with a message naming --namespaces, and the namespaces already there keep working."""
    proc, hot = start(dim=8, capacity=16)  # a table of 4,096 entries, the smallest
    entries = 4096
    assert hot._ns_table.shape == (entries,)
    totals = {h: h % 97 + 1 for h in range(1, entries + 1)}
    hot.set_namespace_totals(totals)
    assert all(hot.namespace_rows(h) == (0, t) for h, t in totals.items())
    full = r"namespace table \(4096 entries\) is full: restart the sidecar with more --namespaces"
    with pytest.raises(SidecarError, match=full):
        hot.set_namespace_totals({entries + 1: 3})
    rng = np.random.default_rng(2)
    hot.upsert(np.arange(4), unit_rows(rng, 4, 8), 5)
    assert hot.namespace_rows(5) == (4, totals[5])
    assert hot.search(unit_rows(rng, 1, 8)[0], k=4, namespace_hash=5).hits == 4
