"""Single-row adds through TieredMemory (durable), and search latency before, after them and after compaction.

The issue-3 check, end to end through the coordinator and a CPU hot tier: p50 add latency, and
search p50 right after 500 single-row adds against the same rows once the cold table is compacted.
Searches are run on an incomplete namespace (hot capacity below the row count), so every search
asks the cold tier too: the path that single-row adds could slow down.

    python benchmarks/memory_adds.py --base 20000 --adds 500 --dim 384 --json out.json
"""
from __future__ import annotations

import argparse
import json
import signal
import os
import sys
import tempfile
import time

import numpy as np

from tiered_recall import TieredMemory
from tiered_recall.hot import HotTier


def unit_rows(rng, n, dim):
    x = rng.standard_normal((n, dim), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def p(samples, q):
    return float(np.percentile(np.asarray(samples) * 1e3, q))


def search_p50(memory, queries, k):
    times = []
    for q in queries:
        t0 = time.perf_counter()
        memory.search(q, k=k, namespace="bench")
        times.append(time.perf_counter() - t0)
    return p(times, 50)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=int, default=20_000, help="rows added in one batch before the single adds")
    parser.add_argument("--adds", type=int, default=500)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--hot-capacity", type=int, default=5_000)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    queries = unit_rows(rng, args.queries, args.dim)
    with tempfile.TemporaryDirectory(prefix="memory-adds-") as folder:
        memory = TieredMemory(folder, dim=args.dim, embedder=None, device="cpu", hot_capacity=args.hot_capacity)
        try:
            base = unit_rows(rng, args.base, args.dim)
            for start in range(0, args.base, 5000):
                chunk = base[start:start + 5000]
                memory.add([f"base {i}" for i in range(start, start + len(chunk))], vectors=chunk, namespace="bench")
            memory.cold.optimize()
            search_p50(memory, queries[:20], args.k)  # warm-up
            before = search_p50(memory, queries, args.k)
            adds = []
            for i, v in enumerate(unit_rows(rng, args.adds, args.dim)):
                t0 = time.perf_counter()
                memory.add(f"single {i}", vectors=v, namespace="bench")
                adds.append(time.perf_counter() - t0)
            after = search_p50(memory, queries, args.k)
            fragments_after = memory.cold.stats().get("fragments")
            memory.cold.optimize()
            compacted = search_p50(memory, queries, args.k)
            fragments_compacted = memory.cold.stats().get("fragments")
            paths = memory.stats()["latency"]
        finally:
            name = memory.sidecar_name
            memory.close()
            try:
                with HotTier.attach(name) as hot:
                    os.kill(hot.owner_pid, signal.SIGTERM)
            except Exception:
                pass
    result = {
        "rows": args.base + args.adds, "dim": args.dim, "k": args.k, "hot_capacity": args.hot_capacity,
        "add_p50_ms": p(adds, 50), "add_p99_ms": p(adds, 99),
        "search_p50_before_ms": before, "search_p50_after_adds_ms": after, "search_p50_compacted_ms": compacted,
        "after_over_compacted": after / compacted, "fragments_after_adds": fragments_after,
        "fragments_compacted": fragments_compacted, "paths": paths, "cores": os.cpu_count(),
    }
    print(f"TieredMemory, {args.base} + {args.adds} single-row adds, dim {args.dim}, CPU hot tier of "
          f"{args.hot_capacity} rows, {os.cpu_count()} cores")
    print(f"  add (durable)        p50 {result['add_p50_ms']:.2f} ms   p99 {result['add_p99_ms']:.2f} ms")
    print(f"  search p50 before    {before:.2f} ms")
    print(f"  search p50 after     {after:.2f} ms   ({fragments_after} fragments)")
    print(f"  search p50 compacted {compacted:.2f} ms   ({fragments_compacted} fragments)")
    print(f"  after / compacted    {result['after_over_compacted']:.2f}  (target <= 1.5)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
