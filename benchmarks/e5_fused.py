"""One query's E5 embedding on a GPU: the fused encoder kernel (libtrencoder) beside the replayed CUDA graphs, question
by question alternated in one process over the LoCoMo dev questions (generated sentences without the data): p50/p99
of the encoder call from token ids to the unit vector, the cosine between the two paths' vectors, and the fused
kernel's p50 on other grid sizes.

    python3 benchmarks/e5_fused.py --blocks 0 66 33 --json $OUT/e5_fused.json     # the GPU machine
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
from tiered_recall.embedders.e5_torch import TorchEncoder
from tiered_recall.testing.locomo import DATA_FILE, DEFAULT_DATA, load_questions


def questions() -> list[str]:
    """The dev split's questions (LOCOMO_DATA names its folder), or generated ones without it."""
    data = Path(os.environ.get("LOCOMO_DATA", DEFAULT_DATA)) / DATA_FILE
    if data.is_file():
        return [question.text for question in load_questions(data)[0]]
    rng = np.random.default_rng(7)
    words = "when did the group meet about painting camping a support her kids job new city last week".split()
    return [" ".join(rng.choice(words, 10)) + "?" for _ in range(500)]


def _ms(seconds: list[float], q: float) -> float:
    return round(float(np.percentile(seconds, q)) * 1e3, 4)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=600)
    parser.add_argument("--blocks", type=int, nargs="*", default=[0], help="grid sizes to time (0: one per SM)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    texts = questions()
    embedder = E5Embedder(backend="torch", gpu_queries="fused")
    embedder.wait_loaded()
    weights = embedder._weights
    fused = embedder._encoder
    graphs = TorchEncoder(weights, device="cuda", queries="graphs")
    rows = [embedder.token_ids([q], QUERY_PREFIX)[0] for q in texts[: args.queries]]
    for row in rows[:30]:
        fused.one(row), graphs.one(row)
    times = {"fused": [], "graphs": []}
    cosines = []
    for row in rows:
        vectors = {}
        for name, encoder in (("fused", fused), ("graphs", graphs)):
            t0 = time.perf_counter()
            vectors[name] = encoder.one(row)[0]
            times[name].append(time.perf_counter() - t0)
        a, b = vectors["fused"], vectors["graphs"]
        cosines.append(float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))))
    result = {"queries": len(rows), "tokens_p50": float(np.median([len(r) for r in rows])),
              "fused_blocks": fused._fused.blocks,
              **{f"{name}_{q}_ms": _ms(times[name], q) for name in times for q in (50, 99)},
              "graphs_over_fused_p50": round(float(np.median(times["graphs"]) / np.median(times["fused"])), 2),
              "cosine_min": round(min(cosines), 6), "cosine_mean": round(float(np.mean(cosines)), 6)}
    print(json.dumps(result), flush=True)
    sweep = []
    for blocks in args.blocks:
        encoder = fused.fused_encoder(blocks)
        for row in rows[:30]:
            encoder.one(row)
        seconds = []
        for row in rows:
            t0 = time.perf_counter()
            encoder.one(row)
            seconds.append(time.perf_counter() - t0)
        sweep.append({"blocks": encoder.blocks, "p50_ms": _ms(seconds, 50), "p99_ms": _ms(seconds, 99)})
        print(json.dumps(sweep[-1]), flush=True)
        encoder.close()
    if args.json:
        args.json.write_text(json.dumps({**result, "sweep": sweep}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
