"""Where a persistent-kernel search spends its time: back-to-back searches against a CUDA sidecar
started with --cuda-profile, then the sidecar's own log of mean stage times (host submit to
done seen; in the kernel: message seen to go, go to last ticket, last ticket to done).

    python benchmarks/persist_profile.py --rows 4096 100000 --dim 768
    python benchmarks/persist_profile.py --rows 100000 --batch 16   # one 16-query batch per call
"""
from __future__ import annotations

import argparse
import time
import uuid

import numpy as np

from tiered_recall.hot import HotTier, start_sidecar


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[4096, 100_000])
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--queries", type=int, default=3000, help="search calls per size")
    parser.add_argument("--batch", type=int, default=1,
                        help="queries per search call (one batch for the kernel: 16 is what 16 clients make)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    for rows in args.rows:
        name = f"prof-{uuid.uuid4().hex[:8]}"
        # the persistent kernel's profile: codes off (with them, tiers of --codes-min-rows rows and more are launched)
        proc = start_sidecar(name, dim=args.dim, capacity=rows, dtype="f16", backend="cuda", cuda_verbose=True,
                             cuda_profile=True, codes="off")
        hot = HotTier.attach(name)
        try:
            for s in range(0, rows, 50_000):
                n = min(50_000, rows - s)
                x = rng.standard_normal((n, args.dim)).astype(np.float32)
                hot.upsert(np.arange(s, s + n, dtype=np.int64), x / np.linalg.norm(x, axis=1, keepdims=True), 1)
            q = rng.standard_normal((args.queries + args.batch, args.dim)).astype(np.float32)
            q /= np.linalg.norm(q, axis=1, keepdims=True)
            lat = []
            n_q = args.queries if rows <= 100_000 else max(args.queries // 5, 300)
            for i in range(n_q):
                t = time.perf_counter_ns()
                hot.search(q[i] if args.batch == 1 else q[i:i + args.batch], k=10, touch=False)
                lat.append(time.perf_counter_ns() - t)
            a = np.asarray(lat[200:]) / 1e3
            print(f"rows {rows}, batch {args.batch}: client p50 {np.percentile(a, 50):.1f} us, p99 {np.percentile(a, 99):.1f} us")
            time.sleep(0.05)  # idle: the kernel stops and logs its profile
        finally:
            hot.close()
            log = proc.log()
            proc.stop()
        for line in log.splitlines():
            if "persistent" in line or "profile" in line or "phases" in line:
                print("   ", line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
