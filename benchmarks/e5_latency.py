"""The E5 embedder alone: one query's embedding latency p50/p99 and batched passage throughput, per backend, and how
close the backends' vectors are (cosine to onnxruntime's on the same texts). LoCoMo dev questions and turns when the
data is there, else generated sentences. A query's time is also split: tokenizing (token_ids), the encoder (from ids
to the pooled vector, host work included), and on a GPU the device time of the query's CUDA graph alone (CUDA
events around its replay). Works with the E5 embedder of any commit since 040a8e2 (the parts it names are looked up
on the objects), so the same script times an older checkout beside this one.

    .venv/bin/python benchmarks/e5_latency.py --backends native onnx   # the CPU's two backends, alternated
    .venv/bin/python benchmarks/e5_latency.py                          # onnx on the CPU
    python3 benchmarks/e5_latency.py --backends onnx torch --json $OUT/e5_latency.json   # the GPU machine
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from tiered_recall.embedders import E5Embedder
from tiered_recall.embedders.e5 import QUERY_PREFIX

DATA = Path(os.environ.get("LOCOMO_DATA", Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "locomo")
            ) / "locomo_dev.json"


def _p50_ms(seconds: list[float]) -> float:
    return round(float(np.percentile(seconds, 50)) * 1e3, 4)


def query_parts(embedder: E5Embedder, questions: list[str]) -> dict:
    """p50 of tokenizing, of the encoder from ids to the pooled vector, and (torch on a GPU) of the query graph's
    device time alone."""
    ids = [embedder.token_ids([q], QUERY_PREFIX)[0] for q in questions]
    tokenize, encode = [], []
    for question, row in zip(questions, ids):
        t0 = time.perf_counter()
        embedder.token_ids([question], QUERY_PREFIX)
        t1 = time.perf_counter()
        if hasattr(embedder._encoder, "one"):
            embedder._encoder.one(row)
        else:  # the embedder of 040a8e2: host lookup, then the encoder's summed()
            embedder._mean_pooled([row], len(row))
        t2 = time.perf_counter()
        tokenize.append(t1 - t0)
        encode.append(t2 - t1)
    parts = {"tokens_p50": float(np.median([len(row) for row in ids])), "tokenize_p50_ms": _p50_ms(tokenize),
             "encoder_p50_ms": _p50_ms(encode)}
    graphs = getattr(embedder._encoder, "_graphs", None)
    if graphs:
        import torch

        device_ms = []
        for row in ids:
            size = min(size for size in graphs if size >= len(row))
            graph = graphs[size][0]
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            stop.record()
            stop.synchronize()
            device_ms.append(start.elapsed_time(stop))
        parts["graph_device_p50_ms"] = round(float(np.median(device_ms)), 4)
        parts["graph_sizes"] = sorted(graphs)
    return parts


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
        embedder.wait_loaded()
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
               "cosine_to_first_backend_mean": round(float(cosine.mean()), 5),
               **query_parts(embedder, questions[: args.queries])}
        results.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
