"""LoCoMo retrieval recall (R@5/10/25 of evidence turns) per embedder and template, next to DRAGON; plus ingest throughput.

    .venv/bin/python benchmarks/locomo_recall.py                      # all templates, default embedder(s)
    .venv/bin/python benchmarks/locomo_recall.py --templates dated_said --context-turns 0 1 --json results/locomo.json

Every conversation of the development split goes into its own namespace through the real ingest
pipeline (tiered_recall.ingest); each question is embedded and searched in its conversation's
namespace. --backend exact keeps the pipeline's vectors in an in-process sink and searches
them exactly with numpy (the numbers exact search gives); --backend tiered writes to a
TieredMemory in a temporary folder and uses its search instead.
R@k is the LoCoMo authors' metric: the fraction of a question's evidence dia_ids found among the
top k turns, averaged over questions (categories 1-5). Evidence ids are normalised as the data
README says ("D8:6; D9:17" split, "D:11:26" -> "D11:26", "D30:05" -> "D30:5"); ids naming no turn
are dropped and questions left with no evidence are not scored; both are counted and printed.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tiered_recall.embedders import Embedder, resolve_embedder
from tiered_recall.errors import InvalidInput
from tiered_recall.ingest import DEFAULT_TEMPLATE, TEMPLATES, ingest
from tiered_recall.testing.locomo import CATEGORIES, DRAGON, KS, Question, load_questions, recall_table

REPO = Path(__file__).resolve().parent.parent

DATA_FILE = "locomo_dev.json"
DEFAULT_DATA = REPO.parent / "shared" / "data" / "locomo"


@dataclass
class _StoredTurn:
    id: int
    text: str
    namespace: str
    metadata: dict[str, Any]


@dataclass
class ExactSearchSink:
    """Keeps what ingest writes (per namespace) and searches it exactly; same results as exact search."""

    embedder: Embedder
    records: dict[int, _StoredTurn] = field(default_factory=dict)
    vectors: dict[int, np.ndarray] = field(default_factory=dict)

    def add(self, texts, *, vectors=None, namespace, ids=None, session=None, role=None, metadata=None, created_at=None):
        if vectors is None:
            vectors = self.embedder(texts)
        for row, (memory_id, text) in enumerate(zip(ids, texts)):
            self.records[memory_id] = _StoredTurn(memory_id, text, namespace, dict(metadata[row] or {}))
            self.vectors[memory_id] = vectors[row]
        return list(ids)

    def get(self, ids):
        return [self.records.get(i) for i in ids]

    def search_dia_ids(self, query_vectors: np.ndarray, *, namespace: str, k: int) -> list[list[str]]:
        members = [r for r in self.records.values() if r.namespace == namespace]
        matrix = np.stack([self.vectors[r.id] for r in members])
        scores = query_vectors @ matrix.T
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return [[members[j].metadata["dia_id"] for j in row] for row in top]


def run_config(*, data_file: Path, embedder: Embedder, template: str, context_turns: int,
               context_weight: float | None, backend: str, questions: list[Question],
               hybrid: bool = False) -> tuple[dict[str, dict[int, float]], float]:
    """Ingest with this config, answer every question; returns (recall table, ingest turns/s).

    backend "tiered" ingests through TieredMemory (LanceDB + a CPU hot tier), so its turns/s is
    end to end; hybrid=True (tiered only) fuses BM25 with the vector ranking."""
    by_conversation: dict[str, list[int]] = defaultdict(list)
    for index, question in enumerate(questions):
        by_conversation[question.conversation].append(index)
    retrieved: list[list[str]] = [[] for _ in questions]
    k_max = max(KS)
    if backend == "exact":
        sink = ExactSearchSink(embedder)
        summary = ingest(data_file, memory=sink, namespace="{conversation}", template=template,
                         context_turns=context_turns, context_weight=context_weight, progress=False)
        for conversation, indices in by_conversation.items():
            query_vectors = embedder([questions[i].text for i in indices])
            for i, ranking in zip(indices, sink.search_dia_ids(query_vectors, namespace=conversation, k=k_max)):
                retrieved[i] = ranking
    else:
        from tiered_recall import TieredMemory

        with tempfile.TemporaryDirectory(prefix="locomo-recall-") as folder:
            memory = TieredMemory(folder, embedder=embedder, device="cpu")
            summary = ingest(data_file, memory=memory, namespace="{conversation}", template=template,
                             context_turns=context_turns, context_weight=context_weight, progress=False)
            for conversation, indices in by_conversation.items():
                for i in indices:
                    hits = memory.search(questions[i].text, k=k_max, namespace=conversation, hybrid=hybrid)
                    retrieved[i] = [hit.metadata["dia_id"] for hit in hits]
            getattr(memory, "close", lambda: None)()
    return recall_table(questions, retrieved), summary.turns_per_second


def measure_throughput(data_file: Path, embedder: Embedder, *, template: str, repeats: int) -> float:
    # The ingest defaults (context_turns=1 mixed as a vector) are what is timed.
    """Median turns/s of parse + template + embed + (in-memory) commit over the whole file, after a warm-up."""
    rates = []
    for attempt in range(repeats + 1):
        sink = ExactSearchSink(embedder)
        started = time.perf_counter()
        summary = ingest(data_file, memory=sink, namespace="{conversation}", template=template, progress=False)
        elapsed = time.perf_counter() - started
        if attempt:  # the first run warms caches and the tokenizer
            rates.append(summary.turns_read / elapsed)
    return float(np.median(rates))


def load_embedders(names: Sequence[str]) -> list[tuple[str, Embedder | None, str]]:
    loaded = []
    for name in names:
        try:
            loaded.append((name, resolve_embedder(name), ""))
        except InvalidInput as error:
            loaded.append((name, None, "skipped: not installed" if "pip install" in str(error) else f"skipped: {error}"))
    return loaded


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding locomo_dev.json")
    parser.add_argument("--embedders", nargs="+", default=["wordllama", "minilm"])
    parser.add_argument("--templates", nargs="+", default=list(TEMPLATES), help=f"from {list(TEMPLATES)}")
    parser.add_argument("--context-turns", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--context-weights", nargs="+", default=["0.3", "text"],
                        help="vector mixing weights, or 'text' to write context into the embedded text")
    parser.add_argument("--backend", choices=("exact", "tiered"), default="exact")
    parser.add_argument("--throughput-repeats", type=int, default=3)
    parser.add_argument("--search", nargs="+", choices=("vector", "hybrid"), default=["vector"],
                        help="hybrid (BM25 + vector fusion) needs --backend tiered")
    parser.add_argument("--bm25-weight", type=float, default=None,
                        help="weight of the BM25 ranking in the hybrid fusion (default: the library's)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    data_file = args.data / DATA_FILE
    if not data_file.is_file():
        print(f"skipped: LoCoMo data not found at {data_file} (pass --data FOLDER holding {DATA_FILE})")
        return 0
    questions, stats = load_questions(data_file)
    print(f"LoCoMo dev: {len(questions)} questions (categories 1-5) over "
          f"{len({q.conversation for q in questions})} conversations; evidence ids normalised {stats.normalised}, "
          f"dropped {stats.dropped}, questions without evidence {stats.questions_without_evidence}; "
          f"backend {args.backend}")

    results: list[dict[str, Any]] = []
    if "hybrid" in args.search and args.backend != "tiered":
        parser.error("--search hybrid needs --backend tiered (the BM25 index lives in the cold tier)")
    if args.bm25_weight is not None:
        import tiered_recall.storage._search as cold_search

        cold_search.HYBRID_BM25_WEIGHT = args.bm25_weight
    header = f"{'embedder':<28}{'template':<15}{'ctx':>4}{'mix':>6}{'search':>7}{'R@5':>7}{'R@10':>7}{'R@25':>7}  " + "  ".join(
        f"c{c} R@10" for c in CATEGORIES)
    print(header)
    print("-" * len(header))
    for name, embedder, note in load_embedders(args.embedders):
        if embedder is None:
            print(f"{name:<28}{note}")
            results.append({"embedder": name, "note": note})
            continue
        for template in args.templates:
            for context_turns, weight_text in [(c, w) for c in args.context_turns
                                               for w in (args.context_weights if c else ["-"])]:
                context_weight = None if weight_text in ("text", "-") else float(weight_text)
                for mode in args.search:
                    table, rate = run_config(data_file=data_file, embedder=embedder, template=template,
                                             context_turns=context_turns, context_weight=context_weight,
                                             backend=args.backend, questions=questions, hybrid=mode == "hybrid")
                    overall = table["all"]
                    print(f"{embedder.name:<28}{template:<15}{context_turns:>4}{weight_text:>6}{mode:>7}"
                          + "".join(f"{overall[k]:>7.1f}" for k in KS)
                          + "  " + "  ".join(f"{table.get(str(c), {}).get(10, float('nan')):>7.1f}" for c in CATEGORIES)
                          + (f"  ingest {rate:,.0f} turns/s end to end" if args.backend == "tiered" else ""))
                    results.append({"embedder": embedder.name, "template": template, "context_turns": context_turns,
                                    "context_weight": weight_text, "search": mode, "backend": args.backend,
                                    "ingest_turns_per_s": round(rate, 1),
                                    "recall": {group: {str(k): round(v, 2) for k, v in row.items()}
                                               for group, row in table.items()}})
    print(f"{'DRAGON (paper, 10 conversations)':<60}" + "".join(f"{DRAGON[k]:>7.1f}" for k in KS))

    throughput = {}
    for name, embedder, _ in load_embedders(args.embedders[:1]):
        if embedder is not None:
            rate = measure_throughput(data_file, embedder, template=DEFAULT_TEMPLATE, repeats=args.throughput_repeats)
            throughput[embedder.name] = rate
            print(f"ingest throughput ({embedder.name}, ingest defaults, parse+template+embed+commit "
                  f"to an in-memory sink): {rate:,.0f} turns/s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"results": results, "throughput_turns_per_s": throughput,
                                         "dragon": DRAGON}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
