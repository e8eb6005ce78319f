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
time can be the wait for a core, which no change to the store takes away. `add_cores_given_mean` and `_p99`, ...
count the times an operation was given a core again before it returned (0: it ran through): each one followed a
block or a preemption, and may have followed a wait for a core.

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

--stores none is the floor: no store at all. Every worker spends --floor-cpu-ms of CPU time on each operation (about
what a store operation costs the machine: compare the store rows' worker_cpu_ms_per_op), and each of its writes is
also a bare durable append, the size of one logged 256-d add, to one file the workers share (O_APPEND, then
fdatasync, which the kernel merges across processes). Its add p99 is what the machine gives any store that makes an
add durable before it returns, with that many workers on its cores. Give several --stores to run them alternated in
one sitting; the median lines then also compare each store row with the floor's (`aggregate_share_of_floor`,
`add_p99_over_floor`).

    python benchmarks/many_processes.py --processes 2 8 --mix 95/5 --seconds 8 --rounds 3 --stores shared none
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
    """A function giving the calling thread's total run-queue wait in seconds and how many times it was given a
    core (one pread of schedstat, ~1 us), or None where the kernel has no schedstat. An operation given a core more
    than once blocked (on the disk, a lock, the sidecar) or was preempted in between, and each time it became
    runnable again it may have waited for a core."""
    try:
        fd = os.open(SCHEDSTAT, os.O_RDONLY)
        os.pread(fd, 128, 0)
    except OSError:
        return None

    def read() -> tuple[float, int]:
        fields = os.pread(fd, 128, 0).split()
        return int(fields[1]) / 1e9, int(fields[2])

    return read


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


# One logged add of a 256-d vector and its columns is about this many bytes in the log (the floor appends as much).
FLOOR_RECORD_BYTES = DIM * 4 + 256


def burn(seconds: float) -> None:
    """Spends `seconds` of this thread's CPU time (not wall time: a worker that loses its core still does all of
    its work, as a store operation would)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def new_timings() -> tuple[dict, dict, dict]:
    """Per operation kind: wall times, waits for a core, and the times each operation was given a core."""
    return tuple({"search": [], "add": [], "delete": []} for _ in range(3))


def record(times: dict, waits: dict, switches: dict, kind: str, t0: float, before: tuple[float, int],
           after: tuple[float, int]) -> None:
    """Notes one operation of `kind`: its wall time since t0, its wait for a core and the times it was given one
    (schedstat read before and after it)."""
    times[kind].append(time.perf_counter() - t0)
    waits[kind].append(after[0] - before[0])
    switches[kind].append(after[1] - before[1])


def floor_worker(path: str, seconds: float, search_share: float, delete_share: float, cpu_s: float, seed: int,
                 ready, out) -> None:
    """The --stores none floor: the mix's operations, each `cpu_s` of CPU time, its writes also a durable append to
    the shared file at `path`; puts its times on `out` as measure does."""
    rng = np.random.default_rng(seed)
    times, waits, switches = new_timings()
    clock = runqueue_clock()
    runq = clock or (lambda: (0.0, 0))
    payload = rng.bytes(FLOOR_RECORD_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        ready.wait()
        deadline = time.monotonic() + seconds
        cpu0 = time.process_time()
        while time.monotonic() < deadline:
            draw = rng.random()
            kind = "search" if draw < search_share else "delete" if draw < search_share + delete_share else "add"
            q0, t0 = runq(), time.perf_counter()
            burn(cpu_s)
            if kind != "search":
                os.write(fd, payload)
                os.fdatasync(fd)
            record(times, waits, switches, kind, t0, q0, runq())
        cpu_s_used = time.process_time() - cpu0
    finally:
        os.close(fd)
    out.put({"times": times, "waits": waits if clock else None, "switches": switches if clock else None,
             "hot_hit_rate": None, "repairs": 0, "left": 0, "cpu_s": cpu_s_used})


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
    times, waits, switches = new_timings()
    clock = runqueue_clock()
    runq = clock or (lambda: (0.0, 0))
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
            record(times, waits, switches, kind, t0, q0, runq())
        cpu_s = time.process_time() - cpu0
        stats = memory.stats()
    out.put({"times": times, "waits": waits if clock else None, "switches": switches if clock else None,
             "hot_hit_rate": stats.get("hot_hit_rate"),
             "repairs": stats["rows_moved"]["repairs"],
             "left": (stats.get("hot_writes") or {}).get("left_to_others", 0), "cpu_s": cpu_s})


def run(paths: list[Path], device: str, embedder: str, processes: int, seconds: float, search_share: float,
        delete_share: float, floor_cpu_s: float | None = None) -> dict:
    """One row: `processes` workers over the stores at `paths` (one shared store, or one store per worker), or with
    `floor_cpu_s` the floor's workers over the one file at paths[0]."""
    context = mp.get_context("spawn")
    out = context.Queue()
    ready = context.Barrier(processes, timeout=600)
    private = len(paths) > 1
    if floor_cpu_s is not None:
        workers = [context.Process(target=floor_worker, args=(str(paths[0]), seconds, search_share, delete_share,
                                                              floor_cpu_s, 1000 + i, ready, out))
                   for i in range(processes)]
    else:
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
                given = [n for r in reports for n in r["switches"][kind]]
                row[f"{kind}_cores_given_mean"] = round(statistics.mean(given), 2)
                row[f"{kind}_cores_given_p99"] = percentile(given, 0.99)
    return row


def percentile(values: list[float], q: float) -> float:
    """The q-quantile of values: the median for q = 0.5, otherwise the value at rank q * n."""
    ordered = sorted(values)
    if q == 0.5:
        return statistics.median(ordered)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def summarise(rows: list[dict], counts: list[int]) -> list[dict]:
    """Per store kind, mix and process count over the rounds: the median of each figure, the aggregate's spread,
    and its median as a share of the smallest process count's median (the rounds alternate, so both saw the same
    drift); a store row with a floor row beside it also gets its aggregate as a share of the floor's and its add
    p99 as a multiple of the floor's."""
    out = []
    for stores, mix in dict.fromkeys((r["stores"], r["mix"]) for r in rows):
        lines = []
        for processes in counts:
            mine = [r for r in rows if (r["stores"], r["mix"], r["processes"]) == (stores, mix, processes)]
            line = {"summary": "median", "stores": stores, "mix": mix, "processes": processes, "rounds": len(mine)}
            for key in mine[0]:
                if key in ("processes", "round"):
                    continue
                values = [r[key] for r in mine if isinstance(r.get(key), (int, float))]
                if values:
                    line[key] = round(statistics.median(values), 4)
            line["aggregate_ops_per_s_all"] = [r["aggregate_ops_per_s"] for r in mine]
            lines.append(line)
        base = next(line["aggregate_ops_per_s"] for line in lines if line["processes"] == min(counts))
        for line in lines:
            if base:
                line[f"share_of_{min(counts)}_processes"] = round(line["aggregate_ops_per_s"] / base, 3)
        out += lines
    floors = {(line["mix"], line["processes"]): line for line in out if line["stores"] == "none"}
    for line in out:
        floor = floors.get((line["mix"], line["processes"]))
        if line["stores"] == "none" or floor is None:
            continue
        if floor.get("aggregate_ops_per_s"):
            line["aggregate_share_of_floor"] = round(line["aggregate_ops_per_s"] / floor["aggregate_ops_per_s"], 3)
        if floor.get("add_p99_ms") and line.get("add_p99_ms"):
            line["add_p99_over_floor"] = round(line["add_p99_ms"] / floor["add_p99_ms"], 2)
    return out


def run_row(tmp: Path, seeded: Path, args, stores: str, mix: str, processes: int, search_share: float,
            delete_share: float) -> dict:
    """One row of the sitting: fresh copies of the seeded store (or, for the floor, a fresh shared file)."""
    run_dir = tmp / f"run-{stores}-{mix.replace('/', '-')}-{processes}"
    run_dir.mkdir()
    try:
        if stores == "none":
            row = run([run_dir / "floor.log"], "none", args.embedder, processes, args.seconds, search_share,
                      delete_share, floor_cpu_s=args.floor_cpu_ms / 1e3)
            row["floor_cpu_ms"] = args.floor_cpu_ms
            return row
        paths = [run_dir / f"store-{i}" for i in range(processes if stores == "private" else 1)]
        with contextlib.ExitStack() as sidecars:
            if len(paths) > 1:  # the parent's handles flush too: at the control's cadence
                sidecars.enter_context(log_flushes_stretched(float(processes)))
            for path in paths:
                shutil.copytree(seeded, path, ignore=shutil.ignore_patterns("*.lock", "metrics"))
                # opened here first, so that its sidecar is up before the workers start
                sidecars.enter_context(open_store(path, args.device, args.embedder, hot_capacity=args.rows * 4))
            return run(paths, args.device, args.embedder, processes, args.seconds, search_share, delete_share)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


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
    parser.add_argument("--stores", nargs="+", default=["shared"], choices=["shared", "private", "none"],
                        help="shared: every worker opens the one store; private: the control, a store of its own "
                             "per worker (nothing shared); none: the floor, no store (see above). Several are run "
                             "alternated")
    parser.add_argument("--floor-cpu-ms", type=float, default=0.25,
                        help="CPU time of each of the floor's operations, in ms (--stores none)")
    parser.add_argument("--json", help="also write every row (and the medians) here")
    parser.add_argument("--png", help="draw throughput against processes here (matplotlib: the bench extra)")
    args = parser.parse_args()
    if args.floor_cpu_ms < 0:
        parser.error("--floor-cpu-ms must be 0 or more")
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
                    for stores in args.stores:
                        row = run_row(Path(tmp), seeded, args, stores, mix, processes, search_pct,
                                      writes * args.deletes)
                        row.update(mix=mix, embedder=args.embedder,
                                   device=args.device if stores != "none" else "none", stores=stores,
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
        kinds = {"shared": "one store", "private": "a store per process", "none": "no store (the floor)"}
        for stores in args.stores:
            for mix in args.mix:
                mine = [r for r in rows if r["mix"] == mix and r["stores"] == stores]
                what = args.embedder if args.embedder != "none" else "raw vectors"
                ax.plot([r["processes"] for r in mine], [r["aggregate_ops_per_s"] for r in mine], marker="o",
                        label=f"{kinds[stores]}, search/write {mix} ({what})")
        ax.set_xlabel("processes")
        ax.set_ylabel("aggregate operations / s (busy time)")
        ax.set_title(f"{args.device} hot tier")
        ax.set_xscale("log", base=2)
        ax.set_xticks(args.processes, [str(p) for p in args.processes])
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)


if __name__ == "__main__":
    main()
