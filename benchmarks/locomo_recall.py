"""LoCoMo retrieval recall of each preset through TieredMemory, next to DRAGON: R@5/10/25 per category, ingest turns/s,
text-search latency p50/p99 and its parts, and a PNG of recall against latency.

    .venv/bin/python benchmarks/locomo_recall.py                                   # quality and fast, with and without stages
    .venv/bin/python benchmarks/locomo_recall.py --presets quality --device cuda --json experiments/locomo-h200.json

Every conversation of the development split goes into its own namespace through the real ingest pipeline into a
TieredMemory in a temporary folder (the hot tier holds every namespace whole); each question is searched with
TieredMemory.search in its conversation's namespace, as a user's text search is: query embedding, the exact tiered
search, the preset's stages. "stages off" rows are the same store searched with stages=False (the vector search
alone). A text search's time is split, inside each search, into the query's embedding (the embedder's
embed_queries), the tiered vector search (TieredSearch.ranked_one: plan, hot tier, decide, cold tier, merge) and the
rest (the stages: BM25, fusion, re-ranking, and the facade's own work); ingest's time into embedding and writing
(which overlap: the writer thread stores one batch while the next is embedded). R@k is the LoCoMo authors' metric: the fraction of a question's evidence dia_ids among the top k turns,
averaged over questions (categories 1-5). Evidence ids are normalised as the data README says; ids naming no turn are
dropped and questions left with no evidence are not scored (both counted and printed).
"""
from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from tiered_recall.testing.locomo import CATEGORIES, DATA_FILE, DEFAULT_DATA, DRAGON, KS, load_questions, recall_table


def _percentiles(seconds: list[float]) -> dict[str, float]:
    values = np.array(seconds) * 1e3
    return {"p50_ms": round(float(np.percentile(values, 50)), 3), "p99_ms": round(float(np.percentile(values, 99)), 3)}


class _Stopwatch:
    """Wraps a bound method on its instance and adds up the seconds spent in it (from any thread)."""

    def __init__(self, owner, name: str) -> None:
        self.seconds = 0.0
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        setattr(owner, name, timed)

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def run_preset(preset: str, *, data_file: Path, questions, device: str, stage_settings: list[bool]) -> list[dict]:
    """Ingest the split with this preset, then answer every question with and/or without its stages."""
    from tiered_recall import TieredMemory, ingest

    rows = []
    with tempfile.TemporaryDirectory(prefix="locomo-recall-") as folder:
        memory = TieredMemory(folder, preset=preset, device=device)
        try:
            embedder = memory.embedder
            if hasattr(embedder, "wait_loaded"):
                embedder.wait_loaded()  # a store opens with E5 loading beside it: ingest is timed from its load
            embedding, writing = _Stopwatch(embedder, "embed_passages"), _Stopwatch(memory, "add")
            started = time.perf_counter()
            summary = ingest(data_file, memory=memory, namespace="{conversation}", progress=False)
            ingest_seconds = time.perf_counter() - started
            ingest_parts = {"turns_per_s": round(summary.turns_read / ingest_seconds, 1),
                            "embedding_s": round(embedding.take(), 3), "writing_s": round(writing.take(), 3),
                            "seconds": round(ingest_seconds, 3)}
            for question in questions[:20]:  # warm-up: caches, the encoder's first calls, a GPU's graph captures
                embedder.embed_queries([question.text])
                memory.search(question.text, k=max(KS), namespace=question.conversation)
            embed_seconds = []
            for question in questions:
                t0 = time.perf_counter()
                embedder.embed_queries([question.text])
                embed_seconds.append(time.perf_counter() - t0)
            # the parts of each search, timed inside it (the benchmark reaches into the search path for that)
            query_embedding = _Stopwatch(embedder, "embed_queries")
            vector_search = _Stopwatch(memory._search, "ranked_one")
            for staged in stage_settings:
                retrieved, search_seconds, rules = [], [], {}
                parts: dict[str, list[float]] = {"embed": [], "vector_search": [], "rest": []}
                for question in questions:
                    query_embedding.take(), vector_search.take()
                    t0 = time.perf_counter()
                    report = memory.search(question.text, k=max(KS), namespace=question.conversation,
                                           stages=None if staged else False, explain=True)
                    total = time.perf_counter() - t0
                    search_seconds.append(total)
                    embed, vector = query_embedding.take(), vector_search.take()
                    parts["embed"].append(embed)
                    parts["vector_search"].append(vector)
                    parts["rest"].append(total - embed - vector)
                    rules[report.rule] = rules.get(report.rule, 0) + 1
                    retrieved.append([hit.metadata["dia_id"] for hit in report])
                table = recall_table(questions, retrieved)
                rows.append({
                    "preset": preset, "stages": staged, "embedder": embedder.name, "device": device,
                    "backend": getattr(embedder, "backend", "-"),
                    "recall": {group: {str(k): round(v, 2) for k, v in row.items()} for group, row in table.items()},
                    "ingest_turns_per_s": ingest_parts["turns_per_s"], "ingest": ingest_parts,
                    "query_embedding": _percentiles(embed_seconds), "text_search": _percentiles(search_seconds),
                    "text_search_parts": {name: _percentiles(values) for name, values in parts.items()},
                    "rules": rules,
                })
        finally:
            memory.close()
    return rows


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from matplotlib.ticker import NullFormatter, ScalarFormatter

    figure, axes = plt.subplots(figsize=(7, 4.5))
    axes.set_xscale("log")
    for row in rows:
        label = f"{row['preset']}{'' if row['stages'] else ' (stages off)'}"
        x, y = row["text_search"]["p50_ms"], row["recall"]["all"]["10"]
        axes.scatter([x], [y], s=60, marker="o" if row["stages"] else "x")
        axes.annotate(label, (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
    axes.axhline(DRAGON[10], color="grey", linestyle="--", linewidth=1, label=f"DRAGON R@10 (paper): {DRAGON[10]}")
    axes.legend(loc="lower right", fontsize=8)
    axes.xaxis.set_major_formatter(ScalarFormatter())
    axes.xaxis.set_minor_formatter(NullFormatter())
    axes.set_xlabel("text search p50 (ms, query embedding included; log scale)")
    axes.set_ylabel("R@10 (%), LoCoMo dev split")
    axes.set_title(title, fontsize=10)
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding locomo_dev.json")
    parser.add_argument("--presets", nargs="+", default=["quality", "fast"])
    parser.add_argument("--device", default="cpu", help="the hot tier's device (cpu, cuda)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the stages-off rows")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--png", type=Path, help="draw recall against text-search latency here")
    parser.add_argument("--replot", type=Path, metavar="JSON", help="only draw --png from a --json written earlier")
    args = parser.parse_args(argv)
    if args.replot:
        if not args.png:
            parser.error("--replot needs --png")
        written = json.loads(args.replot.read_text())
        plot(written["rows"], args.png, f"LoCoMo dev recall against latency ({written['device']}, {written['machine']})")
        return 0

    data_file = args.data / DATA_FILE
    if not data_file.is_file():
        print(f"skipped: LoCoMo data not found at {data_file} (pass --data FOLDER holding {DATA_FILE})")
        return 0
    questions, stats = load_questions(data_file)
    machine = f"{platform.node()} ({platform.processor() or platform.machine()}, {len(__import__('os').sched_getaffinity(0))} cores)"
    print(f"LoCoMo dev: {len(questions)} questions (categories 1-5) over "
          f"{len({q.conversation for q in questions})} conversations; evidence ids normalised {stats.normalised}, "
          f"dropped {stats.dropped}, questions without evidence {stats.questions_without_evidence}; device {args.device}; "
          f"{machine}")
    header = (f"{'preset':<9}{'stages':<7}{'embedder (runtime)':<36}{'R@5':>6}{'R@10':>6}{'R@25':>6}  "
              + " ".join(f"c{c}@10" for c in CATEGORIES) + f"{'ingest/s':>10}{'embed p50/p99':>15}{'search p50/p99':>16}"
              + f"{'= embed':>15}{'+ vector':>15}{'+ stages, rest':>16}")
    print(header)
    print("-" * len(header))
    rows = []
    for preset in args.presets:
        for row in run_preset(preset, data_file=data_file, questions=questions, device=args.device,
                              stage_settings=[True] if args.no_baseline else [True, False]):
            rows.append(row)
            overall = row["recall"]["all"]
            embed, search = row["query_embedding"], row["text_search"]
            runtime = f"{row['embedder']} ({row['backend']})" if row["backend"] != "-" else row["embedder"]
            print(f"{row['preset']:<9}{'on' if row['stages'] else 'off':<7}{runtime:<36}"
                  + "".join(f"{overall[str(k)]:>6.1f}" for k in KS) + "  "
                  + " ".join(f"{row['recall'].get(str(c), {}).get('10', float('nan')):>5.1f}" for c in CATEGORIES)
                  + f"{row['ingest_turns_per_s']:>10,.0f}{embed['p50_ms']:>8.2f}/{embed['p99_ms']:<6.2f}"
                  + f"{search['p50_ms']:>9.2f}/{search['p99_ms']:<6.2f}"
                  + "".join(f"{part['p50_ms']:>8.3f}/{part['p99_ms']:<6.3f}" for part in row["text_search_parts"].values())
                  + ("" if not row["stages"] else
                     f"  (ingest: embedding {row['ingest']['embedding_s']:.1f} s, writing {row['ingest']['writing_s']:.1f} s"
                     f" of {row['ingest']['seconds']:.1f} s)"), flush=True)
    print(f"{'DRAGON (paper, 10 conversations)':<52}" + "".join(f"{DRAGON[k]:>6.1f}" for k in KS))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"machine": machine, "device": args.device, "questions": len(questions),
                                         "rows": rows, "dragon": DRAGON}, indent=2))
    if args.png:
        plot(rows, args.png, f"LoCoMo dev recall against latency ({args.device}, {machine})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
