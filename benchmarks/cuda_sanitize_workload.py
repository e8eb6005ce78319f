"""A small CUDA-sidecar workload for compute-sanitizer (memcheck, racecheck): writes, moves, searches.

Run by benchmarks/gpu_sanitize.sh with --wrapper "compute-sanitizer --tool ..." (start_sidecar's wrapper),
so the sanitizer owns the sidecar process itself. The sidecar exits by itself once this client detaches
(--exit-when-orphaned), so the sanitizer prints its summary. Exits non-zero on a wrong answer.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import uuid

import numpy as np

from tiered_recall.hot import HotTier, start_sidecar


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wrapper", default="", help="a command to run tr-sidecar under, e.g. "
                        "'compute-sanitizer --tool memcheck' (split as a shell would)")
    args = parser.parse_args()
    wrapper = shlex.split(args.wrapper)
    rng = np.random.default_rng(0)
    bad = 0
    # 40,000 rows leave every scan block more than one round (the last partial), walked forward and backward
    for dim, dtype, n in ((100, "f16", 3000), (1100, "f32", 3000), (64, "f16", 40_000)):
        name = f"san-{uuid.uuid4().hex[:8]}"
        proc = start_sidecar(name, dim=dim, capacity=n, dtype=dtype, backend="cuda", exit_when_orphaned_s=1, wrapper=wrapper,
                             ready_timeout_s=300)
        hot = HotTier.attach(name, timeout_s=300)
        x = rng.standard_normal((n, dim)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        ids = np.arange(n, dtype=np.int64) * 3 + 1
        ns = np.array([11, 12], dtype=np.uint64)[rng.integers(0, 2, size=n)]
        hot.upsert(ids, x, ns)
        gone = ids[::7]
        hot.delete(gone)
        keep = np.ones(n, bool)
        keep[::7] = False
        stored = x.astype(np.float16).astype(np.float32) if dtype == "f16" else x
        # the repeated searches: tiers this small run the split scan, which answers them from its row cache
        for k, nq, filt in ((10, 1, None), (10, 1, None), (10, 1, 12), (256, 1, 11), (5, 3, None), (5, 3, 11)):
            q = rng.standard_normal((nq, dim)).astype(np.float32)
            q /= np.linalg.norm(q, axis=1, keepdims=True)
            r = hot.search(q[0] if nq == 1 else q, k=k, namespace_hash=filt)
            for i in range(nq):
                s = stored @ q[i]
                mask = keep & ((ns == filt) if filt is not None else True)
                s = np.where(mask, s, -np.inf)
                top = np.sort(s)[::-1][:k]
                if not np.allclose(r.scores[i][: len(top)], top, atol=3e-3):
                    print(f"dim {dim} k {k} nq {nq} filter {filt}: wrong scores", file=sys.stderr)
                    bad += 1
        # concurrent searches from several threads: the server batches them (search_many)
        import threading
        errs = []

        def worker(t: int) -> None:
            trng = np.random.default_rng([dim, t])
            for j in range(6):
                nq = (1, 2, 20)[(t + j) % 3]
                q = trng.standard_normal((nq, dim)).astype(np.float32)
                q /= np.linalg.norm(q, axis=1, keepdims=True)
                filt = 12 if j % 2 else None
                r = hot.search(q[0] if nq == 1 else q, k=10, namespace_hash=filt, touch=False)
                for i in range(nq):
                    s = np.where(keep & ((ns == filt) if filt is not None else True), stored @ q[i], -np.inf)
                    if not np.allclose(r.scores[i], np.sort(s)[::-1][:10], atol=3e-3):
                        errs.append((dim, t, j, i))

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if errs:
            print(f"dim {dim}: concurrent searches wrong: {errs[:5]}", file=sys.stderr)
            bad += len(errs)
        hot.close()
        code = proc.popen.wait(timeout=600)
        print(f"dim {dim} {dtype}: sidecar pid {proc.popen.pid} exited with {code}")
        bad += code != 0
    print("workload", "FAILED" if bad else "ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
