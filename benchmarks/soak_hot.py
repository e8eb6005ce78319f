"""Soak of the hot tier alone (issue 8, part 5, where the cold tier cannot run, e.g. the GPU machine
without lancedb): N processes send a mix of searches, upserts and deletes straight to one sidecar;
the sidecar's resident memory and open fds, /dev/shm segments and GPU memory are printed before and
after, and again once everything is closed.

    python benchmarks/soak_hot.py --backend cuda --processes 8 --ops 1000000
    python benchmarks/soak_hot.py --backend cpu --processes 8 --ops 200000

Measurement points: "before" once every worker has attached and done --warmup operations of the same
mix; "after" once every worker has done its share of --ops, still attached. Both are taken by the
parent while the workers wait on a barrier. Every answer is checked for shape (hits <= k, ids known to
the worker that could have written them, scores sorted); any error or bad answer is counted.
Prints a table and one JSON line.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
import uuid

import numpy as np

from tiered_recall.hot import HotTier, start_sidecar

from tiered_recall.testing.process_figures import fds, gpu_figures, rss_kb, shm_segments

ID_SPACE = 1_000_000  # each worker writes ids in [w * ID_SPACE, (w + 1) * ID_SPACE)


def process_figures(pid: int) -> dict:
    rss = rss_kb(pid)
    return {"pid": pid, "rss_mb": None if rss is None else rss / 1024, "fds": fds(pid)}


def snapshot(sidecar_pid: int) -> dict:
    return {"sidecar": process_figures(sidecar_pid), "parent": process_figures(os.getpid()),
            "shm_segments": len(shm_segments()), "gpu": gpu_figures([sidecar_pid])}


def worker(name: str, w: int, dim: int, ops: int, warmup: int, seed: int, barrier, out) -> None:
    rng = np.random.default_rng([seed, w])
    hot = HotTier.attach(name, timeout_s=30)
    base = w * ID_SPACE
    written: set[int] = set()
    counts = {"search": 0, "upsert": 0, "delete": 0, "errors": 0, "bad": 0}
    ns_of = np.array([101, 202, 303], dtype=np.uint64)

    def one() -> None:
        r = rng.random()
        try:
            if r < 0.85 or (r >= 0.95 and not written):
                q = rng.standard_normal(dim).astype(np.float32)
                k = int(rng.choice([1, 10, 10, 64]))
                want = int(ns_of[rng.integers(0, 3)]) if rng.random() < 0.3 else None
                res = hot.search(q / np.linalg.norm(q), k=k, namespace_hash=want, touch=bool(rng.random() < 0.5))
                ids, scores = res.ids[0], res.scores[0]
                h = int(np.sum(ids >= 0))
                if h > k or res.hits != h or np.any(np.diff(scores[:h]) > 1e-6) or np.any(ids[:h] < 0):
                    counts["bad"] += 1
                counts["search"] += 1
            elif r < 0.95:
                n = int(rng.integers(1, 9))
                new = base + rng.integers(0, 50_000, size=n)
                new = np.unique(new)
                x = rng.standard_normal((len(new), dim)).astype(np.float32)
                hot.upsert(new, x / np.linalg.norm(x, axis=1, keepdims=True), ns_of[new % 3])
                written.update(int(i) for i in new)
                counts["upsert"] += 1
            else:
                gone = rng.choice(np.fromiter(written, dtype=np.int64), size=min(4, len(written)), replace=False)
                hot.delete(gone)
                written.difference_update(int(i) for i in gone)
                counts["delete"] += 1
        except Exception:  # counted, not raised: the soak reports every failure at the end
            counts["errors"] += 1

    for _ in range(warmup):
        one()
    warmup_failures = counts["errors"] + counts["bad"]
    counts.update(search=0, upsert=0, delete=0, errors=warmup_failures, bad=0)  # warm-up failures still count
    barrier.wait()  # before
    barrier.wait()
    t = time.perf_counter()
    for _ in range(ops):
        one()
    elapsed = time.perf_counter() - t
    barrier.wait()  # after
    barrier.wait()
    hot.close()
    out.put({"worker": w, "elapsed_s": elapsed, **counts})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--ops", type=int, default=200_000, help="total over all processes")
    parser.add_argument("--warmup", type=int, default=500, help="per process, before the 'before' figures")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--capacity", type=int, default=100_000, help="hot rows (eviction past it)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the JSON here")
    args = parser.parse_args(argv)

    start = {"shm_segments": len(shm_segments()), "gpu": gpu_figures([])}
    name = f"soak-{uuid.uuid4().hex[:8]}"
    proc = start_sidecar(name, dim=args.dim, capacity=args.capacity, backend=args.backend)
    # fill the tier first, so "before" sees it at capacity and the workers' upserts evict
    fill = HotTier.attach(name)
    rng = np.random.default_rng(args.seed)
    for s in range(0, args.capacity, 8192):
        n = min(8192, args.capacity - s)
        x = rng.standard_normal((n, args.dim)).astype(np.float32)
        ids = np.arange(s, s + n, dtype=np.int64) + 100 * ID_SPACE
        fill.upsert(ids, x / np.linalg.norm(x, axis=1, keepdims=True), np.uint64(101) + np.uint64(101) * (ids % 3).astype(np.uint64))
    fill.close()
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(args.processes + 1)
    out = ctx.Queue()
    per = args.ops // args.processes
    workers = [ctx.Process(target=worker, args=(name, w, args.dim, per, args.warmup, args.seed, barrier, out))
               for w in range(args.processes)]
    for p in workers:
        p.start()
    try:
        barrier.wait(timeout=600)
        before = snapshot(proc.server_pid)
        barrier.wait()
        t = time.perf_counter()
        barrier.wait(timeout=3600)
        wall = time.perf_counter() - t
        after = snapshot(proc.server_pid)
        barrier.wait()
        results = [out.get(timeout=120) for _ in workers]
        for p in workers:
            p.join(timeout=60)
    finally:
        proc.stop()
    time.sleep(0.5)
    closed = {"sidecar_running": proc.running(), "shm_segments": len(shm_segments()), "gpu": gpu_figures([])}
    done = sum(r["search"] + r["upsert"] + r["delete"] for r in results)
    report = {
        "backend": args.backend, "processes": args.processes, "ops": done, "wall_s": wall, "ops_per_s": done / wall,
        "search": sum(r["search"] for r in results), "upsert": sum(r["upsert"] for r in results),
        "delete": sum(r["delete"] for r in results), "errors": sum(r["errors"] for r in results),
        "bad_answers": sum(r["bad"] for r in results), "start": start, "before": before, "after": after,
        "closed": closed,
    }
    b, a = before["sidecar"], after["sidecar"]
    print(f"hot-tier soak, {args.backend}, {args.processes} processes: {done:,} operations in {wall:.1f} s "
          f"({done / wall:,.0f}/s): {report['search']:,} searches, {report['upsert']:,} upserts, "
          f"{report['delete']:,} deletes; errors {report['errors']}, bad answers {report['bad_answers']}")
    print(f"  sidecar RSS {b['rss_mb'] or 0:.1f} -> {a['rss_mb'] or 0:.1f} MB, fds {b['fds']} -> {a['fds']}")
    print(f"  parent RSS {before['parent']['rss_mb'] or 0:.1f} -> {after['parent']['rss_mb'] or 0:.1f} MB, "
          f"fds {before['parent']['fds']} -> {after['parent']['fds']}")
    print(f"  /dev/shm segments: start {start['shm_segments']}, before {before['shm_segments']}, after "
          f"{after['shm_segments']}, closed {closed['shm_segments']}")
    gpu = [g if isinstance(g, str) else sum(g["used_mib"]) for g in
           (start["gpu"], before["gpu"], after["gpu"], closed["gpu"])]
    print("  GPU memory used (MiB): " + ("no GPU" if isinstance(gpu[0], str) else
                                         f"start {gpu[0]}, before {gpu[1]}, after {gpu[2]}, closed {gpu[3]}"))
    print(f"  after close: sidecar running {closed['sidecar_running']}")
    line = json.dumps(report)
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    return 0 if report["errors"] == 0 and report["bad_answers"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
