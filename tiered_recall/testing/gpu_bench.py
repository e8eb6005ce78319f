"""What the hot tier's GPU benchmarks share (hot_latency_cuda.py, codes_latency.py): uniform unit queries, the
device's copy bandwidth that the bandwidth floor is taken from, and client processes that search a sidecar flat out."""
from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np

from ..hot import HotTier


def unit_chunk(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    """n float32 rows drawn uniformly from [-0.5, 0.5) and scaled to unit norm."""
    x = rng.random((n, dim), dtype=np.float32)
    x -= 0.5
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def copy_bandwidth(torch) -> float:
    """Device-to-device copy, bytes read + written per second (the DESIGN's convention for the bandwidth floor)."""
    nbytes = 2 << 30
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 10
    start.record()
    for _ in range(reps):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3
    del a, b
    torch.cuda.empty_cache()
    return 2.0 * nbytes * reps / seconds


def _client(name: str, dim: int, k: int, seconds: float, start_at: float, seed: int, out) -> None:
    hot = HotTier.attach(name, timeout_s=60)
    rng = np.random.default_rng(seed)
    queries = unit_chunk(rng, 256, dim)
    for q in queries[:20]:
        hot.search(q, k=k)
    while time.time() < start_at:
        time.sleep(0.0005)
    lat = []
    n = 0
    end = start_at + seconds
    while True:
        t0 = time.perf_counter_ns()
        hot.search(queries[n % 256], k=k)
        lat.append(time.perf_counter_ns() - t0)
        n += 1
        if time.time() >= end:
            break
    hot.close()
    out.put((n, float(np.percentile(np.asarray(lat) / 1e3, 50)), float(np.percentile(np.asarray(lat) / 1e3, 99))))


def measure_qps(name: str, dim: int, k: int, clients: int, seconds: float) -> dict:
    """Queries per second of `clients` spawned processes searching the sidecar `name` back to back for `seconds`,
    and their median p50 and largest p99 per search."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 3.0 + 0.1 * clients
    procs = [ctx.Process(target=_client, args=(name, dim, k, seconds, start_at, 1000 + i, out)) for i in range(clients)]
    for p in procs:
        p.start()
    res = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    total = sum(r[0] for r in res)
    return {"clients": clients, "qps": total / seconds, "client_p50_us": float(np.median([r[1] for r in res])),
            "client_p99_us": float(np.max([r[2] for r in res]))}
