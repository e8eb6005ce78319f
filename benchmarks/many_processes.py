"""Many processes over one store: aggregate operations per second of the workers' busy time, and p50 / p99 per
operation, for 1, 2, 4, 8 (and 16) worker processes, each with the same mix of searches, single adds and deletes.

Every worker opens the same store (raw vectors, 50 namespaces loaded beforehand) and runs its mix for --seconds;
"busy time" is the sum of each worker's time inside store calls, so a machine with fewer cores than workers is not
counted as idle. Draws throughput against processes as a PNG with --png (matplotlib, the bench extra).

    python benchmarks/many_processes.py --processes 1 2 4 8 --mix 95/5 70/30 --seconds 20 --json out.json --png out.png
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from tiered_recall import TieredMemory

DIM = 256
NAMESPACES = 50


def unit(rng, n):
    x = rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def worker(path: str, device: str, seconds: float, search_share: float, delete_share: float, seed: int,
           start_at: float, out) -> None:
    rng = np.random.default_rng(seed)
    times: dict[str, list[float]] = {"search": [], "add": [], "delete": []}
    mine: list[int] = []
    with TieredMemory(path, dim=DIM, embedder=None, device=device) as memory:
        while time.time() < start_at:  # every worker starts together, after its own open
            time.sleep(0.005)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            ns = f"n{int(rng.integers(NAMESPACES))}"
            draw = rng.random()
            t0 = time.perf_counter()
            if draw < search_share:
                memory.search(unit(rng, 1)[0], k=10, namespace=ns)
                kind = "search"
            elif draw < search_share + delete_share and mine:
                memory.delete([mine.pop(int(rng.integers(len(mine))))])
                kind = "delete"
            else:
                mine += memory.add(["m"], vectors=unit(rng, 1), namespace=ns)
                kind = "add"
            times[kind].append(time.perf_counter() - t0)
    out.put(times)


def run(path: Path, device: str, processes: int, seconds: float, search_share: float, delete_share: float) -> dict:
    context = mp.get_context("spawn")
    out = context.Queue()
    start_at = time.time() + 3.0 + 0.3 * processes
    workers = [context.Process(target=worker, args=(str(path), device, seconds, search_share, delete_share, 1000 + i,
                                                    start_at, out)) for i in range(processes)]
    for w in workers:
        w.start()
    results = [out.get(timeout=seconds + 300) for _ in workers]
    for w in workers:
        w.join(timeout=60)
    merged = {kind: [t for r in results for t in r[kind]] for kind in ("search", "add", "delete")}
    busy = sum(sum(t for kind in r for t in r[kind]) for r in results)
    operations = sum(len(v) for v in merged.values())
    row = {"processes": processes, "operations": operations,
           "aggregate_ops_per_s": round(operations / busy * processes, 1) if busy else None,
           "wall_ops_per_s": round(operations / seconds, 1)}
    for kind, values in merged.items():
        if values:
            ordered = sorted(values)
            row[f"{kind}_p50_ms"] = round(statistics.median(ordered) * 1e3, 3)
            row[f"{kind}_p99_ms"] = round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3, 3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--mix", nargs="+", default=["95/5", "70/30"], help="search/write percentages")
    parser.add_argument("--deletes", type=float, default=0.2, help="share of the writes that are deletes")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "none"])
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--json")
    parser.add_argument("--png")
    args = parser.parse_args()
    rows = []
    for mix in args.mix:
        search_pct = float(mix.split("/")[0]) / 100
        writes = 1 - search_pct
        for processes in args.processes:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "store"
                rng = np.random.default_rng(0)
                with TieredMemory(path, dim=DIM, embedder=None, device=args.device,
                                  hot_capacity=args.rows * 4) as memory:
                    per = args.rows // NAMESPACES
                    for n in range(NAMESPACES):
                        memory.add(["seed"] * per, vectors=unit(rng, per), namespace=f"n{n}")
                    row = run(path, args.device, processes, args.seconds, search_pct, writes * args.deletes)
            row["mix"] = mix
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for mix in args.mix:
            mine = [r for r in rows if r["mix"] == mix]
            ax.plot([r["processes"] for r in mine], [r["aggregate_ops_per_s"] for r in mine], marker="o",
                    label=f"search/write {mix}")
        ax.set_xlabel("processes")
        ax.set_ylabel("aggregate operations / s (busy time)")
        ax.set_xscale("log", base=2)
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)


if __name__ == "__main__":
    main()
