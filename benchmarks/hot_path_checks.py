"""What a search through TieredMemory costs when the hot tier answers alone: p50 / p99 from Python of
`search(vector, k=10, namespace=...)` on an empty store and on one namespace of 100k rows held whole by the hot tier
(rule "complete"), through the public API only, so the same script measures an older version of the package for a
before/after comparison (run each in its own process, alternated; the figures go to one JSON line each). Beside each
search through TieredMemory, the same query goes to the store's own sidecar through the store's own HotTier (a second
attachment would count as a second client process at work, and on 2 cores turn the sidecar's idle polling off),
its raw search (what benchmarks/hot_latency.py times), alternating which goes first: "added_us" is the p50 of the
differences, what the facade adds to the raw sidecar search in the same run.

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


def timed(memory, raw, queries: np.ndarray, namespace: str, warmup: int) -> dict:
    from tiered_recall.namespaces import namespace_hash

    ns_hash = namespace_hash(namespace)
    for q in queries[:warmup]:
        memory.search(q, k=10, namespace=namespace)
        raw.search(q, k=10, namespace_hash=ns_hash)
    facade, bare = [], []
    clock = time.perf_counter_ns
    for i, q in enumerate(queries):
        if i % 2:
            t0 = clock(); memory.search(q, k=10, namespace=namespace); t1 = clock()
            raw.search(q, k=10, namespace_hash=ns_hash); t2 = clock()
            facade.append(t1 - t0), bare.append(t2 - t1)
        else:
            t0 = clock(); raw.search(q, k=10, namespace_hash=ns_hash); t1 = clock()
            memory.search(q, k=10, namespace=namespace); t2 = clock()
            bare.append(t1 - t0), facade.append(t2 - t1)
    rules: dict[str, int] = {}
    for q in queries[:50]:
        rule = memory.search(q, k=10, namespace=namespace, explain=True).rule
        rules[rule] = rules.get(rule, 0) + 1
    us, raw_us = np.array(facade) / 1e3, np.array(bare) / 1e3
    return {"p50_us": float(np.percentile(us, 50)), "p99_us": float(np.percentile(us, 99)),
            "raw_p50_us": float(np.percentile(raw_us, 50)), "raw_p99_us": float(np.percentile(raw_us, 99)),
            "added_us": float(np.percentile(us - raw_us, 50)), "rules": rules}


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
    from tiered_recall.hot import HotTier

    rng = np.random.default_rng(7)
    queries = unit(rng, args.queries, args.dim)
    out = {"label": args.label, "package": str(Path(tiered_recall.__file__).parent), "device": args.device,
           "dim": args.dim, "rows": args.rows}
    with tempfile.TemporaryDirectory(prefix="tr-hot-path-") as tmp:
        memory = TieredMemory(Path(tmp) / "store", dim=args.dim, embedder=None, device=args.device,
                              hot_capacity=args.rows + 1024, timeout_s=60.0)
        link = getattr(memory, "_link", None)  # the store's own attachment (reached into: no public name)
        own = link is not None and getattr(link, "hot", None) is not None
        raw = link.hot if own else HotTier.attach(memory.sidecar_name)
        try:
            out["empty"] = timed(memory, raw, queries, "n", args.warmup)
            if args.rows:
                t0 = time.perf_counter()
                for lo in range(0, args.rows, 5000):
                    m = min(5000, args.rows - lo)
                    memory.add(vectors=unit(rng, m, args.dim), texts=["t"] * m, namespace="n",
                               ids=np.arange(lo + 1, lo + m + 1))
                out["load_s"] = time.perf_counter() - t0
                out[f"rows_{args.rows}"] = timed(memory, raw, queries, "n", args.warmup)
            out["hot_backend"] = memory.stats()["hot_backend"]
        finally:
            if not own:
                raw.close()
            memory.close()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
