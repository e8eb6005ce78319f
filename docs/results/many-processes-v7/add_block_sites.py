"""Probe (2026-12-04, seventh session; not part of the product): where an add blocks with many workers.

Runs benchmarks/many_processes.py with every worker's adds instrumented: for each blocking site inside an add (the
log's fdatasync, each flock, the hot side's publish, the pre-lock follow, the log write) the times the add was given
a core again there (schedstat's third field), its wall time and its wait for a core; then prints the means over all
adds, the median band (40-60 %) and the slowest 2 %. It patches the store's modules in the workers, so it follows
the code of the commit it was written against (see docs/results.md, seventh session).

    cd /tmp && python docs/results/many-processes-v7/add_block_sites.py --processes 8 --mix 95/5 --seconds 8
"""
import os, sys, time, threading, collections, functools, json
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "benchmarks"))
import many_processes as mpb
ST = threading.local()
def install():
    import fcntl as real
    from tiered_recall.coordinator.memory import TieredMemory
    from tiered_recall.storage import _wal, _generations, _writer
    from tiered_recall.coordinator import link
    from tiered_recall.hot import client
    fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
    def ss():
        f = os.pread(fd, 128, 0).split(); return int(f[2]), int(f[1]) / 1e9
    ST.adds = []
    def site(name, fn):
        @functools.wraps(fn)
        def inner(*a, **k):
            cur = getattr(ST, "cur", None)
            if cur is None or getattr(ST, "in_site", False):
                return fn(*a, **k)
            ST.in_site = True
            p0, q0 = ss(); t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                p1, q1 = ss(); ST.in_site = False
                c = cur.setdefault(name, [0, 0.0, 0.0]); c[0] += p1 - p0; c[1] += time.perf_counter() - t0; c[2] += q1 - q0
        return inner
    class F:
        LOCK_EX, LOCK_NB, LOCK_UN, LOCK_SH = real.LOCK_EX, real.LOCK_NB, real.LOCK_UN, real.LOCK_SH
    def named_flock(fd_, op):
        try: n = os.path.basename(os.readlink(f"/proc/self/fd/{fd_}"))
        except OSError: n = "?"
        return site("flock " + n + (" un" if op == real.LOCK_UN else ""), real.flock)(fd_, op)
    F.flock = staticmethod(named_flock)
    _wal.fcntl = F; _generations.fcntl = F
    real_sync = os.fdatasync
    _wal.os.fdatasync = site("fdatasync", real_sync)
    for name in ("_follow_before_lock",):
        setattr(_writer.Writer, name, site(name, getattr(_writer.Writer, name)))
    link.HotLink.publish = site("publish", link.HotLink.publish)
    _wal.WriteAheadLog.write = site("wal.write", _wal.WriteAheadLog.write)
    orig_add = TieredMemory.add
    @functools.wraps(orig_add)
    def add(self, *a, **k):
        ST.cur = {}; p0, q0 = ss(); t0 = time.perf_counter()
        try: return orig_add(self, *a, **k)
        finally:
            p1, q1 = ss(); d = ST.cur; ST.cur = None
            d["_total"] = [p1 - p0, time.perf_counter() - t0, q1 - q0]; ST.adds.append(d)
    TieredMemory.add = add
orig_worker = mpb.worker
def worker(path, device, embedder, seconds, search_share, delete_share, seed, ready, out, flush_stretch=1.0):
    install()
    class Q:
        def put(self, item):
            item["adds_sites"] = ST.adds; out.put(item)
    orig_worker(path, device, embedder, seconds, search_share, delete_share, seed, ready, Q(), flush_stretch)
mpb.worker = worker
orig_run = mpb.run
def run(paths, device, embedder, processes, seconds, search_share, delete_share, floor_cpu_s=None):
    import multiprocessing as mp
    ctx = mp.get_context("spawn"); out = ctx.Queue(); ready = ctx.Barrier(processes, timeout=600)
    ws = [ctx.Process(target=worker, args=(str(paths[0]), device, embedder, seconds, search_share, delete_share, 1000 + i, ready, out)) for i in range(processes)]
    [w.start() for w in ws]; reps = [out.get(timeout=seconds + 300) for _ in ws]; [w.join() for w in ws]
    adds = sorted((a for r in reps for a in r["adds_sites"]), key=lambda a: a["_total"][1])
    n = len(adds)
    for label, sel in (("all", adds), ("median band", adds[int(n*.4):int(n*.6)]), ("slowest 2%", adds[int(n*.98):])):
        keys = sorted({k for a in sel for k in a})
        print(f"{label} ({len(sel)} adds):")
        for k in keys:
            sw = sum(a.get(k, [0, 0, 0])[0] for a in sel) / len(sel); wl = sum(a.get(k, [0, 0, 0])[1] for a in sel) / len(sel) * 1e3
            rq = sum(a.get(k, [0, 0, 0])[2] for a in sel) / len(sel) * 1e3
            print(f"   {k:28s} switch-ins {sw:5.2f}  wall {wl:6.2f} ms  runq {rq:6.2f} ms")
    return {"processes": processes, "operations": n, "aggregate_ops_per_s": 0}
mpb.run = run
if __name__ == "__main__":
    mpb.main()
