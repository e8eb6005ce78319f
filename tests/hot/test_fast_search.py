"""HotTier.search's compiled fast path (native/src/fastsearch.c) against its ctypes path: built, same answers, same errors."""
from __future__ import annotations

import sysconfig
import threading
from pathlib import Path

import numpy as np
import pytest

from tiered_recall.hot import layout as L
from tiered_recall.hot.native import fast_search_module
from tiered_recall.errors import InvalidInput, SidecarUnavailable
from tiered_recall.hot import HotTier, SearchResult

BACKENDS = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


def unit_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def both_paths(hot: HotTier, queries, *, k: int, normalize: bool = False, touch: bool = True,
               namespace_hash: int | None = None) -> tuple[SearchResult, SearchResult]:
    """The same search through the fast path (which must take it, not hand it back), then through ctypes."""
    fast = hot._fast
    assert fast is not None
    first = fast.search(queries, k, normalize, touch, namespace_hash)
    assert type(first) is SearchResult, f"the fast path handed the search back: {first!r}"
    kwargs = {"k": k, "normalize": normalize, "touch": touch, "namespace_hash": namespace_hash}
    hot._fast = None
    try:
        second = hot.search(queries, **kwargs)
    finally:
        hot._fast = fast
    return first, second


def error_of(hot: HotTier, use_fast: bool, *args, **kwargs) -> Exception:
    fast = hot._fast
    if not use_fast:
        hot._fast = None
    try:
        hot.search(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - compared by type and message below
        return exc
    finally:
        hot._fast = fast
    raise AssertionError("search did not raise")


def test_the_fast_path_is_built_where_python_has_headers_and_numpy(start):
    has_headers = (Path(sysconfig.get_paths()["include"]) / "Python.h").exists()
    if not has_headers:
        pytest.skip("this Python has no headers: the build leaves the fast path out and searches go through ctypes")
    module = fast_search_module()
    assert module is not None, "Python.h and numpy are here, so `pip install .` must have built _trfast"
    assert module.LAYOUT_VERSION == L.LAYOUT_VERSION
    _, hot = start(dim=8, capacity=16)
    assert hot._fast is not None and hot.search_path == "compiled"
    hot._fast, fast = None, hot._fast
    assert hot.search_path == "ctypes"
    hot._fast = fast


@pytest.fixture
def loaded(start, request):
    backend = getattr(request, "param", "cpu")
    if fast_search_module() is None:
        pytest.skip("the fast path is not built here (no Python headers)")
    rng = np.random.default_rng(7)
    n, dim = 2000, 64
    x = unit_rows(rng, n, dim)
    ids = rng.choice(10**12, size=n, replace=False).astype(np.int64)
    ns = np.array([11, 12 + (1 << 63)], dtype=np.uint64)[rng.integers(0, 2, size=n)]
    _, hot = start(dim=dim, capacity=n, dtype="f16", backend=backend)
    hot.upsert(ids, x, ns)
    return hot, rng, dim


@pytest.mark.parametrize("loaded", BACKENDS, indirect=True)
def test_fast_and_ctypes_paths_give_the_same_answers(loaded):
    hot, rng, dim = loaded
    for k in (1, 10, hot.max_k):
        q = unit_rows(rng, 1, dim)[0]
        for kwargs in ({}, {"namespace_hash": 12 + (1 << 63)}, {"namespace_hash": -1}, {"touch": False}):
            a, b = both_paths(hot, q, k=k, **kwargs)
            assert a.ids.shape == b.ids.shape == (1, k) and a.ids.dtype == np.int64 and a.scores.dtype == np.float32
            np.testing.assert_array_equal(a.ids, b.ids)
            np.testing.assert_array_equal(a.scores, b.scores)
            assert a.hits == b.hits
    # a batch, a 2-D single query, and a query the sidecar normalises
    batch = unit_rows(rng, 5, dim)
    a, b = both_paths(hot, batch, k=7)
    assert a.ids.shape == (5, 7)
    np.testing.assert_array_equal(a.ids, b.ids)
    a, b = both_paths(hot, batch[:1], k=3)
    np.testing.assert_array_equal(a.ids, b.ids)
    a, b = both_paths(hot, batch[0] * 5.0, k=4, normalize=True)
    np.testing.assert_array_equal(a.ids, b.ids)
    assert a.hits == 4
    # -1 and -inf past the hits: a namespace no row has
    a, b = both_paths(hot, batch[0], k=4, namespace_hash=99)
    assert a.hits == b.hits == 0
    np.testing.assert_array_equal(a.ids, np.full((1, 4), -1))
    assert np.all(np.isneginf(a.scores))


def test_fast_results_are_fresh_arrays(loaded):
    hot, rng, dim = loaded
    q = unit_rows(rng, 2, dim)
    first = hot.search(q[0], k=5)
    kept = first.ids.copy()
    second = hot.search(q[1], k=5)
    np.testing.assert_array_equal(first.ids, kept)  # the next search did not write into the last result
    assert first.ids.flags.c_contiguous and first.ids.flags.writeable and first.ids.flags.owndata
    assert not np.shares_memory(first.ids, second.ids)


@pytest.mark.parametrize(
    "make_query, kwargs",
    [
        (lambda q: q.astype(np.float64), {}),                       # wrong dtype
        (lambda q: np.repeat(q, 2)[::2], {}),                       # not contiguous
        (lambda q: q[:-1].copy(), {}),                              # wrong dim
        (lambda q: np.empty((0, q.size), np.float32), {}),          # no query
        (lambda q: q.astype(">f4"), {}),                            # float32 of the other byte order
        (lambda q: q, {"k": 0}),
        (lambda q: q, {"k": 10**6}),
        (lambda q: q, {"k": 2.0}),
        (lambda q: np.full_like(q, np.nan), {}),                    # refused by the sidecar itself
        (lambda q: np.zeros_like(q), {"normalize": True}),
        (lambda q: q.tolist(), {}),                                 # not an array at all
    ],
    ids=["f64", "strided", "dim", "empty", "big-endian", "k0", "k-huge", "k-float", "nan", "zero", "list"],
)
def test_fast_path_raises_what_the_ctypes_path_raises(loaded, make_query, kwargs):
    hot, rng, dim = loaded
    query = make_query(unit_rows(rng, 1, dim)[0])
    fast_error = error_of(hot, True, query, **kwargs)
    slow_error = error_of(hot, False, query, **kwargs)
    assert isinstance(fast_error, InvalidInput)
    assert type(fast_error) is type(slow_error) and str(fast_error) == str(slow_error)


def test_too_large_a_batch_is_refused_with_the_limit(loaded):
    hot, rng, dim = loaded
    too_many = unit_rows(rng, hot.max_search_queries + 1, dim)
    with pytest.raises(InvalidInput, match=f"at most {hot.max_search_queries}"):
        hot.search(too_many, k=hot.max_k)


def test_fast_path_after_close_and_after_the_sidecar_died(start, segment_name):
    if fast_search_module() is None:
        pytest.skip("the fast path is not built here (no Python headers)")
    proc, hot = start(dim=16, capacity=32)
    hot.upsert([1, 2], unit_rows(np.random.default_rng(0), 2, 16), 5)
    q = unit_rows(np.random.default_rng(1), 1, 16)[0]
    other = HotTier.attach(segment_name, timeout_s=2.0)
    assert other._fast is not None and other.search(q, k=2).hits == 2
    other.close()
    with pytest.raises(SidecarUnavailable, match="closed"):
        other.search(q, k=2)
    proc.kill()
    with pytest.raises(SidecarUnavailable, match="not running"):
        hot.search(q, k=2)


def test_fast_path_from_many_threads_at_once(loaded):
    hot, rng, dim = loaded
    queries = unit_rows(rng, 64, dim)
    hot._fast, fast = None, hot._fast
    expected = [hot.search(q, k=8).ids for q in queries]  # through ctypes, one at a time
    hot._fast = fast
    wrong: list[int] = []

    def worker(offset: int) -> None:
        for rep in range(30):
            i = (offset + rep) % len(queries)
            if not np.array_equal(hot.search(queries[i], k=8).ids, expected[i]):
                wrong.append(i)

    threads = [threading.Thread(target=worker, args=(t * 7,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_a_fast_path_from_another_version_is_not_used(monkeypatch):
    from tiered_recall.hot import native as _native

    if _native.fast_search_module() is None:
        pytest.skip("the fast path is not built here (no Python headers)")
    monkeypatch.setattr(_native, "FAST_SEARCH_API", _native.FAST_SEARCH_API + 1)
    _native.fast_search_module.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="another version of the package"):
            assert _native.fast_search_module() is None
    finally:
        monkeypatch.undo()
        _native.fast_search_module.cache_clear()
    assert _native.fast_search_module() is not None


def test_the_result_is_built_in_place_for_searchresult_and_by_a_call_otherwise(loaded):
    """SearchResult (four object slots) is filled in place, without calling the class; any other result_type is
    called as result_type(ids, scores, hits, service_ns). Both carry the same answer."""
    hot, rng, dim = loaded
    q = unit_rows(rng, 1, dim)[0]
    first = hot._fast.search(q, 5, False, False, None)
    assert type(first) is SearchResult
    assert first.ids.dtype == np.int64 and first.scores.dtype == np.float32 and first.ids.shape == (1, 5)
    assert first.hits == 5 and type(first.hits) is int and type(first.service_ns) is int and first.service_ns > 0
    calls = []

    def make(ids, scores, hits, service_ns):
        calls.append((hits, service_ns))
        return ("made", ids, scores)

    other = fast_search_module().FastClient(hot._base, hot._pid, hot._timeout_ns, hot._spin_ns, hot._yield_ns, make)
    try:
        made = other.search(q, 5, False, False, None)
    finally:
        assert other.close(5.0)
    assert made[0] == "made" and len(calls) == 1 and calls[0][0] == 5
    np.testing.assert_array_equal(made[1], first.ids)
    np.testing.assert_array_equal(made[2], first.scores)


def test_a_class_with_the_four_slots_is_filled_without_its_init_running(loaded):
    """The stable ABI hides where a class keeps its slots; FastClient finds them on a probe instance, so a subclass of
    SearchResult (same slots) is filled in place, and a class keeping the names in a __dict__ is called."""
    hot, rng, dim = loaded
    q = unit_rows(rng, 1, dim)[0]
    expected = hot._fast.search(q, 5, False, False, None)

    class Counted(SearchResult):
        __slots__ = ()
        inits = []

        def __init__(self, *fields):
            Counted.inits.append(fields)
            super().__init__(*fields)

    class Plain:
        inits = []

        def __init__(self, ids, scores, hits, service_ns):
            Plain.inits.append(hits)
            self.ids, self.scores, self.hits, self.service_ns = ids, scores, hits, service_ns

    for result_type, init_runs in ((Counted, False), (Plain, True)):
        client = fast_search_module().FastClient(hot._base, hot._pid, hot._timeout_ns, hot._spin_ns, hot._yield_ns,
                                                 result_type)
        try:
            got = client.search(q, 5, False, False, None)
        finally:
            assert client.close(5.0)
        assert type(got) is result_type and len(result_type.inits) == (1 if init_runs else 0)
        np.testing.assert_array_equal(got.ids, expected.ids)
        np.testing.assert_array_equal(got.scores, expected.scores)
        assert got.hits == 5 and type(got.service_ns) is int and got.service_ns > 0
