"""The CUDA backend's int8 codes (--codes int8) answer what the f16 scan answers (GPU machine only).

Two CUDA sidecars get the same rows and operations, one scanning the codes first (codes_min_rows=0) and one with
--codes off. One query at a time, the codes' re-rank repeats the f16 scan's arithmetic step for step, so ids and
scores must be that scan's to the bit; batches of 3 and 16 queries (the f16 scan sums two query tiles otherwise), 8
threads at once and filtered searches are checked against exact search in float64 over the same f16 rows (a swap
within the f16 rounding of the query is a tie, as in test_cuda_filtered.py). Rows too alike for 8 bits fall back to
the f16 scan; k above 32 and tiers below --codes-min-rows take it at once.
"""
from __future__ import annotations

import threading
import uuid

import numpy as np
import pytest

from tiered_recall.hot import HotTier, start_sidecar

pytestmark = pytest.mark.gpu

DIM, K = 768, 10
TIE_TOL = 2e-3
N = 24_000  # past the persistent kernel's split build (its row cache holds about 12k rows at 768 dims)


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def data(kind: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if kind == "random":
        return unit(rng.random((n, DIM)) - 0.5), unit(rng.random((40, DIM)) - 0.5)
    if kind in ("clustered", "tight-clusters"):
        # a row is its cluster's centre plus noise of norm w; at w = 0.25 a cluster's scores spread about 0.002, a
        # quarter of the codes' bound at 768 dims (about 0.0085): 1,500 rows each too alike for 8 bits
        w = 1.0 if kind == "clustered" else 0.25
        c = unit(rng.standard_normal((16, DIM)))
        return (unit(c[rng.integers(0, 16, n)] + w * unit(rng.standard_normal((n, DIM)))),
                unit(c[rng.integers(0, 16, 40)] + w * unit(rng.standard_normal((40, DIM)))))
    if kind == "near-duplicates":
        base = unit(rng.standard_normal((40, DIM)))
        x = unit(rng.standard_normal((n, DIM)))
        x[:4000] = unit(np.repeat(base, 100, axis=0) + 1e-3 * rng.standard_normal((4000, DIM)))
        return x, unit(base[rng.integers(0, 40, 40)] + 0.05 * rng.standard_normal((40, DIM)))
    if kind == "exact-duplicates":
        x = np.repeat(unit(rng.standard_normal((n // 40, DIM))), 40, axis=0)
        return x, unit(x[rng.integers(0, n, 40)] + 0.3 * unit(rng.standard_normal((40, DIM))))
    if kind == "any-norm":
        x = rng.standard_normal((n, DIM)) * np.exp(rng.uniform(np.log(1e-2), np.log(1e2), (n, 1)))
        return x.astype(np.float32), (rng.standard_normal((40, DIM)) * 3.0).astype(np.float32)
    raise ValueError(kind)


def exact(rows16: np.ndarray, q: np.ndarray, ids: np.ndarray, k: int):
    s = rows16.astype(np.float64) @ q.astype(np.float16).astype(np.float64)
    return ids[np.lexsort((ids, -s))[:k]], s


def assert_exact(got: np.ndarray, rows16: np.ndarray, q: np.ndarray, ids: np.ndarray, k: int) -> None:
    want, s = exact(rows16, q, ids, k)
    got = got[got >= 0]
    if set(got.tolist()) != set(want.tolist()):
        score = dict(zip(ids.tolist(), s.tolist()))
        gap = max(score[i] for i in want if i not in set(got.tolist())) - min(score[i] for i in got)
        assert gap <= TIE_TOL * max(1.0, np.abs(s).max()), (gap, got, want)


class Pair:
    def __init__(self, cuda_options: dict, capacity: int, **kwargs) -> None:
        self.procs, self.hots = [], []
        for codes in ("int8", "off"):
            name = f"t-{uuid.uuid4().hex[:12]}"
            self.procs.append(start_sidecar(name, dim=DIM, capacity=capacity, backend="cuda", codes=codes,
                                            codes_min_rows=0, **cuda_options, **kwargs))
            self.hots.append(HotTier.attach(name, timeout_s=60))
        assert [h.codes for h in self.hots] == ["int8", "off"]

    def each(self, fn):
        return [fn(h) for h in self.hots]

    def load(self, x: np.ndarray, ns=1, start: int = 0) -> None:
        for lo in range(0, x.shape[0], 8192):
            hi = min(x.shape[0], lo + 8192)
            part = ns if isinstance(ns, int) else ns[lo:hi]
            self.each(lambda h: h.upsert(np.arange(start + lo, start + hi), x[lo:hi], part))

    def same(self, q: np.ndarray, k: int, namespace_hash: int | None = None):
        """One query: the codes' answer is the f16 scan's, ids and scores, to the bit."""
        got, want = self.each(lambda h: h.search(q, k=k, namespace_hash=namespace_hash, touch=False))
        assert np.array_equal(got.ids, want.ids), (got.ids, want.ids)
        assert np.array_equal(got.scores, want.scores), np.abs(got.scores - want.scores).max()
        return got

    def close(self) -> None:
        for h in self.hots:
            h.close()
        for p in self.procs:
            p.stop()


@pytest.fixture
def pair(cuda_options):
    made: list[Pair] = []

    def _make(capacity: int = N, **kwargs) -> Pair:
        made.append(Pair(cuda_options, capacity, **kwargs))
        return made[-1]

    yield _make
    for p in made:
        p.close()


@pytest.mark.parametrize("kind", ["random", "clustered", "near-duplicates", "exact-duplicates", "any-norm"])
def test_one_query_at_a_time_answers_the_f16_scans_ids_and_scores(pair, kind):
    rng = np.random.default_rng(["random", "clustered", "near-duplicates", "exact-duplicates", "any-norm"].index(kind))
    x, queries = data(kind, N, rng)
    p = pair()
    p.load(x)
    rows16 = x.astype(np.float16)
    for i, q in enumerate(queries[:24]):
        got = p.same(q, (1, K, 32)[i % 3])
        assert_exact(got.ids[0], rows16, q, np.arange(N), (1, K, 32)[i % 3])
    st = p.hots[0].stats()
    assert st["code_scans"] == 24 and st["code_fallbacks"] == 0, st


def test_batches_and_threads(pair):
    """Batches of 3 (a launched merge a query) and 16 (two query tiles), and 8 threads whose searches the sidecar
    gathers into passes: exact against float64, and the same ids as the f16 scan up to ties."""
    rng = np.random.default_rng(7)
    x, queries = data("clustered", N, rng)
    p = pair()
    p.load(x)
    rows16 = x.astype(np.float16)
    ids = np.arange(N)
    for lo, n in ((0, 3), (3, 16)):
        got = p.hots[0].search(np.ascontiguousarray(queries[lo:lo + n]), k=K)
        for j in range(n):
            assert_exact(got.ids[j], rows16, queries[lo + j], ids, K)
    answers, lock = [], threading.Lock()

    def client(part: np.ndarray) -> None:
        for q in part:
            r = p.hots[0].search(q, k=K)
            with lock:
                answers.append((q, r.ids[0]))

    threads = [threading.Thread(target=client, args=(queries[j::8],)) for j in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == len(queries)
    for q, got in answers:
        assert_exact(got, rows16, q, ids, K)
    st = p.hots[0].stats()
    assert st["code_scans"] == 19 + len(queries) and st["code_fallbacks"] == 0, st


def test_filtered_searches(pair):
    rng = np.random.default_rng(3)
    n = 40_000
    x, queries = data("random", n, rng)
    u = rng.random(n)
    ns = np.where(u < 0.01, 11, np.where(u < 0.11, 12, np.where(u < 0.61, 13, 14))).astype(np.uint64)
    ns[[5, 900, 17_000]] = 15  # three rows: fewer than k
    p = pair(capacity=n)
    p.load(x, ns)
    rows16 = x.astype(np.float16)
    for h in (11, 12, 13, 15):
        scope = np.flatnonzero(ns == h)
        for q in queries[:8]:
            got = p.same(q, K, namespace_hash=h)
            assert set(got.ids[0][got.ids[0] >= 0].tolist()) <= set(scope.tolist())
            assert_exact(got.ids[0], rows16[scope], q, scope, K)
        batch = p.hots[0].search(np.ascontiguousarray(queries[8:24]), k=K, namespace_hash=h)
        for j in range(16):
            assert_exact(batch.ids[j], rows16[scope], queries[8 + j], scope, K)
    assert p.hots[0].stats()["code_fallbacks"] == 0


@pytest.mark.parametrize("kind", ["one vector", "tight-clusters"])
def test_rows_too_alike_fall_back_to_the_f16_scan(pair, kind):
    """Every row within 1e-4 of one vector (the scan's candidate lists overflow: every block stops), or clusters of
    1,500 rows whose scores spread less than the codes' bound (more candidates than the merge re-scores): the f16
    scan answers, the same answer, and the next batches take it at once for a while."""
    rng = np.random.default_rng(2)
    if kind == "one vector":
        base = unit(rng.standard_normal((1, DIM)))
        x = unit(base + 1e-4 * rng.standard_normal((N, DIM)))
        queries = unit(base + 0.5 * rng.standard_normal((20, DIM)))
    else:
        x, queries = data(kind, N, rng)
    p = pair()
    p.load(x)
    for q in queries[:20]:
        got = p.same(q, K)
        assert_exact(got.ids[0], x.astype(np.float16), q, np.arange(N), K)
    st = p.hots[0].stats()
    assert st["code_fallbacks"] >= 1
    assert st["code_scans"] == st["code_fallbacks"] < 20, st  # then the f16 scan at once, for a while


def test_moves_deletes_replacements_and_evictions_keep_the_codes_in_step(pair):
    rng = np.random.default_rng(11)
    x, queries = data("clustered", 40_000, rng)
    p = pair(capacity=30_000)
    p.load(x[:24_000])
    for round_ in range(3):
        dead = rng.choice(24_000, 2000, replace=False)
        p.each(lambda h: h.delete(dead))
        again = rng.choice(24_000, 1000, replace=False)
        fresh = unit(rng.standard_normal((1000, DIM)))
        p.each(lambda h: h.upsert(again, fresh, 2))
        lo = 24_000 + 5000 * round_
        p.load(x[lo:lo + 5000], 1, lo)  # the last round passes the capacity: evictions
        for q in queries[:6]:
            p.same(q, K)
            p.same(q, K, namespace_hash=2)
    assert p.hots[0].stats()["code_fallbacks"] == 0


def test_k_above_32_and_small_tiers_take_the_f16_scan(start, cuda_options):
    rng = np.random.default_rng(4)
    proc, hot = start(dim=DIM, capacity=40_000, backend="cuda", codes_min_rows=30_000, **cuda_options)
    assert hot.codes == "int8"
    x = unit(rng.random((40_000, DIM)) - 0.5)
    hot.upsert(np.arange(20_000), x[:20_000], 1)
    q = unit(rng.random((1, DIM)) - 0.5)[0]
    hot.search(q, k=K)
    assert hot.stats()["code_scans"] == 0  # below --codes-min-rows
    hot.upsert(np.arange(20_000, 40_000), x[20_000:], 1)
    hot.search(q, k=K)
    hot.search(q, k=64)
    assert hot.stats()["code_scans"] == 1
