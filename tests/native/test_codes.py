"""The CPU backend's int8 codes (--codes int8) answer exactly what the full scan of the rows answers.

Two sidecars get the same rows and the same operations, one scanning the codes first (codes_min_rows=0, so every
search takes that path) and one with --codes off; every search must return the same ids and the very same scores,
and the ids must be exact search's in float64 up to float32 ties. The data: random, clustered, near-duplicates,
rows of any norm (a zero row among them), exact duplicates (ties broken by the smaller id), and rows too alike for 8
bits to tell apart, where the scan of the codes gives up and the full scan answers (counted in stats()).
"""
from __future__ import annotations

import uuid
import zlib
from pathlib import Path

import numpy as np
import pytest

from tiered_recall.hot import HotTier, start_sidecar

K = 10
TIE_TOL = 1e-5  # float32 scores of unit vectors: a swap within this is a tie, not a miss


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def rows_of(kind: str, n: int, d: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(rows, queries) of one kind of data."""
    if kind == "random":
        return unit(rng.standard_normal((n, d))), unit(rng.standard_normal((24, d)))
    if kind == "clustered":
        centres = unit(rng.standard_normal((16, d)))
        x = unit(centres[rng.integers(0, 16, n)] + 0.25 * unit(rng.standard_normal((n, d))))
        return x, unit(centres[rng.integers(0, 16, 24)] + 0.25 * unit(rng.standard_normal((24, d))))
    if kind == "near-duplicates":  # 40 vectors with 100 copies each a hair apart, among random rows
        base = unit(rng.standard_normal((40, d)))
        x = unit(rng.standard_normal((n, d)))
        x[:4000] = unit(np.repeat(base, 100, axis=0) + 1e-3 * rng.standard_normal((4000, d)))
        return x, unit(base[rng.integers(0, 40, 24)] + 0.05 * rng.standard_normal((24, d)))
    if kind == "any-norm":  # rows and queries of norms from 1e-3 to 1e3, one row all zeros
        x = rng.standard_normal((n, d)) * np.exp(rng.uniform(np.log(1e-3), np.log(1e3), (n, 1)))
        x[7] = 0.0
        return x.astype(np.float32), (rng.standard_normal((24, d)) * 30.0).astype(np.float32)
    if kind == "exact-duplicates":  # equal scores: the smaller id comes first
        x = np.repeat(unit(rng.standard_normal((n // 50, d))), 50, axis=0)
        return x, unit(x[rng.integers(0, x.shape[0], 24)] + 0.3 * unit(rng.standard_normal((24, d))))
    raise ValueError(kind)


def exact_ids(x: np.ndarray, q: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    s = x.astype(np.float64) @ q.astype(np.float64)
    order = np.lexsort((ids, -s))[:k]
    return ids[order], s


class Pair:
    """The same store twice: scanning the codes first, and the rows only."""

    def __init__(self, dim: int, capacity: int, **kwargs) -> None:
        self.procs, self.hots = [], []
        for codes in ("int8", "off"):
            name = f"t-{uuid.uuid4().hex[:12]}"
            self.procs.append(start_sidecar(name, dim=dim, capacity=capacity, codes=codes, codes_min_rows=0,
                                            **kwargs))
            self.hots.append(HotTier.attach(name, timeout_s=60))
        assert [h.codes for h in self.hots] == ["int8", "off"]

    def each(self, fn):
        return [fn(h) for h in self.hots]

    def search(self, q: np.ndarray, k: int, namespace_hash: int | None = None):
        got, want = self.each(lambda h: h.search(q, k=k, namespace_hash=namespace_hash, touch=False))
        assert np.array_equal(got.ids, want.ids), (got.ids, want.ids)
        assert np.array_equal(got.scores, want.scores), (got.scores, want.scores)  # bit for bit
        return got

    def stats(self) -> dict:
        return self.hots[0].stats()

    def close(self) -> None:
        for h in self.hots:
            h.close()
        for p in self.procs:
            p.stop()


@pytest.fixture
def pair():
    made: list[Pair] = []

    def _make(**kwargs) -> Pair:
        made.append(Pair(**kwargs))
        return made[-1]

    yield _make
    for p in made:
        p.close()


def load(p: Pair, x: np.ndarray, ns: np.ndarray | int = 1, start: int = 0) -> None:
    for lo in range(0, x.shape[0], 4096):
        hi = min(x.shape[0], lo + 4096)
        part = ns if isinstance(ns, int) else ns[lo:hi]
        p.each(lambda h: h.upsert(np.arange(start + lo, start + hi), x[lo:hi], part))


@pytest.mark.parametrize("kind", ["random", "clustered", "near-duplicates", "any-norm", "exact-duplicates"])
@pytest.mark.parametrize("dtype,dim", [("f32", 384), ("f16", 100)])
def test_codes_answer_what_the_full_scan_answers(pair, kind, dtype, dim):
    rng = np.random.default_rng(zlib.crc32(f"{kind} {dtype} {dim}".encode()))
    n = 8000
    x, queries = rows_of(kind, n, dim, rng)
    p = pair(dim=dim, capacity=n, dtype=dtype, threads=2)
    load(p, x)
    stored = x.astype(np.float16).astype(np.float32) if dtype == "f16" else x
    ids = np.arange(n)
    for i, q in enumerate(queries):
        k = (1, K, 100)[i % 3]
        got = p.search(q, k)
        want, s = exact_ids(stored, q, ids, k)
        if not np.array_equal(got.ids[0], want):  # only float32 ties may swap
            assert np.sort(s[got.ids[0]])[0] >= np.sort(s[want])[0] - TIE_TOL * max(1.0, abs(s).max()), kind
    st = p.stats()
    assert st["code_scans"] == len(queries) and st["code_fallbacks"] == 0, st


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx-vnni", "avx512-vnni"])
def test_every_instruction_set_gives_the_same_answers(pair, isa):
    flag = {"avx2": "avx2", "avx-vnni": "avx_vnni", "avx512-vnni": "avx512_vnni"}.get(isa)
    if flag and flag not in Path("/proc/cpuinfo").read_text().split():
        pytest.skip(f"this CPU has no {isa}")
    rng = np.random.default_rng(5)
    x, queries = rows_of("clustered", 6000, 200, rng)
    p = pair(dim=200, capacity=6000, test_cpu_isa=isa)
    load(p, x)
    for q in queries[:8]:
        p.search(q, K)
    assert p.stats()["code_scans"] == 8


def test_filtered_searches(pair):
    """Namespaces of 0.5 %, 5 % and 50 % of the rows, spread over the rows: sparse blocks are scored from the rows,
    dense ones through the codes; a namespace of fewer rows than k returns them all."""
    rng = np.random.default_rng(3)
    n, dim = 24_000, 384
    x, queries = rows_of("random", n, dim, rng)
    u = rng.random(n)
    ns = np.where(u < 0.005, 11, np.where(u < 0.055, 12, np.where(u < 0.555, 13, 14))).astype(np.uint64)
    ns[[5, 900, 17_000]] = 15  # three rows
    p = pair(dim=dim, capacity=n, threads=2)
    load(p, x, ns)
    for h in (11, 12, 13, 15):
        scope = np.flatnonzero(ns == h)
        for q in queries[:6]:
            got = p.search(q, K, namespace_hash=h)
            want, _ = exact_ids(x[scope], q, scope, K)
            assert set(got.ids[0][got.ids[0] >= 0]) <= set(scope)
            assert got.ids[0][:min(K, scope.size)].tolist() == want.tolist()
    assert p.stats()["code_fallbacks"] == 0


def test_moves_deletes_replacements_and_evictions_keep_the_codes_in_step(pair):
    """Deletes move the last row into the hole, replacements rewrite a row in place, evictions free rows: the
    codes must follow every one, or the scan of the codes would bound the wrong vector."""
    rng = np.random.default_rng(11)
    dim, cap = 128, 9000
    x, queries = rows_of("clustered", 12_000, dim, rng)
    p = pair(dim=dim, capacity=cap)
    load(p, x[:8000])
    for round_ in range(4):
        dead = rng.choice(8000, 700, replace=False)
        p.each(lambda h: h.delete(dead))
        again = rng.choice(8000, 500, replace=False)
        fresh = unit(rng.standard_normal((500, dim)))
        p.each(lambda h: h.upsert(again, fresh, 2))
        lo = 8000 + 1000 * round_
        p.each(lambda h: h.upsert(np.arange(lo, lo + 1000), x[lo:lo + 1000], 1))  # past capacity: evicts
        for q in queries[:6]:
            p.search(q, K)
            p.search(q, K, namespace_hash=2)
    assert p.stats()["code_fallbacks"] == 0


def test_rows_too_alike_fall_back_to_the_full_scan(pair):
    """Every row within 1e-4 of one vector: every upper bound reaches the k-th lower bound, the candidates overflow
    and the full scan answers (the same answer); the next searches take the full scan at once for a while."""
    rng = np.random.default_rng(2)
    n, dim = 20_000, 64
    base = unit(rng.standard_normal((1, dim)))
    x = unit(base + 1e-4 * rng.standard_normal((n, dim)))
    p = pair(dim=dim, capacity=n)
    load(p, x)
    queries = unit(base + 0.5 * rng.standard_normal((20, dim)))
    for q in queries:
        got = p.search(q, K)
        want, s = exact_ids(x, q, np.arange(n), K)
        assert np.sort(s[got.ids[0]])[0] >= np.sort(s[want])[0] - TIE_TOL
    st = p.stats()
    assert st["code_fallbacks"] >= 1
    assert st["code_scans"] == st["code_fallbacks"] < len(queries), st  # after a fallback, the full scan at once


def test_a_search_filtered_to_a_small_namespace_scans_its_rows(start):
    """In a tier past --codes-min-rows, a search filtered to a namespace of fewer rows scans that namespace's rows
    (nothing counted), one filtered to a larger namespace takes the codes; both answer as the full scan does."""
    rng = np.random.default_rng(5)
    proc, hot = start(dim=32, capacity=6000, codes_min_rows=1000)
    x = unit(rng.standard_normal((5000, 32)))
    hot.upsert(np.arange(4500), x[:4500], 1)  # the large namespace
    hot.upsert(np.arange(4500, 5000), x[4500:], 2)  # 500 rows: below --codes-min-rows
    ids = np.arange(5000)
    for namespace, rows, counted in ((2, slice(4500, 5000), 0), (1, slice(0, 4500), 1)):
        q = unit(rng.standard_normal((1, 32)))[0]
        before = hot.stats()["code_scans"]
        got = hot.search(q, k=64, namespace_hash=namespace)
        assert hot.stats()["code_scans"] - before == counted
        expected, _ = exact_ids(x[rows], q, ids[rows], 64)
        assert got.ids[0].tolist() == expected.tolist()


def test_small_tiers_scan_the_rows(start):
    """Below --codes-min-rows a search scans the rows: nothing is counted."""
    rng = np.random.default_rng(4)
    proc, hot = start(dim=32, capacity=5000, codes_min_rows=4000)
    assert hot.codes == "int8"
    hot.upsert(np.arange(3999), unit(rng.standard_normal((3999, 32))), 1)
    hot.search(unit(rng.standard_normal((1, 32)))[0], k=K)
    assert hot.stats()["code_scans"] == 0
    hot.upsert(np.arange(3999, 5000), unit(rng.standard_normal((1001, 32))), 1)
    hot.search(unit(rng.standard_normal((1, 32)))[0], k=K)
    assert hot.stats()["code_scans"] == 1
