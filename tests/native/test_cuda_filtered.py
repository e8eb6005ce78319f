"""Filtered searches on the CUDA backend against exact search in float64 over the same f16 rows.

Namespaces that select 1 %, 10 % and 50 % of 4,096, 100k and 1M rows (768 dims, k=10), searched one query at a time,
in batches of 16, and from eight threads at once (the sidecar merges what arrives together into one pass). Where the
ids differ from exact search, the gap is the exact score of the best id left out minus that of the worst id kept:
a tie within f16 rounding of the query (at most about 2**-11 a unit query, so 1e-3 for the pair) is not a miss, any
larger gap is. The table of comparisons and gaps is printed (run with -s to see it).
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from tiered_recall.hot import HotTier, start_sidecar

pytestmark = pytest.mark.gpu

DIM, K = 768, 10
TIE_TOL = 2e-3
SELECTIVITY = {"1%": 0.01, "10%": 0.10, "50%": 0.50}
HASHES = {"1%": 11, "10%": 12, "50%": 13, "rest": 14}


def exact_topk(rows64: np.ndarray, ids: np.ndarray, q: np.ndarray, k: int):
    """(ids, scores) of exact search in float64, on the GPU through torch when it is there."""
    try:
        import torch

        if torch.cuda.is_available():
            x = torch.from_numpy(rows64).cuda() if not torch.is_tensor(rows64) else rows64
            s = (x @ torch.from_numpy(q.astype(np.float64)).cuda()).cpu().numpy()
        else:
            raise ImportError
    except ImportError:
        s = np.asarray(rows64) @ q.astype(np.float64)
    order = np.lexsort((ids, -s))[:k]
    return ids[order], s[order], s


def compare(got_ids: np.ndarray, scope_ids: np.ndarray, all_scores: np.ndarray, exp_ids: np.ndarray) -> float:
    """0.0 when the ids are exact search's; else the gap (best left out - worst kept), in exact scores."""
    got = [int(i) for i in got_ids if i >= 0]
    if set(got) == set(exp_ids.tolist()):
        return 0.0
    score_of = dict(zip(scope_ids.tolist(), all_scores.tolist()))
    assert all(i in score_of for i in got), "an id outside the namespace came back"
    left_out = [score_of[int(i)] for i in exp_ids if int(i) not in got]
    kept = [score_of[i] for i in got if i not in set(exp_ids.tolist())]
    return max(left_out) - min(kept)


def test_filtered_searches_agree_with_exact_search_in_float64(segment_name):
    rng = np.random.default_rng(25)
    sizes = (4096, 100_000, 1_000_000)
    proc = start_sidecar(segment_name, dim=DIM, capacity=sizes[-1], dtype="f16", backend="cuda")
    report = []
    try:
        hot = HotTier.attach(segment_name, timeout_s=60)
        rows16 = np.empty((sizes[-1], DIM), np.float16)
        ns = np.empty(sizes[-1], np.uint64)
        loaded = 0
        for n in sizes:
            while loaded < n:
                m = min(65536, n - loaded)
                x = rng.standard_normal((m, DIM)).astype(np.float32)
                x /= np.linalg.norm(x, axis=1, keepdims=True)
                u = rng.random(m)
                code = np.where(u < 0.01, HASHES["1%"], np.where(u < 0.11, HASHES["10%"],
                                np.where(u < 0.61, HASHES["50%"], HASHES["rest"]))).astype(np.uint64)
                hot.upsert(np.arange(loaded, loaded + m, dtype=np.int64), x, code)
                rows16[loaded:loaded + m] = x.astype(np.float16)
                ns[loaded:loaded + m] = code
                loaded += m
            for label in SELECTIVITY:
                scope = np.flatnonzero(ns[:n] == HASHES[label])
                rows64 = rows16[scope].astype(np.float64)
                try:
                    import torch

                    rows64 = torch.from_numpy(rows64).cuda() if torch.cuda.is_available() else rows64
                except ImportError:
                    pass
                queries = rng.standard_normal((64, DIM)).astype(np.float32)
                queries /= np.linalg.norm(queries, axis=1, keepdims=True)
                answers: dict[str, list] = {"batch 1": [], "batch 16": [], "8 threads": []}
                for q in queries[:32]:
                    r = hot.search(q, k=K, namespace_hash=HASHES[label])
                    answers["batch 1"].append((q, r.ids[0]))
                for lo in (32, 48):
                    r = hot.search(np.ascontiguousarray(queries[lo:lo + 16]), k=K, namespace_hash=HASHES[label])
                    answers["batch 16"] += [(queries[lo + j], r.ids[j]) for j in range(16)]
                lock = threading.Lock()

                def client(part: np.ndarray) -> None:
                    for q in part:
                        r = hot.search(q, k=K, namespace_hash=HASHES[label])
                        with lock:
                            answers["8 threads"].append((q, r.ids[0]))

                threads = [threading.Thread(target=client, args=(queries[j:32:8],)) for j in range(8)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                for how, pairs in answers.items():
                    gaps = []
                    for q, got in pairs:
                        exp_ids, _, all_scores = exact_topk(rows64, scope.astype(np.int64), q, K)
                        gaps.append(compare(got, scope.astype(np.int64), all_scores, exp_ids))
                    gaps = np.array(gaps)
                    report.append({"rows": n, "selectivity": label, "scope_rows": int(scope.size), "how": how,
                                   "queries": int(gaps.size), "exact": int((gaps == 0).sum()),
                                   "ties": int(((gaps > 0) & (gaps <= TIE_TOL)).sum()),
                                   "misses": int((gaps > TIE_TOL).sum()), "max_gap": float(gaps.max())})
        hot.close()
    finally:
        proc.stop()
    print("\nrows      selectivity  scope rows  searched   queries  exact  ties  misses  largest gap")
    for r in report:
        print(f"{r['rows']:>9,}  {r['selectivity']:>11}  {r['scope_rows']:>10,}  {r['how']:>9}  {r['queries']:>7}"
              f"  {r['exact']:>5}  {r['ties']:>4}  {r['misses']:>6}  {r['max_gap']:.2e}")
    assert len(report) == len(sizes) * len(SELECTIVITY) * 3 and all(r["queries"] == 32 for r in report)
    assert all(r["misses"] == 0 for r in report), [r for r in report if r["misses"]]
