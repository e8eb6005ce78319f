"""What a search through TieredMemory costs when the hot tier answers alone: p50 / p99 from Python of
`search(vector, k=10, namespace=...)` on an empty store and on one namespace of 100k rows held whole by the hot tier
(rule "complete"), through the public API only, so the same script measures an older version of the package for a
before/after comparison (run each in its own process, alternated; the figures go to one JSON line each).

    python benchmarks/hot_path_checks.py --device cpu --dim 384
    python benchmarks/hot_path_checks.py --device cuda --dim 768      # the GPU machine (LanceDB carried)
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def timed(memory, queries: np.ndarray, namespace: str, warmup: int) -> dict:
    for q in queries[:warmup]:
        memory.search(q, k=10, namespace=namespace)
    times = []
    rules: dict[str, int] = {}
    for q in queries:
        t0 = time.perf_counter()
        memory.search(q, k=10, namespace=namespace)
        times.append(time.perf_counter() - t0)
    for q in queries[:50]:
        rule = memory.search(q, k=10, namespace=namespace, explain=True).rule
        rules[rule] = rules.get(rule, 0) + 1
    us = np.array(times) * 1e6
    return {"p50_us": float(np.percentile(us, 50)), "p99_us": float(np.percentile(us, 99)), "rules": rules}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--rows", type=int, default=100_000, help="rows of the second measurement (0: the empty store only)")
    parser.add_argument("--queries", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--label", default="", help="a name for this run in the JSON (e.g. before / after)")
    args = parser.parse_args()
    import tiered_recall
    from tiered_recall import TieredMemory

    rng = np.random.default_rng(7)
    queries = unit(rng, args.queries, args.dim)
    out = {"label": args.label, "package": str(Path(tiered_recall.__file__).parent), "device": args.device,
           "dim": args.dim, "rows": args.rows}
    with tempfile.TemporaryDirectory(prefix="tr-hot-path-") as tmp:
        memory = TieredMemory(Path(tmp) / "store", dim=args.dim, embedder=None, device=args.device,
                              hot_capacity=args.rows + 1024, timeout_s=60.0)
        try:
            out["empty"] = timed(memory, queries, "n", args.warmup)
            if args.rows:
                t0 = time.perf_counter()
                for lo in range(0, args.rows, 5000):
                    m = min(5000, args.rows - lo)
                    memory.add(vectors=unit(rng, m, args.dim), texts=["t"] * m, namespace="n",
                               ids=np.arange(lo + 1, lo + m + 1))
                out["load_s"] = time.perf_counter() - t0
                out[f"rows_{args.rows}"] = timed(memory, queries, "n", args.warmup)
            out["hot_backend"] = memory.stats()["hot_backend"]
        finally:
            memory.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
