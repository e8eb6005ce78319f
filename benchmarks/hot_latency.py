"""Batch-1 hot-tier search latency through the sidecar against in-process brute force, in one run.

Same vectors, same query stream for every contender; p50 / p99 over many queries after a warm-up.
CPU (default): the sidecar vs numpy (`X @ q` + argpartition), float32, plus the protocol's own
round trip (a search on an empty tier).

    python benchmarks/hot_latency.py                      # 10k and 100k rows, dim 384, k=10
    python benchmarks/hot_latency.py --rows 10000 100000 --dim 384 --queries 2000 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import uuid

import numpy as np

from tiered_recall.hot import HotTier, start_sidecar
from tiered_recall.testing.timing import time_calls


def unit_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def percentiles(samples_ns: list[int]) -> dict:
    a = np.asarray(samples_ns, dtype=np.float64) / 1e3
    return {"p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99)), "n": len(a)}


def numpy_search(x: np.ndarray, k: int):
    def search(q: np.ndarray):
        scores = x @ q
        top = np.argpartition(-scores, k)[:k]
        order = top[np.argsort(-scores[top], kind="stable")]
        return order, scores[order]
    return search


def run_cpu(args) -> dict:
    rng = np.random.default_rng(args.seed)
    results = {"machine": os.uname().nodename, "cores": os.cpu_count(), "dim": args.dim, "k": args.k,
               "dtype": "f32", "backend": "cpu", "sizes": []}
    name = f"bench-{uuid.uuid4().hex[:8]}"
    # the protocol's own cost: a search on an empty tier
    proc = start_sidecar(name, dim=args.dim, capacity=max(args.rows), dtype="f32", backend="cpu")
    try:
        hot = HotTier.attach(name, timeout_s=60)
        results["search_path"] = hot.search_path
        queries = unit_rows(rng, args.queries, args.dim)
        empty = percentiles(time_calls(lambda q: hot.search(q, k=args.k), queries, args.warmup))
        ping = percentiles(time_calls(lambda q: hot.ping(), queries, args.warmup))
        results["empty_search"] = empty
        results["ping"] = ping
        loaded = 0
        x = np.empty((0, args.dim), dtype=np.float32)
        for rows in sorted(args.rows):
            x_new = unit_rows(rng, rows - loaded, args.dim)
            x = np.concatenate([x, x_new])
            hot.upsert(np.arange(loaded, rows), x_new, 1)
            loaded = rows
            side = percentiles(time_calls(lambda q: hot.search(q, k=args.k), queries, args.warmup))
            ref_fn = numpy_search(x, args.k)
            ref = percentiles(time_calls(ref_fn, queries, args.warmup))
            # same answers (ids can swap only on float near-ties)
            agree = np.mean([len(set(hot.search(q, k=args.k).ids[0]) & set(ref_fn(q)[0])) / args.k
                             for q in queries[:50]])
            results["sizes"].append({"rows": rows, "sidecar": side, "numpy": ref,
                                     "p50_ratio": side["p50_us"] / ref["p50_us"], "agreement": float(agree)})
        hot.close()
    finally:
        proc.stop()
    return results


def print_cpu(results: dict) -> None:
    print(f"hot-tier latency, backend cpu, {results['cores']} cores, dim {results['dim']}, k={results['k']}, f32; "
          f"client search path: {results['search_path']}")
    e, p = results["empty_search"], results["ping"]
    print(f"empty-tier search round trip: p50 {e['p50_us']:.1f} us  p99 {e['p99_us']:.1f} us   "
          f"(ping p50 {p['p50_us']:.1f} us)")
    print(f"{'rows':>9} | {'sidecar p50':>11} {'p99':>9} | {'numpy p50':>9} {'p99':>9} | {'p50 ratio':>9} | agree")
    for s in results["sizes"]:
        print(f"{s['rows']:>9} | {s['sidecar']['p50_us']:>9.1f}us {s['sidecar']['p99_us']:>7.1f}us | "
              f"{s['numpy']['p50_us']:>7.1f}us {s['numpy']['p99_us']:>7.1f}us | {s['p50_ratio']:>9.2f} | "
              f"{s['agreement']:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the figures to this file")
    args, extra = parser.parse_known_args(argv)
    if args.backend == "cuda":
        # the CUDA contenders (PyTorch, CuPy), sizes, QPS and the PNG live in hot_latency_cuda.py: run it instead
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hot_latency_cuda.py")
        os.execv(sys.executable, [sys.executable, script, *(sys.argv[1:] if argv is None else argv)])
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    results = run_cpu(args)
    print_cpu(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
