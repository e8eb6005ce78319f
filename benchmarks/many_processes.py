"""Many processes over one store: aggregate operations per second of the workers' busy time, and p50 / p99 per
operation, for 1, 2, 4, 8 and 16 worker processes, each with the same mix of searches, single adds and deletes.

Every worker opens the same store (50 namespaces loaded beforehand, copied afresh for each run) and runs its mix
for --seconds; "busy time" is the sum of each worker's time inside store calls, so a machine with fewer cores than
workers is not counted as idle. --embedder none stores raw 256-d vectors; --embedder default stores texts with the
default preset (its embedder and stages: every add embeds its text, every search its query). Each row also gives
the hot tier's share of searches, the repairs of stale slots, and the writes whose hot-tier side their writer left to
another process (a crowded machine, or a lock held by another). Draws throughput against processes as a PNG with
--png (matplotlib, the bench extra).

    python benchmarks/many_processes.py --processes 1 2 4 8 16 --mix 95/5 70/30 --seconds 20 --json out.json --png out.png
    python benchmarks/many_processes.py --embedder default --processes 1 2 4 8 --mix 95/5 --seconds 20
    python benchmarks/many_processes.py --processes 2 8 --mix 95/5 --seconds 8 --rounds 5   (medians, 8 against 2)

Each row also gives, per operation, the share of its time spent waiting for a core (`runq_share`: runnable but not
running, from Linux's /proc/thread-self/schedstat) and the p99 of the time it spent otherwise (`add_own_p99_ms`,
...: running, or blocked on the disk, a lock or the sidecar): with more workers than cores most of an operation's
time can be the wait for a core, which no change to the store takes away.

Each row also gives the workers' CPU time per operation (every thread of every worker, over its run): what an
operation costs the machine, which a busy neighbour on a shared host inflates less than the throughput. With
--rounds N every row is run N times, the rows alternating, and a median line per row follows, with the
aggregate's median as a share of the smallest process count's.

--stores private is the control: every worker runs the same mix on a store of its own (its own copy of the seeded
store, its own log, and with a hot tier its own sidecar), so nothing is shared between processes, and what its rows
lose from 2 to 8 processes is what the machine loses (cores, caches, the scheduler), not the store's sharing. Its
stores flush their logs N times less often, so that N of them together commit to LanceDB as often as one shared
store does; otherwise the control would carry N times the commits. Compare --stores shared and --stores private in
one sitting (device none for both, so neither has a sidecar).

    python benchmarks/many_processes.py --processes 2 8 --mix 95/5 --seconds 8 --rounds 3 --device none --stores private
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import json
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from tiered_recall import TieredMemory

DIM = 256
NAMESPACES = 50
# The calling thread's CPU time, its time waiting on a run queue (both ns) and its timeslices: Linux's schedstat.
SCHEDSTAT = "/proc/thread-self/schedstat"


def runqueue_clock():
    """A function giving the calling thread's total run-queue wait in seconds (one pread of schedstat, ~1 us), or
    None where the kernel has no schedstat."""
    try:
        fd = os.open(SCHEDSTAT, os.O_RDONLY)
        os.pread(fd, 128, 0)
    except OSError:
        return None
    return lambda: int(os.pread(fd, 128, 0).split()[1]) / 1e9


def unit(rng, n):
    x = rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
         "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango")


def sentence(rng) -> str:
    return "memory about " + " ".join(rng.choice(WORDS, 6))


@contextlib.contextmanager
def log_flushes_stretched(factor: float):
    """Within the block, every store this process opens flushes its log `factor` times less often than the default:
    the --stores private control's N stores then commit to LanceDB as often, together, as one shared store does.
    The cadence is the cold tier's own option (ColdStore's wal_flush_s), which TieredMemory does not expose."""
    if factor == 1.0:
        yield
        return
    from tiered_recall.storage import cold_store

    init = cold_store.ColdStore.__init__
    default = inspect.signature(init).parameters["wal_flush_s"].default
    cold_store.ColdStore.__init__ = functools.partialmethod(init, wal_flush_s=default * factor)
    try:
        yield
    finally:
        cold_store.ColdStore.__init__ = init


def open_store(path, device: str, embedder: str, **options) -> TieredMemory:
    if embedder == "none":
        return TieredMemory(path, dim=DIM, embedder=None, device=device, **options)
    return TieredMemory(path, device=device, **options)  # the default preset, and its embedder


def worker(path: str, device: str, embedder: str, seconds: float, search_share: float, delete_share: float,
           seed: int, ready, out, flush_stretch: float = 1.0) -> None:
    """Runs the mix on the store at `path` for `seconds` and puts its times on `out`; `flush_stretch` > 1 for the
    --stores private control (log_flushes_stretched)."""
    with log_flushes_stretched(flush_stretch):
        measure(path, device, embedder, seconds, search_share, delete_share, seed, ready, out)


def measure(path: str, device: str, embedder: str, seconds: float, search_share: float, delete_share: float,
            seed: int, ready, out) -> None:
    """One worker's run of its mix (see worker)."""
    rng = np.random.default_rng(seed)
    times: dict[str, list[float]] = {"search": [], "add": [], "delete": []}
    waits: dict[str, list[float]] = {"search": [], "add": [], "delete": []}  # of each operation, waiting for a core
    clock = runqueue_clock()
    runq = clock or (lambda: 0.0)
    mine: list[int] = []
    texts = embedder != "none"
    with open_store(path, device, embedder) as memory:
        # Every worker starts together once all have opened the store: an open costs a couple of CPU seconds
        # (imports, the mirror), and a worker measured while others still open would count their start-up.
        ready.wait()
        deadline = time.monotonic() + seconds
        cpu0 = time.process_time()
        while time.monotonic() < deadline:
            ns = f"n{int(rng.integers(NAMESPACES))}"
            draw = rng.random()
            if draw < search_share:
                query = sentence(rng) if texts else unit(rng, 1)[0]
                q0, t0 = runq(), time.perf_counter()
                memory.search(query, k=10, namespace=ns)
                kind = "search"
            elif draw < search_share + delete_share and mine:
                victim = mine.pop(int(rng.integers(len(mine))))
                q0, t0 = runq(), time.perf_counter()
                memory.delete([victim])
                kind = "delete"
            else:
                text, vectors = (sentence(rng), None) if texts else ("m", unit(rng, 1))
                q0, t0 = runq(), time.perf_counter()
                mine += memory.add([text], vectors=vectors, namespace=ns)
                kind = "add"
            times[kind].append(time.perf_counter() - t0)
            waits[kind].append(runq() - q0)
        cpu_s = time.process_time() - cpu0
        stats = memory.stats()
    out.put({"times": times, "waits": waits if clock else None, "hot_hit_rate": stats.get("hot_hit_rate"),
             "repairs": stats["rows_moved"]["repairs"],
             "left": (stats.get("hot_writes") or {}).get("left_to_others", 0), "cpu_s": cpu_s})


def run(paths: list[Path], device: str, embedder: str, processes: int, seconds: float, search_share: float,
        delete_share: float) -> dict:
    """One row: `processes` workers over the stores at `paths` (one shared store, or one store per worker)."""
    context = mp.get_context("spawn")
    out = context.Queue()
    ready = context.Barrier(processes, timeout=600)
    private = len(paths) > 1
    workers = [context.Process(target=worker, args=(str(paths[i if private else 0]), device, embedder, seconds,
                                                    search_share, delete_share, 1000 + i, ready, out,
                                                    float(processes) if private else 1.0))
               for i in range(processes)]
    for w in workers:
        w.start()
    reports = [out.get(timeout=seconds + 300) for _ in workers]
    for w in workers:
        w.join(timeout=60)
    results = [r["times"] for r in reports]
    merged = {kind: [t for r in results for t in r[kind]] for kind in ("search", "add", "delete")}
    busy = sum(sum(t for kind in r for t in r[kind]) for r in results)
    operations = sum(len(v) for v in merged.values())
    row = {"processes": processes, "operations": operations,
           "aggregate_ops_per_s": round(operations / busy * processes, 1) if busy else None,
           "wall_ops_per_s": round(operations / seconds, 1),
           "hot_hit_rate": round(statistics.mean(r["hot_hit_rate"] or 0.0 for r in reports), 4),
           "repairs": sum(r["repairs"] for r in reports),
           "writes_left_to_searches": sum(r["left"] for r in reports),
           "worker_cpu_ms_per_op": round(sum(r["cpu_s"] for r in reports) / operations * 1e3, 4) if operations else None}
    measured_waits = all(r["waits"] is not None for r in reports)
    if measured_waits:
        row["runq_share"] = round(sum(w for r in reports for kind in r["waits"] for w in r["waits"][kind]) / busy, 3)
    for kind, values in merged.items():
        if values:
            row[f"{kind}_p50_ms"] = round(percentile(values, 0.5) * 1e3, 3)
            row[f"{kind}_p99_ms"] = round(percentile(values, 0.99) * 1e3, 3)
            if measured_waits:
                own = [t - w for r in reports for t, w in zip(r["times"][kind], r["waits"][kind])]
                row[f"{kind}_own_p99_ms"] = round(percentile(own, 0.99) * 1e3, 3)
    return row


def percentile(values: list[float], q: float) -> float:
    """The q-quantile of values: the median for q = 0.5, otherwise the value at rank q * n."""
    ordered = sorted(values)
    if q == 0.5:
        return statistics.median(ordered)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def summarise(rows: list[dict], counts: list[int]) -> list[dict]:
    """Per mix and process count over the rounds: the median of each figure, the aggregate's spread, and its
    median as a share of the smallest process count's median (the rounds alternate, so both saw the same drift)."""
    out = []
    for mix in dict.fromkeys(r["mix"] for r in rows):
        medians = {}
        for processes in counts:
            mine = [r for r in rows if r["mix"] == mix and r["processes"] == processes]
            line = {"summary": "median", "mix": mix, "processes": processes, "rounds": len(mine)}
            for key in mine[0]:
                if key in ("processes", "round"):
                    continue
                values = [r[key] for r in mine if isinstance(r.get(key), (int, float))]
                if values:
                    line[key] = round(statistics.median(values), 4)
            line["aggregate_ops_per_s_all"] = [r["aggregate_ops_per_s"] for r in mine]
            medians[processes] = line["aggregate_ops_per_s"]
            out.append(line)
        base = medians[min(counts)]
        for line in out:
            if line["mix"] == mix and base:
                line[f"share_of_{min(counts)}_processes"] = round(line["aggregate_ops_per_s"] / base, 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4, 8, 16],
                        help="worker process counts, one row each (default: 1 2 4 8 16)")
    parser.add_argument("--mix", nargs="+", default=["95/5", "70/30"], help="search/write percentages")
    parser.add_argument("--deletes", type=float, default=0.2, help="share of the writes that are deletes")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long every worker runs its mix per row")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "none"],
                        help="the hot tier's sidecar backend (none: the cold tier alone)")
    parser.add_argument("--embedder", default="none", choices=["none", "default"],
                        help="none: raw 256-d vectors; default: texts, with the default preset's embedder")
    parser.add_argument("--rows", type=int, default=5000, help="memories loaded beforehand, over 50 namespaces")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every row this many times, alternating, and add a median line per row (the "
                             "machine's speed drifts between runs; compare rows by their medians)")
    parser.add_argument("--stores", default="shared", choices=["shared", "private"],
                        help="shared: every worker opens the one store; private: the control, a store of its own "
                             "per worker (nothing shared; see above)")
    parser.add_argument("--json", help="also write every row (and the medians) here")
    parser.add_argument("--png", help="draw throughput against processes here (matplotlib: the bench extra)")
    args = parser.parse_args()
    if args.png:
        try:
            import matplotlib  # noqa: F401  (checked before the run, not after it)
        except ImportError:
            parser.error("--png needs matplotlib: pip install \"tiered-recall[bench]\"")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        seeded = Path(tmp) / "seeded"
        rng = np.random.default_rng(0)
        with open_store(seeded, "none", args.embedder) as memory:  # loaded once, copied for every run
            per = args.rows // NAMESPACES
            for n in range(NAMESPACES):
                if args.embedder == "none":
                    memory.add(["seed"] * per, vectors=unit(rng, per), namespace=f"n{n}")
                else:
                    memory.add([sentence(rng) for _ in range(per)], namespace=f"n{n}")
            memory.cold.flush()
        for round_ in range(1, args.rounds + 1):
            for mix in args.mix:
                search_pct = float(mix.split("/")[0]) / 100
                writes = 1 - search_pct
                for processes in args.processes:
                    run_dir = Path(tmp) / f"run-{mix.replace('/', '-')}-{processes}"
                    paths = [run_dir / f"store-{i}" for i in range(processes if args.stores == "private" else 1)]
                    with contextlib.ExitStack() as sidecars:
                        if len(paths) > 1:  # the parent's handles flush too: at the control's cadence
                            sidecars.enter_context(log_flushes_stretched(float(processes)))
                        for path in paths:
                            shutil.copytree(seeded, path, ignore=shutil.ignore_patterns("*.lock", "metrics"))
                            # opened here first, so that its sidecar is up before the workers start
                            sidecars.enter_context(open_store(path, args.device, args.embedder,
                                                              hot_capacity=args.rows * 4))
                        row = run(paths, args.device, args.embedder, processes, args.seconds, search_pct,
                                  writes * args.deletes)
                    shutil.rmtree(run_dir, ignore_errors=True)
                    row.update(mix=mix, embedder=args.embedder, device=args.device, stores=args.stores,
                               round=round_)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    summary = summarise(rows, args.processes) if args.rounds > 1 else []
    for line in summary:
        print(json.dumps(line), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows + summary, indent=2))
    rows = summary or rows  # the plot shows the medians when there are rounds
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for mix in args.mix:
            mine = [r for r in rows if r["mix"] == mix]
            ax.plot([r["processes"] for r in mine], [r["aggregate_ops_per_s"] for r in mine], marker="o",
                    label=f"search/write {mix} ({args.embedder if args.embedder != 'none' else 'raw vectors'})")
        ax.set_xlabel("processes")
        ax.set_ylabel("aggregate operations / s (busy time)")
        ax.set_title(f"{'one store' if args.stores == 'shared' else 'a store per process'}, {args.device} hot tier")
        ax.set_xscale("log", base=2)
        ax.set_xticks(args.processes, [str(p) for p in args.processes])
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)


if __name__ == "__main__":
    main()
