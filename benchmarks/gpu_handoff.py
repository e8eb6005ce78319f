"""What a search of the CUDA sidecar costs right after the client's own GPU work, the case of a text search whose query
was just embedded on the same GPU: a stand-in for the embedding (a CUDA graph of 200 small kernels, about 0.4 ms)
before each search, against searches back to back and after CPU-only waiting, with and without HotTier.expect, with
the persistent kernel on and off. p50 / p99 µs of the search alone; one JSON line at the end.

    python benchmarks/gpu_handoff.py                       # the GPU machine (torch, a CUDA build of the sidecar)
    CUDA_MPS_PIPE_DIRECTORY=... python benchmarks/gpu_handoff.py   # the same under MPS (docs/gpu-backend.md)
"""
from __future__ import annotations

import argparse
import json
import time
import uuid

import numpy as np


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--k", type=int, default=64, help="64: the pool a text search with the stages asks for")
    parser.add_argument("--queries", type=int, default=700)
    args = parser.parse_args()
    import torch

    from tiered_recall.hot import HotTier, start_sidecar

    rng = np.random.default_rng(3)
    x = rng.standard_normal((args.rows, args.dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    queries = rng.standard_normal((args.queries, args.dim)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    a = torch.randn(16, 384, device="cuda", dtype=torch.half)
    w = torch.randn(384, 384, device="cuda", dtype=torch.half) / 20

    def stand_in():
        b = a
        for _ in range(100):
            b = torch.tanh(b @ w)
        return b

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as CUDA graph capture requires
        for _ in range(3):
            stand_in()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        stand_in()

    def gpu_work():
        graph.replay()
        torch.cuda.synchronize()

    def cpu_wait():
        end = time.perf_counter() + 0.0005
        while time.perf_counter() < end:
            pass

    t0 = time.perf_counter()
    for _ in range(50):
        gpu_work()
    print(f"stand-in embedding {(time.perf_counter() - t0) / 50 * 1e3:.3f} ms", flush=True)
    out = {}
    for persist in (True, False):
        name = f"handoff-{uuid.uuid4().hex[:10]}"
        proc = start_sidecar(name, dim=args.dim, capacity=args.rows + 1024, dtype="f16", backend="cuda",
                             idle_spin_us=250, cuda_persist=persist)
        hot = HotTier.attach(name)
        try:
            hot.upsert(np.arange(1, args.rows + 1, dtype=np.int64), x, 7)
            for mode in ("back to back", "after CPU wait", "after CPU wait + expect", "after GPU work",
                         "after GPU work + expect"):
                times = []
                for i, q in enumerate(queries):
                    if "expect" in mode:
                        hot.expect(0.002)
                    if "CPU" in mode:
                        cpu_wait()
                    if "GPU" in mode:
                        gpu_work()
                    t0 = time.perf_counter_ns()
                    hot.search(q, k=args.k, namespace_hash=7)
                    if i >= 100:
                        times.append((time.perf_counter_ns() - t0) / 1e3)
                label = f"persist {'on' if persist else 'off'}, {mode}"
                out[label] = {"p50_us": round(float(np.median(times)), 1),
                              "p99_us": round(float(np.percentile(times, 99)), 1)}
                print(f"{label:<36} p50 {np.median(times):7.1f} us  p99 {np.percentile(times, 99):7.1f} us", flush=True)
        finally:
            hot.close()
            proc.stop()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
