"""Tunes the retrieval stages on the LoCoMo dev split (and, with --chats, the tune half of benchmarks/data/chats):
embeds each ingest setting once, then sweeps the stage weights (coordinator/stages.py, the code a search runs) over
exact pools, and prints R@5/10/25 per setting (R@1/5/10 on the chats half).

    .venv/bin/python benchmarks/locomo_tune.py --embedder e5 --keyword 0 0.6 0.8 --neighbour 0 0.5 --pool 64 --chats
    .venv/bin/python benchmarks/locomo_tune.py --embedder wordllama --bm25 0 1 --json experiments/tune-wordllama.json

The pools are what TieredMemory.search builds (the exact vector top `pool`, or with --bm25 that ranking fused by
reciprocal rank with BM25 over the stored turn texts), computed here with numpy over the ingested vectors so that a
sweep of hundreds of settings takes minutes. The figures of the shipped presets come from benchmarks/locomo_recall.py
and benchmarks/stages_recall.py, through TieredMemory itself. The chats set's held-out half is never read here.
"""
from __future__ import annotations

import argparse
import itertools
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from tiered_recall.coordinator.stages import RRF_DEPTH, Candidate, Stages, fuse, rerank
from tiered_recall.embedders import resolve_embedder
from tiered_recall.ingest import ingest
from tiered_recall.storage._bm25 import Bm25Index
from tiered_recall.testing import chats
from tiered_recall.testing.locomo import DATA_FILE, DEFAULT_DATA, KS, ExactSearchSink, load_questions, recall_table

CHATS = Path(__file__).resolve().parent / "data" / "chats"
CHATS_KS = (1, 5, 10)


def pools_for(sink: ExactSearchSink, questions, query_vectors: np.ndarray, depth: int):
    """Per question: (vector ranking ids, cosine by id, BM25 ranking ids), within its conversation's namespace."""
    by_namespace = defaultdict(list)
    for record in sink.records.values():
        by_namespace[record.namespace].append(record)
    bm25 = Bm25Index()
    records = list(sink.records.values())
    bm25.upsert([r.id for r in records], [r.namespace for r in records], [r.text for r in records])
    out = []
    for question, vector in zip(questions, query_vectors):
        members = by_namespace[question.conversation]
        matrix = np.stack([sink.vectors[r.id] for r in members])
        scores = matrix @ vector
        order = np.lexsort((np.array([r.id for r in members]), -scores))[:depth]
        vector_ids = [members[i].id for i in order]
        cosine = {members[i].id: float(scores[i]) for i in range(len(members))}
        bm25_ids, _ = bm25.search(question.text, depth, namespace=question.conversation)
        out.append((vector_ids, cosine, bm25_ids.tolist()))
    return out


def evaluate(sink: ExactSearchSink, questions, pools, stages: Stages, *, key: str = "dia_id", ks=KS) -> dict:
    k_max = max(KS)
    retrieved = []
    for question, (vector_ids, cosine, bm25_ids) in zip(questions, pools):
        vector_ids, bm25_ids = vector_ids[: max(stages.depth, stages.pool)], bm25_ids[: stages.depth]
        if stages.bm25_weight is None:
            ranked = [(i, cosine[i]) for i in vector_ids[: max(stages.pool, k_max)]]
        else:
            fused = fuse(vector_ids, bm25_ids, stages.bm25_weight)
            ranked = sorted(fused.items(), key=lambda item: (-item[1], item[0]))[: max(stages.pool, k_max)]
        pool = [Candidate(i, s, sink.records[i].text, sink.records[i].metadata.get("session_number"),
                          sink.records[i].metadata) for i, s in ranked]
        chosen = [c for c, _ in rerank(pool, question.text, k_max, stages)] if stages.reranks else pool[:k_max]
        retrieved.append([sink.records[c.id].metadata[key] for c in chosen])
    return recall_table(questions, retrieved, ks)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--embedder", default="e5")
    parser.add_argument("--template", default="dated_said")
    parser.add_argument("--context-turns", type=int, default=1)
    parser.add_argument("--context-weights", nargs="+", type=float, default=[0.3])
    parser.add_argument("--bm25", nargs="+", type=float, default=[0.0], help="0 = vector only")
    parser.add_argument("--keyword", nargs="+", type=float, default=[0.0])
    parser.add_argument("--neighbour", nargs="+", type=float, default=[0.0])
    parser.add_argument("--temporal", nargs="+", type=float, default=[0.0])
    parser.add_argument("--spread", nargs="+", type=float, default=[0.0])
    parser.add_argument("--pool", nargs="+", type=int, default=[50])
    parser.add_argument("--depth", nargs="+", type=int, default=[RRF_DEPTH], help="how deep each ranking is fused")
    parser.add_argument("--chats", action="store_true", help="also score each setting on the chats set's tune half")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    data_file = args.data / DATA_FILE
    if not data_file.is_file():
        print(f"skipped: LoCoMo data not found at {data_file}")
        return 0
    questions, _ = load_questions(data_file)
    embedder = resolve_embedder(args.embedder)
    # one query at a time, as a search embeds it (int8 activations are quantized per batch: a batch would differ)
    query_vectors = np.concatenate([embedder.embed_queries([q.text]) for q in questions])
    if args.chats:
        chat_files = chats.conversation_files(CHATS, split="tune")
        chat_questions = chats.load_questions(CHATS, conversations=chat_files)
        chat_vectors = np.concatenate([embedder.embed_queries([q.text]) for q in chat_questions])
    deepest = max(max(args.depth), max(args.pool))
    rows = []
    print(f"{'ctx w':>6}{'bm25':>6}{'kw':>6}{'nbr':>6}{'temp':>6}{'sprd':>6}{'pool':>6}{'dpth':>6}{'R@5':>7}{'R@10':>7}"
          f"{'R@25':>7}   " + ("chats tune R@1/5/10   " if args.chats else "") + "R@10 by category")
    for weight in args.context_weights:
        sink = ExactSearchSink(embedder)
        ingest(data_file, memory=sink, namespace="{conversation}", template=args.template,
               context_turns=args.context_turns, context_weight=weight if args.context_turns else None, progress=False)
        pools = pools_for(sink, questions, query_vectors, depth=deepest)
        if args.chats:
            chat_sink = ExactSearchSink(embedder)
            ingest(chat_files, memory=chat_sink, namespace="{conversation}", template=args.template,
                   context_turns=args.context_turns, context_weight=weight if args.context_turns else None,
                   progress=False)
            chat_pools = pools_for(chat_sink, chat_questions, chat_vectors, depth=deepest)
        for bm25, keyword, neighbour, temporal, spread, pool, depth in itertools.product(
                args.bm25, args.keyword, args.neighbour, args.temporal, args.spread, args.pool, args.depth):
            stages = Stages(bm25_weight=bm25 or None, keyword_weight=keyword, neighbour_weight=neighbour,
                            temporal_weight=temporal, session_spread=spread, pool=pool, depth=depth)
            table = evaluate(sink, questions, pools, stages)
            row = table["all"]
            chat_table = evaluate(chat_sink, chat_questions, chat_pools, stages, key="position", ks=CHATS_KS) \
                if args.chats else None
            print(f"{weight:>6}{bm25:>6}{keyword:>6}{neighbour:>6}{temporal:>6}{spread:>6}{pool:>6}{depth:>6}"
                  + "".join(f"{row[k]:>7.1f}" for k in KS) + "   "
                  + (" ".join(f"{chat_table['all'][k]:5.1f}" for k in CHATS_KS) + "      " if chat_table else "")
                  + " ".join(f"c{c} {table[str(c)][10]:.1f}" for c in range(1, 6)), flush=True)
            rows.append({"context_weight": weight, "bm25_weight": bm25, "keyword_weight": keyword,
                         "neighbour_weight": neighbour, "temporal_weight": temporal, "session_spread": spread,
                         "pool": pool, "depth": depth,
                         "recall": {g: {str(k): round(v, 2) for k, v in r.items()} for g, r in table.items()},
                         **({"chats_tune": {str(k): round(v, 2) for k, v in chat_table["all"].items()}}
                            if chat_table else {})})
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"embedder": embedder.name, "template": args.template,
                                         "context_turns": args.context_turns, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
