"""The E5 embedder alone: one query's embedding latency p50/p99 and batched passage throughput, per backend, and how
close the backends' vectors are (cosine to onnxruntime's on the same texts). LoCoMo dev questions and turns when the
data is there, else generated sentences.

    .venv/bin/python benchmarks/e5_latency.py                          # onnx on the CPU
    python3 benchmarks/e5_latency.py --backends onnx torch --json $OUT/e5_latency.json   # the GPU machine
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from tiered_recall.embedders import E5Embedder

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "locomo" / "locomo_dev.json"


def texts() -> tuple[list[str], list[str]]:
    if DATA.is_file():
        samples = json.loads(DATA.read_text())
        questions = [qa["question"] for sample in samples for qa in sample["qa"]]
        turns = [f'{turn["speaker"]} said, "{turn["text"]}"' for sample in samples
                 for name, session in sample["conversation"].items()
                 if name.startswith("session_") and isinstance(session, list) for turn in session]
        return questions, turns
    rng = np.random.default_rng(7)
    words = "when did the group meet about painting camping a support her kids job new city last week".split()
    return ([" ".join(rng.choice(words, 10)) + "?" for _ in range(500)],
            [" ".join(rng.choice(words, 24)) for _ in range(3000)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["onnx"])
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    questions, turns = texts()
    results, reference = [], None
    for backend in args.backends:
        embedder = E5Embedder(backend=backend)
        for question in questions[:20]:
            embedder.embed_queries([question])
        seconds = []
        for question in questions[: args.queries]:
            t0 = time.perf_counter()
            embedder.embed_queries([question])
            seconds.append(time.perf_counter() - t0)
        embedder.embed_passages(turns[:256])
        t0 = time.perf_counter()
        vectors = embedder.embed_passages(turns)
        rate = len(turns) / (time.perf_counter() - t0)
        if reference is None:
            reference = vectors
        cosine = (vectors * reference).sum(axis=1)
        row = {"backend": backend, "device": embedder.device, "query_p50_ms": round(float(np.percentile(seconds, 50)) * 1e3, 3),
               "query_p99_ms": round(float(np.percentile(seconds, 99)) * 1e3, 3), "passages_per_s": round(rate, 1),
               "passages": len(turns), "cosine_to_first_backend_min": round(float(cosine.min()), 5),
               "cosine_to_first_backend_mean": round(float(cosine.mean()), 5)}
        results.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
