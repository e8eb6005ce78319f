"""Whether the retrieval stages help on conversations of two shapes: each preset's R@1/5/10/25 with its stages and
without (stages=False) on the chats set (benchmarks/data/chats: each half, and R@5 by kind of question) and on the
LoCoMo dev split, in one run.

    .venv/bin/python benchmarks/stages_recall.py                          # quality and fast, both sets
    .venv/bin/python benchmarks/stages_recall.py --presets fast --sets chats --json experiments/stages-fast.json

Per preset, one TieredMemory in a temporary folder takes both sets through the real ingest pipeline, one namespace per
conversation (the hot tier holds every namespace whole), and every question is searched with TieredMemory.search in
its conversation's namespace, as a user's text search is: query embedding, the exact tiered search, the preset's
stages; "off" is the same store searched with stages=False (the vector search alone). R@k is the share of a
question's answer turns among the top k, averaged over questions (the LoCoMo authors' metric; LoCoMo questions of
categories 1-5, evidence normalised as benchmarks/locomo_recall.py does). The LoCoMo rows are skipped, with a line
saying so, where the dev split is not found.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from tiered_recall.testing import chats, locomo
from tiered_recall.testing.locomo import recall_table

KS = (1, 5, 10, 25)
CHATS = Path(__file__).resolve().parent / "data" / "chats"


def score(memory, questions, key: str, staged: bool) -> tuple[dict, list[float]]:
    """Every question searched in its namespace: the recall table (also by kind or category) and each search's
    seconds."""
    retrieved, seconds = [], []
    for question in questions:
        started = time.perf_counter()
        hits = memory.search(question.text, k=max(KS), namespace=question.conversation,
                             stages=None if staged else False)
        seconds.append(time.perf_counter() - started)
        retrieved.append([hit.metadata[key] for hit in hits])
    return recall_table(questions, retrieved, KS), seconds


def run_preset(preset: str, *, sets: dict, device: str) -> list[dict]:
    """Ingest every set into one store with this preset, then answer each set's questions with and without stages."""
    from tiered_recall import TieredMemory, ingest

    rows = []
    with tempfile.TemporaryDirectory(prefix="stages-recall-") as folder:
        memory = TieredMemory(folder, preset=preset, device=device)
        try:
            for name, (paths, groups, key) in sets.items():
                started = time.perf_counter()
                summary = ingest(paths, memory=memory, namespace="{conversation}", progress=False)
                ingest_seconds = time.perf_counter() - started
                warm = next(iter(groups.values()))[:10]
                score(memory, warm, key, True)  # caches and the encoder's first calls
                for group, questions in groups.items():
                    for staged in (True, False):
                        table, seconds = score(memory, questions, key, staged)
                        rows.append({
                            "preset": preset, "set": name, "group": group, "stages": staged,
                            "questions": len(questions), "embedder": memory.embedder.name,
                            "recall": {g: {str(k): round(v, 2) for k, v in r.items()} for g, r in table.items()},
                            "search_p50_ms": round(float(np.percentile(seconds, 50)) * 1e3, 3),
                            "ingest_turns_per_s": round(summary.turns_read / ingest_seconds, 1),
                        })
        finally:
            memory.close()
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["quality", "fast"])
    parser.add_argument("--sets", nargs="+", default=["chats", "locomo"], choices=["chats", "locomo"])
    parser.add_argument("--chats", type=Path, default=CHATS, help="folder of the chats set")
    parser.add_argument("--data", type=Path, default=locomo.DEFAULT_DATA, help="folder holding locomo_dev.json")
    parser.add_argument("--device", default="cpu", help="the hot tier's device (cpu, cuda)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)

    sets = {}
    if "chats" in args.sets:
        halves = {split: chats.load_questions(args.chats, conversations=chats.conversation_files(args.chats, split=split))
                  for split in chats.SPLITS}
        sets["chats"] = (chats.conversation_files(args.chats),
                         {"all": [q for split in chats.SPLITS for q in halves[split]], **halves}, "position")
    if "locomo" in args.sets:
        data_file = args.data / locomo.DATA_FILE
        if data_file.is_file():
            questions, _ = locomo.load_questions(data_file)
            sets["locomo"] = (data_file, {"dev": questions}, "dia_id")
        else:
            print(f"LoCoMo skipped: {data_file} not found (pass --data FOLDER holding {locomo.DATA_FILE})")
    if not sets:
        print("nothing to measure")
        return 0
    machine = f"{platform.node()} ({platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} cores)"
    print("sets: " + ", ".join(f"{name} ({', '.join(f'{g} {len(q)}' for g, q in groups.items())} questions)"
                               for name, (_, groups, _) in sets.items()) + f"; device {args.device}; {machine}")
    kinds = " ".join(f"{kind[:5]:>6}" for kind in chats.KINDS)
    header = (f"{'preset':<9}{'set':<8}{'group':<10}{'stages':<7}" + "".join(f"{f'R@{k}':>6}" for k in KS)
              + f"{'p50 ms':>8}   R@5 by kind: {kinds}")
    print(header)
    print("-" * len(header))
    rows = []
    for preset in args.presets:
        for row in run_preset(preset, sets=sets, device=args.device):
            rows.append(row)
            recall = row["recall"]
            by_kind = " ".join(f"{recall[kind]['5']:>6.1f}" if kind in recall else f"{'-':>6}" for kind in chats.KINDS) \
                if row["set"] == "chats" else ""
            print(f"{row['preset']:<9}{row['set']:<8}{row['group']:<10}{'on' if row['stages'] else 'off':<7}"
                  + "".join(f"{recall['all'][str(k)]:>6.1f}" for k in KS) + f"{row['search_p50_ms']:>8.2f}"
                  + (f"   {' ' * 13}{by_kind}" if by_kind else ""), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"machine": machine, "device": args.device, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
