"""The timing loop the latency benchmarks share: each call of a function on each query, after a warm-up."""
from __future__ import annotations

import time

import numpy as np


def time_calls(fn, queries: np.ndarray, warmup: int) -> list[int]:
    """Nanoseconds of fn(q) for each query, after fn ran on the first `warmup` queries untimed."""
    for q in queries[:warmup]:
        fn(q)
    out = []
    for q in queries:
        t0 = time.perf_counter_ns()
        fn(q)
        out.append(time.perf_counter_ns() - t0)
    return out
