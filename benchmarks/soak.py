"""Soak (issue 8, part 5): mixed operations from many processes on one store (search, add, delete, re-ingest),
all through the public TieredMemory API; resident memory, open file descriptors, shared-memory segments and
GPU memory before and after, printed.

    python benchmarks/soak.py --processes 8 --ops 1000000
    python benchmarks/soak.py --processes 8 --ops 20000 --profile /tmp/soak-prof   (cProfile per worker)

--ops is the total over all processes (each worker does ops / processes, after its own warm-up). Each worker first
adds --prefill rows; the default --mix balanced then adds and deletes alike, so the store's live rows stay about
constant and each worker's memory after the run can be compared with its own before (same data); --mix growing
adds twice what it deletes (the store grows, and the fresh process below is the comparison).

Measurement points (the same point of the life cycle on both sides):
  before = every worker has started, opened the store and done --warmup operations of the same mix
           (so imports, LanceDB/Arrow thread pools, caches and the sidecar's first growth are behind us);
  after  = every worker has done its measured operations, still attached (store open), the parent idle.
Both are taken in the parent (its own process, the sidecar, /dev/shm, the GPU) while the workers wait on a
barrier, and by each worker for itself. Each worker also samples its RSS and fd count at 10 points of its run,
so growth per operation can be told from a one-time step. Once the workers have closed the store, one fresh
process opens it as they left it and does the same warm-up: its RSS is what the store's data at the end asks of
a worker, so a worker's "after" above it is growth the data does not explain; it then runs one flush and one
maintenance pass and the warm-up again (every worker of a long run has been through those), a second figure for
the steady state. Each worker and that process also report after --settle-s idle seconds (default 15; the store
open, no operations): LanceDB's runtime starts threads for bursts of work (compaction, cleanup) and ends them
after about 10 idle seconds, and each keeps its stack and glibc's per-thread cache of freed blocks until then. Both also report their RSS after glibc's malloc_trim(0), which tells memory the allocator kept
after it was freed from memory still in use, split into anonymous memory (what a process holds) and file-backed
pages (mapped code: LanceDB's first flush maps ~16 MB more of its library, which no allocator can give back).
Each worker also closes its store once before "before" and once after its run (after every other figure), and is
measured with the store closed (after gc, --settle-s idle seconds and malloc_trim: what outlives the store in the
process), then reopens it and does the warm-up again before "before", and at the end, where it is measured once
more ("reopened": the same point of the life cycle as "before", with the run behind it). --reopen-warmup sets the
operations after each reopen (and the fresh process's warm-up) apart from --warmup, for a plateau run:

    python benchmarks/soak.py --processes 8 --ops 1000000 --warmup 125000 --reopen-warmup 10000
Finally, after every process has closed the store: is the sidecar gone, is /dev/shm as it was at the start, and
GPU memory (or "no GPU").

Where a mixed operation's time goes: count, total and mean ms per kind, and the store's cross-process write lock
(TieredMemory._write_lock.held, timed from outside): total wait, total held, mean held per add and per delete, and
the share of wall time some process held it. A share near 1.0 means the run is bound by the serialised write
section (commit + cross-process sync), not by searches or the soak. The workers' searches by rule and by path and
their rows moved (repairs and resyncs among them), summed over their whole lives, warm-ups included, tell how often
the hot tier answered alone and what the cold paths cost. --profile DIR writes a cProfile per worker;
--tracemalloc N prints, per worker, the Python allocations the last four fifths of its run left behind, by stack;
--native-heap DIR records worker 0 with memray (every malloc of every library, LanceDB's included) and prints what
its heap held at the end less what it held at "before", and with its store closed after the run less before it,
by stack, and its heap over the run.

GPU: on a machine with nvidia-smi, device memory in all and per sidecar process before, after and after close
(--device cuda); otherwise "no GPU". --lance-cache-mib N (diagnostic) caps LanceDB's per-connection metadata and
index caches (default 1 GiB and 6 GiB), to tell LanceDB's version-metadata cache from a leak.

Prints one JSON line (and a summary line on stderr; progress every 60 s).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tiered_recall.testing.process_figures import (fd_kinds, fds, gpu_figures, malloc_kb, rss_kb, rss_parts_kb,
                                                    shm_segments, threads, trimmed_rss_kb)

DIM = 32
KINDS = ("search", "add", "delete", "ingest")


def embed(texts):
    """A deterministic bag-of-hashes embedder (no model load in 8 processes)."""
    out = np.zeros((len(texts), DIM), dtype=np.float32)
    for i, t in enumerate(texts):
        for w in t.split():
            out[i, hash(w) % DIM] += 1.0
        out[i, 0] += 0.01
    return out


DEVICE = os.environ.get("TR_SOAK_DEVICE", "cpu")  # --device sets it; spawned workers inherit the environment
LANCE_CACHE_MIB = os.environ.get("TR_SOAK_LANCE_CACHE_MIB")  # --lance-cache-mib (diagnostic), inherited likewise
SETTLE_S = float(os.environ.get("TR_SOAK_SETTLE_S", "15"))  # --settle-s, inherited likewise
TRACE_FRAMES = int(os.environ.get("TR_SOAK_TRACEMALLOC", "0"))  # --tracemalloc N, inherited likewise
NATIVE_HEAP_DIR = os.environ.get("TR_SOAK_NATIVE_HEAP")  # --native-heap DIR, inherited likewise
MIX = os.environ.get("TR_SOAK_MIX", "balanced")  # --mix, inherited likewise
STAGES = os.environ.get("TR_SOAK_STAGES", "on") == "on"  # --stages, inherited likewise
# (add, delete) shares of the operations: "balanced" keeps the live rows about constant, so a worker's memory
# after the run can be compared with its own before; "growing" adds twice what it deletes (the store grows).
MIX_WRITES = {"balanced": (0.06, 0.06), "growing": (0.08, 0.04)}
PREFILL = int(os.environ.get("TR_SOAK_PREFILL", "2500"))  # --prefill, inherited likewise
BOUNDED_ALLOCATORS = {"MALLOC_ARENA_MAX": "2", "ARROW_DEFAULT_MEMORY_POOL": "system"}  # --bounded-allocators


def _cap_lance_caches() -> None:
    """Diagnostic (--lance-cache-mib): every lancedb.connect in this process gets a Session whose metadata and
    index caches hold at most that many MiB (LanceDB's defaults: 1 GiB and 6 GiB per connection; the cold tier caps
    the metadata cache at 4 MiB; one session serves every connection of the process, so a reconnect keeps it).
    Shows whether RSS growth is LanceDB's caches."""
    if not LANCE_CACHE_MIB:
        return
    import lancedb

    if getattr(lancedb.connect, "_soak_capped", False):
        return
    cap = int(float(LANCE_CACHE_MIB) * (1 << 20))
    session = lancedb.Session(index_cache_size_bytes=cap, metadata_cache_size_bytes=cap)
    real = lancedb.connect

    def connect(*args, **kwargs):
        kwargs["session"] = session  # over the cold tier's own session (4 MiB metadata cache), which it passes itself
        return real(*args, **kwargs)

    connect._soak_capped = True
    lancedb.connect = connect


def _open(store: Path):
    from tiered_recall import TieredMemory

    _cap_lance_caches()
    return TieredMemory(store, embedder=embed, device=DEVICE, hot_capacity=20_000, timeout_s=5.0, orphan_grace_s=2.0)


def _trimmed_figures(me: int) -> dict:
    """This process after malloc_trim: RSS, its anonymous and file-backed parts, and glibc's account of its heap."""
    return {"rss_kb_trimmed": trimmed_rss_kb(), "rss_parts_trimmed": rss_parts_kb(me), "malloc": malloc_kb()}


def _snap(pid: int, tmp: str) -> dict:
    return {"rss_kb": rss_kb(pid), "fds": fds(pid), "threads": threads(pid), "fd_kinds": fd_kinds(pid, tmp)}


# ---- the worker ----------------------------------------------------------------------------------

class _Mix:
    """The operation mix, one draw per operation: 85 % search (half scoped to the worker's namespace), then
    (MIX_WRITES) 6 % add and 6 % delete of one of its own rows, or 8 % and 4 % ("growing"), and 3 % re-ingest of
    the shared chat file (adds nothing new)."""

    words = "apple river mountain coffee train doctor garden holiday budget slides vet allergy".split()

    def __init__(self, memory, worker: int, chat: str, seed: int) -> None:
        from tiered_recall import ingest

        self.memory, self.worker, self.chat, self.ingest = memory, worker, chat, ingest
        self.rng = np.random.default_rng(seed)
        self.mine: list[int] = []
        self.counts = {k: 0 for k in KINDS} | {"errors": 0}
        self.seconds = {k: 0.0 for k in KINDS}
        self.max_s = {k: 0.0 for k in KINDS}
        self.i = 0
        self.kind = ""
        self.lock_wait_s = {k: 0.0 for k in KINDS}
        self.lock_held_s = {k: 0.0 for k in KINDS}
        self.lock_n = {k: 0 for k in KINDS}
        self._watch_write_lock()

    def _watch_write_lock(self) -> None:
        """Times the store's cross-process write lock (private: TieredMemory._write_lock.held): how long a write
        waits for other processes' writes, and how long it holds the lock (what every writer queues behind)."""
        import contextlib

        inner = self.memory._write_lock.held

        @contextlib.contextmanager
        def timed(**kwargs):
            t0 = time.perf_counter()
            with inner(**kwargs) as got:
                t1 = time.perf_counter()
                try:
                    yield got
                finally:
                    if got:  # a promotion that found the lock taken skipped it: nothing held
                        self.lock_wait_s[self.kind] += t1 - t0
                        self.lock_held_s[self.kind] += time.perf_counter() - t1
                        self.lock_n[self.kind] += 1

        self.memory._write_lock.held = timed

    def reattach(self, memory) -> None:
        """Carries on with a reopened store (same worker, rows and counters)."""
        self.memory = memory
        self._watch_write_lock()

    def _timed(self, kind: str, fn):
        self.kind = kind
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        self.counts[kind] += 1
        self.seconds[kind] += dt
        self.max_s[kind] = max(self.max_s[kind], dt)
        return out

    def step(self) -> None:
        from tiered_recall.errors import TieredRecallError

        rng, m, w = self.rng, self.memory, self.worker
        r = rng.random()
        self.i += 1
        try:
            add, delete = MIX_WRITES[MIX]
            if r < 0.85 or not self.mine:
                q = " ".join(rng.choice(self.words, 3))
                self._timed("search", lambda: m.search(q, k=5, namespace=f"w{w}" if r < 0.5 else None,
                                                       stages=None if STAGES else False))
            if 0.85 <= r < 0.85 + add or not self.mine:
                text = " ".join(rng.choice(self.words, 6)) + f" {w}-{self.i}"
                self.mine += self._timed("add", lambda: m.add([text], namespace=f"w{w}"))
            elif 0.85 + add <= r < 0.85 + add + delete:
                victim = self.mine.pop(int(rng.integers(len(self.mine))))
                self._timed("delete", lambda: m.delete([victim]))
            elif r >= 0.97:
                self._timed("ingest", lambda: self.ingest([self.chat], memory=m, namespace="chat", progress=False))
        except TieredRecallError:
            self.counts["errors"] += 1

    def prefill(self, rows: int, batch: int = 250) -> None:
        """Adds this worker's share of the store's starting rows, in batches, before the warm-up."""
        for lo in range(0, rows, batch):
            texts = [" ".join(self.rng.choice(self.words, 6)) + f" {self.worker}-fill-{i}"
                     for i in range(lo, min(rows, lo + batch))]
            self.mine += self._timed("add", lambda: self.memory.add(texts, namespace=f"w{self.worker}"))

    def reset_counters(self) -> None:
        self.counts = {k: 0 for k in KINDS} | {"errors": 0}
        self.seconds = {k: 0.0 for k in KINDS}
        self.max_s = {k: 0.0 for k in KINDS}
        self.lock_wait_s = {k: 0.0 for k in KINDS}
        self.lock_held_s = {k: 0.0 for k in KINDS}
        self.lock_n = {k: 0 for k in KINDS}


def _worker(store: str, tmp: str, worker: int, ops: int, warmup: int, reopen_warmup: int, chat: str, warm_barrier,
            done_barrier, close_barrier, queue, profile_dir: str | None, done_ops) -> None:
    t_spawned = time.monotonic()
    me = os.getpid()
    # memray slows the process it records several times: one worker is enough to attribute, and the rest keep pace
    native_tracker = _start_native_heap_trace(worker) if NATIVE_HEAP_DIR and worker == 0 else None
    memory = _open(Path(store))
    t_opened = time.monotonic()
    mix = _Mix(memory, worker, chat, seed=worker)
    mix.prefill(PREFILL)
    for _ in range(warmup):
        mix.step()
    # The same cycle as at the end (close, then reopen and warm up), so "closed" and "reopened" there have a
    # "before" taken the same way: what the process holds with its store closed, and with it freshly reopened.
    del memory  # mix.memory is now the one reference, which _close_and_reopen drops before measuring
    closed_before = _close_and_reopen(mix, store, me, reopen_warmup)
    memory = mix.memory
    warm_counts = dict(mix.counts)
    mix.reset_counters()
    warm_barrier.wait()  # the parent takes "before" now, with every worker warm
    before_epoch_s = time.time()
    before = _snap(me, tmp)
    # the same figures as after the run, taken the same way: anonymous memory and glibc's heap after malloc_trim
    before.update(_trimmed_figures(me))
    before["closed"] = closed_before
    if TRACE_FRAMES:
        import tracemalloc

        tracemalloc.start(TRACE_FRAMES)
    traced_from = None  # a fifth into the run: what the rest of the run adds on top, by stack
    trajectory = []
    every = max(1, ops // 10)
    prof = None
    if profile_dir:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    t0 = time.monotonic()
    for i in range(ops):
        mix.step()
        if (i & 255) == 255:
            done_ops[worker] = i + 1  # progress for the parent's log (no lock: one writer per cell)
        if (i + 1) % every == 0:
            trajectory.append((i + 1, round(time.monotonic() - t0, 1), rss_kb(me), fds(me)))
        if TRACE_FRAMES and i + 1 == max(1, ops // 5):
            traced_from = tracemalloc.take_snapshot()
    finished_at = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the machine
    finished_epoch_s = time.time()
    elapsed = finished_at - t0
    if prof is not None:
        prof.disable()
        prof.dump_stats(os.path.join(profile_dir, f"worker{worker}.prof"))
    after = _snap(me, tmp)
    if TRACE_FRAMES:
        after["traced_growth"] = _traced_growth(traced_from, tracemalloc.take_snapshot())
        tracemalloc.stop()
    after.update(_trimmed_figures(me))
    worker_stats = memory.stats()
    after["cached_memories"] = worker_stats["cached_memories"]
    # over the worker's whole life, warm-ups included: repairs and resyncs among the moves, and what answered searches
    after["rows_moved"] = dict(worker_stats["rows_moved"])
    after["searches_by_rule"] = {rule: v["searches"] for rule, v in worker_stats["rules"].items()}
    after["searches_by_path"] = {path: v["searches"] for path, v in worker_stats["latency"].items()}
    after["settled"] = _settled(me)
    after["rss_parts_trimmed_without_cache"] = _without_memory_cache(memory, me)
    after["without_lance_caches"] = _without_lance_caches(memory, me)
    after["indexes"] = _index_sizes(memory)
    # Last, as it changes the store's state: close it (what outlives the store in the process), then reopen it
    # and do the warm-up again, the very cycle "before" was taken after (what a long run leaves behind).
    del memory
    after["closed"] = _close_and_reopen(mix, store, me, reopen_warmup)
    memory = mix.memory
    after["reopened"] = {**_trimmed_figures(me), "fds": fds(me), "threads": threads(me)}
    if native_tracker is not None:  # reading the recording takes far more memory than any figure above
        native_tracker.__exit__(None, None, None)
        heap = _native_heap_file(worker)
        after["native_growth"] = _native_growth(heap, before_epoch_s, finished_epoch_s)
        after["native_growth_closed"] = _native_growth(heap, closed_before["at_epoch_s"],
                                                       after["closed"]["at_epoch_s"])
    queue.put({"worker": worker, "pid": me, "open_s": round(t_opened - t_spawned, 2), "warmup_counts": warm_counts,
               **mix.counts, "seconds": {k: round(v, 3) for k, v in mix.seconds.items()},
               "max_ms": {k: round(v * 1e3, 1) for k, v in mix.max_s.items()}, "elapsed_s": round(elapsed, 2),
               "finished_at": finished_at,
               "write_lock": {k: [mix.lock_n[k], mix.lock_wait_s[k], mix.lock_held_s[k]] for k in KINDS},
               "before": before, "after": after, "trajectory": trajectory, "rows_mine": len(mix.mine)})
    done_barrier.wait()  # the parent takes "after" now, with every worker still attached
    close_barrier.wait()
    memory.close()


def _close_and_reopen(mix: _Mix, store: str, me: int, warmup: int) -> dict:
    """Closes the worker's store (mix.memory, which must be its last reference: a caller's variable would keep the
    closed store's objects alive through the measurement) and measures the process without it (after gc, --settle-s
    idle seconds and malloc_trim), then reopens it into mix.memory and does `warmup` operations of the mix (not
    counted). Returns the figures taken with the store closed."""
    import gc
    import weakref

    closed_store = weakref.ref(mix.memory)
    mix.memory.close()
    mix.memory = None
    gc.collect()
    still_referenced = closed_store() is not None  # then its objects count as the process's: reported, not hidden
    time.sleep(SETTLE_S)  # LanceDB's threads for bursts of work exit after ~10 idle s (see _settled)
    closed = {**_trimmed_figures(me), "fds": fds(me), "threads": threads(me),
              "closed_store_still_referenced": still_referenced, "at_epoch_s": time.time()}
    mix.reattach(_open(Path(store)))
    tallies = ("counts", "seconds", "max_s", "lock_wait_s", "lock_held_s", "lock_n")
    saved = {name: dict(getattr(mix, name)) for name in tallies}
    for _ in range(warmup):
        mix.step()
    closed["reopen_warmup_errors"] = mix.counts["errors"] - saved["counts"]["errors"]
    for name in tallies:  # the warm-up is not part of the measured operations
        setattr(mix, name, saved[name])
    return closed


def _traced_growth(before, after, top: int = 12) -> dict:
    """Diagnostic (--tracemalloc N): what Python allocated in the last four fifths of the measured operations and
    still holds, less what it freed of what it had traced by then (numpy buffers included; LanceDB's native heap is
    not traced), grouped by the allocating call stack, largest first. Tracing starts at "before" and the first fifth
    is left out, so structures replaced once in a while (allocated before tracing) do not count as growth."""
    diff = after.compare_to(before, "traceback")
    return {"total_kb": round(sum(d.size_diff for d in diff) / 1024, 1),
            "top": [{"kb": round(d.size_diff / 1024, 1), "blocks": d.count_diff,
                     "stack": [f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}" for f in d.traceback]}
                    for d in diff[:top]]}


def _native_heap_file(worker: int) -> Path:
    return Path(NATIVE_HEAP_DIR) / f"worker{worker}.bin"


def _start_native_heap_trace(worker: int):
    """Diagnostic (--native-heap DIR): from the worker's start to its last close and reopen memray records
    every allocation and free of this process (malloc from any library, LanceDB's and Arrow's included, and mmap), with
    its native and Python stack, into DIR/workerN.bin, and the process's memory every 250 ms."""
    import memray

    path = _native_heap_file(worker)
    path.unlink(missing_ok=True)
    tracker = memray.Tracker(path, native_traces=True, follow_fork=False, memory_interval_ms=250)
    tracker.__enter__()
    return tracker


def _native_growth(path: Path, since_epoch_s: float, until_epoch_s: float, top: int = 15, frames: int = 8,
                   points: int = 11) -> dict:
    """What the heap held at until_epoch_s (--native-heap) less what it held at since_epoch_s (the end of the
    measured operations less "before"; or with the store closed, after the run less before it), by allocating
    stack, largest growth first: the native heap's growth told by who asked for it
    (tracemalloc sees only Python's), net of what was freed. Frames of the allocator itself and of the
    interpreter's call machinery are left out of each stack; a library without symbols (LanceDB's Rust core) shows
    as <unknown>. Also the heap held over time, at `points` moments from the worker's start to until_epoch_s,
    split into stacks without a single symbol and the rest: a cache that fills once and then stays level shows as
    a step, a leak as a slope."""
    import memray
    import numpy as np

    skip = ("malloc", "calloc", "realloc", "operator new", "_Py", "Py", "method_vectorcall", "cfunction_", "slot_",
            "vectorcall", "trace_call_function", "do_call_core", "dispatcher_vectorcall")
    groups: dict[tuple, list] = {}
    with memray.FileReader(str(path)) as reader:
        times = np.array([snap.time for snap in reader.get_memory_snapshots()], dtype=np.float64) / 1e3
        # the last snapshot taken by each moment: the next one may already hold what the process did right after
        since = max(0, int(np.searchsorted(times, since_epoch_s, side="right")) - 1)
        until = max(0, int(np.searchsorted(times, until_epoch_s, side="right")) - 1)
        change = np.zeros((2, len(times) + 2))  # bytes allocated (+) and freed (-) before each snapshot
        for rec in reader.get_temporal_allocation_records(merge_threads=True):
            stack = rec.hybrid_stack_trace(max_stacks=40)
            anonymous = int(all(fn == "<unknown>" for fn, _, _ in stack[:6]))
            held = [0, 0]  # bytes at `since`, at `until`
            for iv in rec.intervals:
                born, gone = iv.allocated_before_snapshot, iv.deallocated_before_snapshot
                change[anonymous, born] += iv.n_bytes
                if gone is not None:
                    change[anonymous, gone] -= iv.n_bytes
                for i, at_snapshot in enumerate((since, until)):
                    if born <= at_snapshot and (gone is None or gone > at_snapshot):
                        held[i] += iv.n_bytes
            if held == [0, 0]:
                continue
            named = [f"{fn} ({os.path.basename(str(file))}:{line})" for fn, file, line in stack
                     if not str(fn).startswith(skip)][:frames]
            key = (rec.thread_name or "python", *named)
            g = groups.setdefault(key, [0, 0])
            g[0] += held[0]
            g[1] += held[1]
    held_over_time = np.cumsum(change, axis=1)
    at = np.linspace(0, min(until, len(times) - 1), points).astype(int)
    ranked = sorted(groups.items(), key=lambda kv: kv[1][0] - kv[1][1])
    return {"held_kb_at_since": round(sum(g[0] for g in groups.values()) / 1024, 1),
            "held_kb_at_until": round(sum(g[1] for g in groups.values()) / 1024, 1),
            "over_time": {"s_from_since": [round(float(times[i] - since_epoch_s), 1) for i in at],
                          "no_symbols_mb": [round(float(held_over_time[1, i]) / 2**20, 2) for i in at],
                          "rest_mb": [round(float(held_over_time[0, i]) / 2**20, 2) for i in at]},
            "top": [{"kb": round((g[1] - g[0]) / 1024, 1), "kb_before": round(g[0] / 1024, 1), "thread": key[0],
                     "stack": list(key[1:])} for key, g in ranked[:top]]}


def _settled(me: int) -> dict | None:
    """After SETTLE_S idle seconds (no operations; the store stays open): the threads LanceDB's runtime started for
    a burst of work exit once idle (about 10 s), and with them their stacks and glibc's per-thread caches of freed
    blocks. What a long-lived process holds between bursts, beside what it holds right after one."""
    if not SETTLE_S:
        return None
    time.sleep(SETTLE_S)
    return {"threads": threads(me), **_trimmed_figures(me)}


def _without_memory_cache(memory, me: int) -> dict | None:
    """Diagnostic, at the very end: RSS parts after dropping the texts and metadata TieredMemory caches for rows
    searches returned (bounded by the live rows and METADATA_CACHE_ROWS), so what that cache holds is told from
    growth. The process does no more operations afterwards."""
    import gc

    memory._cache.clear()
    gc.collect()
    trimmed_rss_kb()
    return rss_parts_kb(me)


def _without_lance_caches(memory, me: int) -> dict:
    """Diagnostic, after _without_memory_cache: RSS parts and glibc's heap after the cold tier opens a new LanceDB
    connection (as it does every _LANCE_RECONNECT_VERSIONS versions), whose session caches start empty, and the
    old one is dropped. What this gives back is LanceDB's caches (bounded), not growth of ours."""
    import gc

    cold = memory.cold
    cold._tables.connected_at_version = -(1 << 62)  # private: make the next check reconnect now
    cold._upkeep.maybe_reconnect(cold._tables.table.version)
    gc.collect()
    trimmed_rss_kb()
    return {"rss_parts_trimmed": rss_parts_kb(me), "malloc": malloc_kb()}


def _index_sizes(memory) -> dict:
    """The cold tier's in-memory indexes at the end (after every other figure: stats() flushes the log): the BM25
    index's live rows, slots (live plus deleted, until compaction) and vocabulary, and the vector mirror's live
    rows and positions. What they hold beyond the live rows is memory a fresh process does not have."""
    stats = memory.cold.stats()
    return {"keyword_index": stats.get("keyword_index"), "mirror_rows": stats.get("mirror_rows"),
            "mirror_positions": stats.get("mirror_positions")}


def _reference(store: str, tmp: str, worker: int, warmup: int, chat: str, queue) -> None:
    """A process that opens the store as the soak left it and does the same warm-up as a worker: its RSS is what
    a worker needs for the store's data at the end, without the history of the run. Then one flush and one
    maintenance pass (compaction, index builds), which every worker of a long run has been through and a short
    warm-up may not have: the second figure is the steady state to compare a worker with."""
    me = os.getpid()
    memory = _open(Path(store))
    mix = _Mix(memory, worker, chat, seed=worker)
    for _ in range(warmup):
        mix.step()
    snap = _snap(me, tmp)
    snap.update(_trimmed_figures(me))
    memory.cold.optimize()  # flushes the log first
    for _ in range(warmup):
        mix.step()
    steady = {"rss_kb": rss_kb(me), **_trimmed_figures(me), "cached_memories": memory.stats()["cached_memories"],
              "threads": threads(me)}
    steady["settled"] = _settled(me)
    steady["rss_parts_trimmed_without_cache"] = _without_memory_cache(memory, me)
    steady["without_lance_caches"] = _without_lance_caches(memory, me)
    steady["indexes"] = _index_sizes(memory)
    queue.put({"reference": snap, "after_maintenance": steady, "errors": mix.counts["errors"]})
    memory.close()


# ---- the parent ----------------------------------------------------------------------------------

def _summed(dicts: list[dict]) -> dict:
    """Key-wise sums of counters (zero counts kept)."""
    from collections import Counter

    total: Counter = Counter()
    for d in dicts:
        total.update(d)
    return dict(sorted(total.items()))


def _diff_kinds(a: dict, b: dict) -> dict:
    keys = set(a) | set(b)
    return {k: b.get(k, 0) - a.get(k, 0) for k in sorted(keys) if b.get(k, 0) != a.get(k, 0)}


def run(processes: int, ops: int, warmup: int, profile_dir: str | None = None, progress: bool = True,
        reopen_warmup: int | None = None) -> dict:
    reopen_warmup = warmup if reopen_warmup is None else reopen_warmup
    from tiered_recall.hot import segment_path

    with tempfile.TemporaryDirectory(prefix="tr-soak-") as tmp:
        store = Path(tmp) / "store"
        chat = Path(tmp) / "chat.jsonl"
        chat.write_text("".join(json.dumps({"session": "s1", "role": "user", "content": f"soak turn {i} about coffee"})
                                + "\n" for i in range(20)))
        me = os.getpid()
        shm_start = shm_segments()
        gpu_start = gpu_figures([])
        parent_at_start = _snap(me, tmp)
        memory = _open(store)
        memory.add(["seed memory about apples"], namespace="w0")
        from tiered_recall.ingest import ingest

        ingest([str(chat)], memory=memory, namespace="chat", progress=False)
        sidecar = memory._link.hot.owner_pid if memory._link.hot is not None else 0
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        warm_b, done_b, close_b = (ctx.Barrier(processes + 1) for _ in range(3))
        done_ops = ctx.Array("q", processes, lock=False)
        per = max(1, ops // processes)
        t_start = time.monotonic()
        procs = [ctx.Process(target=_worker, args=(str(store), tmp, w, per, warmup, reopen_warmup, str(chat), warm_b,
                                                    done_b, close_b, queue, profile_dir, done_ops)) for w in range(processes)]
        for p in procs:
            p.start()
        warm_b.wait(timeout=3600)
        t_warm = time.monotonic()
        for _ in range(50):  # the parent's own warm-up: the same searches it repeats at "after"
            memory.search("coffee", k=5)
        before = {"parent": _snap(me, tmp), "sidecar": _snap(sidecar, tmp), "shm_segments": shm_segments(),
                  "gpu": gpu_figures([sidecar])}
        results = []
        deadline = time.monotonic() + 24 * 3600
        last = (time.monotonic(), 0)
        while len(results) < processes and time.monotonic() < deadline:
            try:
                results.append(queue.get(timeout=60))
            except Exception:
                if not all(p.is_alive() for p in procs) and queue.empty():
                    break
                if progress:
                    now, n = time.monotonic(), sum(done_ops[:])
                    print(f"[soak] {n} of {per * processes} ops after {now - t_warm:.0f} s "
                          f"({(n - last[1]) / (now - last[0]):.0f} ops/s lately; {len(results)}/{processes} workers done), "
                          f"worker RSS MB {[round((rss_kb(p.pid) or 0) / 1024) for p in procs]}", file=sys.stderr, flush=True)
                    last = (now, n)
        # the last worker's last operation, not its report (which comes after --settle-s idle seconds)
        elapsed = max([r["finished_at"] for r in results], default=time.monotonic()) - t_warm
        done_b.wait(timeout=600)
        for _ in range(50):
            memory.search("coffee", k=5)
        after = {"parent": _snap(me, tmp), "sidecar": _snap(sidecar, tmp), "shm_segments": shm_segments(),
                 "gpu": gpu_figures([sidecar])}
        rows = memory.count()
        parent_stats = memory.stats()
        close_b.wait(timeout=600)
        for p in procs:
            p.join(120)
            p.close()  # drops the process's sentinel fd now, not at garbage collection
        queue.close()
        queue.join_thread()
        parent_workers_gone = _snap(me, tmp)
        sidecar_workers_gone = _snap(sidecar, tmp)
        ref_queue = ctx.Queue()
        ref = ctx.Process(target=_reference, args=(str(store), tmp, processes, reopen_warmup, str(chat), ref_queue))
        ref.start()
        try:
            fresh = ref_queue.get(timeout=600)
        except Exception:
            fresh = {"reference": None, "errors": None}
        ref.join(120)
        ref.close()
        ref_queue.close()
        ref_queue.join_thread()
        memory.close()
        deadline = time.monotonic() + 30
        own = segment_path(memory.sidecar_name).name  # other users' stores may come and go meanwhile
        while (own in shm_segments() or rss_kb(sidecar) is not None) and time.monotonic() < deadline:
            time.sleep(0.2)
        closed = {"parent": {k: v for k, v in _snap(me, tmp).items() if k != "fd_kinds"},
                  "sidecar_exited": rss_kb(sidecar) is None, "own_segment": own,
                  "own_segment_gone": own not in shm_segments(), "shm_segments": shm_segments(),
                  "shm_same_as_start": shm_segments() == shm_start, "gpu": gpu_figures([]), "gpu_at_start": gpu_start}
    totals = {k: sum(r[k] for r in results) for k in (*KINDS, "errors")}
    seconds = {k: round(sum(r["seconds"][k] for r in results), 2) for k in KINDS}
    n_ops = sum(totals[k] for k in KINDS)
    lock_by_kind = {k: [sum(r["write_lock"][k][j] for r in results) for j in range(3)] for k in KINDS}
    lock_n = sum(v[0] for v in lock_by_kind.values())
    lock_wait = sum(v[1] for v in lock_by_kind.values())
    lock_held = sum(v[2] for v in lock_by_kind.values())
    slim = lambda s: {k: v for k, v in s.items() if k != "fd_kinds"}  # noqa: E731
    return {
        "processes": processes, "device": DEVICE, "lance_cache_mib": LANCE_CACHE_MIB, "ops": n_ops, **totals,
        "warmup_ops_per_worker": warmup, "reopen_warmup_ops": reopen_warmup,
        "seconds": round(elapsed, 1), "ops_per_s": round(n_ops / elapsed, 1) if elapsed else None,
        "worker_start_s": round(t_warm - t_start, 1), "worker_open_s": [r["open_s"] for r in results],
        "op_seconds_total": seconds,
        "op_mean_ms": {k: round(1e3 * seconds[k] / totals[k], 2) if totals[k] else None for k in KINDS},
        "op_max_ms": {k: max(r["max_ms"][k] for r in results) for k in KINDS},
        "write_lock": {"writes": lock_n, "wait_s_total": round(lock_wait, 1), "held_s_total": round(lock_held, 1),
                       "held_mean_ms": round(1e3 * lock_held / lock_n, 1) if lock_n else None,
                       "held_share_of_wall": round(lock_held / elapsed, 2) if elapsed else None,
                       "held_mean_ms_by_kind": {k: round(1e3 * v[2] / v[0], 1) for k, v in lock_by_kind.items() if v[0]},
                       "writes_by_kind": {k: v[0] for k, v in lock_by_kind.items() if v[0]}},
        "rows_at_end": rows, "workers_reported": len(results),
        "parent": {"at_start": slim(parent_at_start), "before": slim(before["parent"]), "after": slim(after["parent"]),
                   "after_workers_closed": slim(parent_workers_gone),
                   "fd_kinds_start_to_before": _diff_kinds(parent_at_start["fd_kinds"], before["parent"]["fd_kinds"]),
                   "fd_kinds_change": _diff_kinds(before["parent"]["fd_kinds"], after["parent"]["fd_kinds"]),
                   "fd_kinds_start_to_workers_closed": _diff_kinds(parent_at_start["fd_kinds"],
                                                                   parent_workers_gone["fd_kinds"])},
        "sidecar": {"pid": sidecar, "before": slim(before["sidecar"]), "after": slim(after["sidecar"]),
                    "after_workers_closed": slim(sidecar_workers_gone),
                    "fd_kinds_change": _diff_kinds(before["sidecar"]["fd_kinds"], after["sidecar"]["fd_kinds"])},
        "shm": {"at_start": shm_start, "before": before["shm_segments"], "after": after["shm_segments"]},
        "gpu": {"before": before["gpu"], "after": after["gpu"]},
        "workers": [{"worker": r["worker"], "rss_kb": [r["before"]["rss_kb"], r["after"]["rss_kb"]],
                     "rss_kb_after_malloc_trim": r["after"].get("rss_kb_trimmed"),
                     "before_after_malloc_trim": {"rss_kb": r["before"].get("rss_kb_trimmed"),
                                                  "rss_parts_kb": r["before"].get("rss_parts_trimmed"),
                                                  "malloc_kb": r["before"].get("malloc")},
                     "rss_parts_kb_after_malloc_trim": r["after"].get("rss_parts_trimmed"),
                     "store_closed": [r["before"].get("closed"), r["after"].get("closed")],
                     "store_reopened": r["after"].get("reopened"),
                     "cached_memories": r["after"].get("cached_memories"),
                     "malloc_kb_after_malloc_trim": r["after"].get("malloc"),
                     "after_settling": r["after"].get("settled"),
                     "rss_parts_kb_without_memory_cache": r["after"].get("rss_parts_trimmed_without_cache"),
                     "without_lance_caches": r["after"].get("without_lance_caches"),
                     "indexes": r["after"].get("indexes"),
                     "traced_growth": r["after"].get("traced_growth"),
                     "native_growth": r["after"].get("native_growth"),
                     "native_growth_closed": r["after"].get("native_growth_closed"),
                     "fds": [r["before"]["fds"], r["after"]["fds"]], "threads": [r["before"]["threads"], r["after"]["threads"]],
                     "fd_kinds_change": _diff_kinds(r["before"]["fd_kinds"], r["after"]["fd_kinds"]),
                     "trajectory_ops_s_rss_kb_fds": r["trajectory"]} for r in sorted(results, key=lambda r: r["worker"])],
        # a fresh process on the final store, after the same warm-up: the RSS the store's data asks for by then
        "fresh_process_on_final_store": {"rss_kb": (fresh["reference"] or {}).get("rss_kb"),
                                         "rss_kb_after_malloc_trim": (fresh["reference"] or {}).get("rss_kb_trimmed"),
                                         "rss_parts_kb_after_malloc_trim": (fresh["reference"] or {}).get("rss_parts_trimmed"),
                                         "after_one_flush_and_maintenance": fresh.get("after_maintenance"),
                                         "fds": (fresh["reference"] or {}).get("fds"),
                                         "threads": (fresh["reference"] or {}).get("threads"),
                                         "errors": fresh["errors"]},
        "parent_rows_moved": parent_stats.get("rows_moved"),
        "workers_rows_moved": _summed([r["after"]["rows_moved"] for r in results]),
        "workers_searches_by_rule": _summed([r["after"]["searches_by_rule"] for r in results]),
        "workers_searches_by_path": _summed([r["after"]["searches_by_path"] for r in results]),
        "after_everything_closed": closed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--ops", type=int, default=1_000_000, help="total measured operations over all processes")
    ap.add_argument("--warmup", type=int, default=300, help="operations per worker before 'before' is taken")
    ap.add_argument("--reopen-warmup", type=int, default=None, metavar="OPS",
                    help="operations per worker after each close and reopen, and of the fresh process on the final "
                         "store (default: --warmup). A plateau run takes a long --warmup and a short --reopen-warmup: "
                         "both reopens use the same count, so 'closed' and 'reopened' before and after stay comparable")
    ap.add_argument("--profile", metavar="DIR", help="write a cProfile of each worker's measured phase here")
    ap.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu",
                    help="the sidecar's backend (cuda on a GPU machine measures GPU memory before and after)")
    ap.add_argument("--lance-cache-mib", type=float, default=None,
                    help="diagnostic: cap LanceDB's metadata and index caches per process at this many MiB")
    ap.add_argument("--settle-s", type=float, default=15.0,
                    help="after the run, each worker and the fresh process also report after this many idle seconds "
                         "(store open, no operations): LanceDB's idle worker threads have exited by then (0: skip)")
    ap.add_argument("--stages", choices=["on", "off"], default="on",
                    help="on: text searches run the store preset's stages (the default since the recall work); off: "
                         "the plain tiered search, as the soaks before it measured")
    ap.add_argument("--mix", choices=sorted(MIX_WRITES), default="balanced",
                    help="balanced: 6 %% adds and 6 %% deletes, so the live rows stay about where --prefill put them "
                         "and each worker's memory after the run is compared with its own before; growing: 8 %% "
                         "adds and 4 %% deletes (the store grows; compare with the fresh process instead)")
    ap.add_argument("--prefill", type=int, default=2500,
                    help="rows each worker adds (in batches of 250) before its warm-up")
    ap.add_argument("--tracemalloc", type=int, default=0, metavar="FRAMES",
                    help="diagnostic: trace Python allocations in each worker's measured phase (this many frames per "
                         "stack) and print what it still holds at the end, by stack (slows the run)")
    ap.add_argument("--native-heap", metavar="DIR",
                    help="diagnostic: record every allocation and free of worker 0 (native and Python, with stacks, by "
                         "memray) into DIR and print by stack what its heap held at the end less what it held at "
                         "before (and with the store closed, after the run less before it), and its heap over time "
                         "(needs the diagnostics extra: pip install '.[diagnostics]'; slows that worker several times)")
    ap.add_argument("--bounded-allocators", action="store_true",
                    help="run the workers and the sidecar with the README's settings for long-lived processes: "
                         "MALLOC_ARENA_MAX=2 and ARROW_DEFAULT_MEMORY_POOL=system (unless already set), so glibc's "
                         "per-thread arenas and Arrow's mimalloc pool do not keep freed memory")
    args = ap.parse_args()
    if args.bounded_allocators:
        for name, value in BOUNDED_ALLOCATORS.items():
            os.environ.setdefault(name, value)  # spawned workers read them when they start

    global DEVICE, LANCE_CACHE_MIB, SETTLE_S, TRACE_FRAMES, MIX, PREFILL
    MIX, PREFILL = args.mix, args.prefill
    os.environ["TR_SOAK_MIX"], os.environ["TR_SOAK_PREFILL"] = args.mix, str(args.prefill)
    os.environ["TR_SOAK_STAGES"] = args.stages
    TRACE_FRAMES = args.tracemalloc
    os.environ["TR_SOAK_TRACEMALLOC"] = str(args.tracemalloc)
    DEVICE = os.environ["TR_SOAK_DEVICE"] = args.device
    SETTLE_S = args.settle_s
    os.environ["TR_SOAK_SETTLE_S"] = str(args.settle_s)
    if args.lance_cache_mib is not None:
        LANCE_CACHE_MIB = os.environ["TR_SOAK_LANCE_CACHE_MIB"] = str(args.lance_cache_mib)
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    if args.native_heap:
        os.makedirs(args.native_heap, exist_ok=True)
        os.environ["TR_SOAK_NATIVE_HEAP"] = args.native_heap
    r = run(args.processes, args.ops, args.warmup, args.profile, reopen_warmup=args.reopen_warmup)
    r["allocator_env"] = {name: os.environ.get(name) for name in BOUNDED_ALLOCATORS}
    r["mix"], r["prefill_rows_per_worker"] = MIX, PREFILL
    print(f"[soak] mix {MIX} (add, delete shares {MIX_WRITES[MIX]}), {PREFILL} rows prefilled per worker, "
          f"{r['rows_at_end']} rows at the end", file=sys.stderr)
    print(f"[soak] {r['ops']} ops in {r['seconds']} s = {r['ops_per_s']} ops/s; mean ms per op {r['op_mean_ms']}; "
          f"op seconds {r['op_seconds_total']}", file=sys.stderr)
    mb = lambda kb: round(kb / 1024, 1) if kb else None  # noqa: E731
    print(f"[soak] worker RSS MB before -> after: {[(mb(w['rss_kb'][0]), mb(w['rss_kb'][1])) for w in r['workers']]}; "
          f"after malloc_trim: {[mb(w['rss_kb_after_malloc_trim']) for w in r['workers']]}; "
          f"a fresh process on the final store after the same warm-up: "
          f"{mb(r['fresh_process_on_final_store']['rss_kb'])} MB "
          f"({mb(r['fresh_process_on_final_store']['rss_kb_after_malloc_trim'])} after malloc_trim)", file=sys.stderr)
    parts = lambda d: f"anon {mb((d or {}).get('anon'))} + file {mb((d or {}).get('file'))}"  # noqa: E731
    steady = r["fresh_process_on_final_store"].get("after_one_flush_and_maintenance") or {}
    print(f"[soak] after malloc_trim, MB: workers {[parts(w['rss_parts_kb_after_malloc_trim']) for w in r['workers']]}; "
          f"fresh process {parts(r['fresh_process_on_final_store']['rss_parts_kb_after_malloc_trim'])}, "
          f"and after one flush + maintenance pass and the warm-up again: {parts(steady.get('rss_parts_trimmed'))} "
          f"(RSS {mb(steady.get('rss_kb_trimmed'))})", file=sys.stderr)
    settled = [w.get("after_settling") or {} for w in r["workers"]]
    print(f"[soak] after {SETTLE_S:g} idle s, after malloc_trim, MB: workers "
          f"{[parts(w.get('rss_parts_trimmed')) for w in settled]} with {[w.get('threads') for w in settled]} threads; "
          f"fresh process after maintenance {parts((steady.get('settled') or {}).get('rss_parts_trimmed'))} with "
          f"{(steady.get('settled') or {}).get('threads')} threads (right after: {steady.get('threads')})", file=sys.stderr)
    heap = lambda d: f"in use {mb((d or {}).get('in_use'))}, free kept {mb((d or {}).get('free_held'))}"  # noqa: E731
    print(f"[soak] glibc's heap after malloc_trim (mallinfo2), MB: workers "
          f"{[heap(w.get('malloc_kb_after_malloc_trim')) for w in r['workers']]}; fresh process after maintenance "
          f"{heap(steady.get('malloc'))}", file=sys.stderr)
    print(f"[soak] TieredMemory's cache of returned rows (texts, metadata): workers hold "
          f"{[w['cached_memories'] for w in r['workers']]} rows, and without it, after malloc_trim: "
          f"{[parts(w['rss_parts_kb_without_memory_cache']) for w in r['workers']]}; the fresh process held "
          f"{steady.get('cached_memories')}, and without them: {parts(steady.get('rss_parts_trimmed_without_cache'))}",
          file=sys.stderr)
    anon = lambda d: ((d or {}).get("anon") or 0) / 1024  # noqa: E731
    in_use_pair = lambda w: (f"{mb((w['before_after_malloc_trim'].get('malloc_kb') or {}).get('in_use'))} -> "  # noqa: E731
                             f"{mb((w.get('malloc_kb_after_malloc_trim') or {}).get('in_use'))}")
    pairs = [(w["before_after_malloc_trim"]["rss_parts_kb"], w["rss_parts_kb_after_malloc_trim"],
              (w.get("after_settling") or {}).get("rss_parts_trimmed")) for w in r["workers"]]
    print(f"[soak] each worker against its own before, anonymous MB after malloc_trim: before -> after (after "
          f"{SETTLE_S:g} idle s): {[f'{anon(b):.1f} -> {anon(a):.1f} (' + (f'{anon(s):.1f}' if s else 'not measured') + ')' for b, a, s in pairs]}; "
          f"change {[round(anon(a) - anon(b), 1) for b, a, _ in pairs]} MB; glibc in use before -> after: "
          f"{[in_use_pair(w) for w in r['workers']]}", file=sys.stderr)
    closed = [[c or {} for c in w["store_closed"]] for w in r["workers"]]
    reopened = [(w["before_after_malloc_trim"]["rss_parts_kb"], (w.get("store_reopened") or {}).get("rss_parts_trimmed"))
                for w in r["workers"]]
    closed_anon = [(anon(b.get("rss_parts_trimmed")), anon(a.get("rss_parts_trimmed"))) for b, a in closed]
    print(f"[soak] each worker with its store closed (after gc and malloc_trim), anonymous MB, before -> after the run: "
          f"{[f'{b:.1f} -> {a:.1f}' for b, a in closed_anon]}; change {[round(a - b, 1) for b, a in closed_anon]} MB; "
          f"glibc {[heap(b.get('malloc')) + ' -> ' + heap(a.get('malloc')) for b, a in closed]}; "
          f"threads {[(b.get('threads'), a.get('threads')) for b, a in closed]}, fds {[(b.get('fds'), a.get('fds')) for b, a in closed]}; "
          f"a closed store still referenced: {sum(bool(c.get('closed_store_still_referenced')) for pair in closed for c in pair)} times",
          file=sys.stderr)
    print(f"[soak] each worker's store reopened and warmed up again (the cycle 'before' was taken after), anonymous MB "
          f"after malloc_trim, before -> after: {[f'{anon(b):.1f} -> {anon(a):.1f}' for b, a in reopened]}; "
          f"change {[round(anon(a) - anon(b), 1) for b, a in reopened]} MB; errors in those warm-ups "
          f"{[(b.get('reopen_warmup_errors'), a.get('reopen_warmup_errors')) for b, a in closed]}", file=sys.stderr)
    no_lance = [w.get("without_lance_caches") or {} for w in r["workers"]]
    fresh_no_lance = steady.get("without_lance_caches") or {}
    print(f"[soak] then with a new LanceDB connection (empty session caches), after malloc_trim, MB: workers "
          f"{[parts(w.get('rss_parts_trimmed')) + ' (' + heap(w.get('malloc')) + ')' for w in no_lance]}; fresh process "
          f"{parts(fresh_no_lance.get('rss_parts_trimmed'))} ({heap(fresh_no_lance.get('malloc'))})", file=sys.stderr)
    index = lambda d: ("keyword index {live_rows} live rows, {slots} slots, {terms} terms".format(**d["keyword_index"])  # noqa: E731
                       if (d or {}).get("keyword_index") else "keyword index not built") + (
        f"; mirror {(d or {}).get('mirror_rows')} live rows, {(d or {}).get('mirror_positions')} positions")
    print(f"[soak] in-memory indexes at the end: workers {[index(w.get('indexes')) for w in r['workers']]}; "
          f"fresh process {index(steady.get('indexes'))}", file=sys.stderr)
    for w in r["workers"]:
        growth = w.get("traced_growth")
        if growth:
            print(f"[soak] worker {w['worker']}: Python allocations still held after the run: {growth['total_kb']} KB; "
                  f"largest: " + "; ".join(f"{g['kb']} KB in {g['blocks']} blocks at {' < '.join(g['stack'])}"
                                          for g in growth["top"][:6]), file=sys.stderr)
        for key, since, until in (("native_growth", "before", "the end of the run"),
                                  ("native_growth_closed", "closed before the run", "closed after it")):
            native = w.get(key)
            if native:
                print(f"[soak] worker {w['worker']}: heap held (memray: malloc from every library, and mmap) "
                      f"{native['held_kb_at_since']} KB at {since} -> {native['held_kb_at_until']} KB at {until}; "
                      f"over time (s from {since}: MB in stacks without symbols, MB in the rest): "
                      f"{list(zip(*native['over_time'].values()))}; largest growth by stack:\n" + "\n".join(
                          f"    {g['kb']:+} KB (from {g['kb_before']}) [{g['thread']}] at {' < '.join(g['stack'])}"
                          for g in native["top"]), file=sys.stderr)
    print(json.dumps(r))


if __name__ == "__main__":
    main()
