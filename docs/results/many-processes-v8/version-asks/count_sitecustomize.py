"""Probe (2026-12-04, eighth session; not part of the product): counts calls (and their CPU time) of the store's
follow, sync, search and write steps and the wall time of each LanceDB call by what it does, per worker, into
$CNT_DIR/<pid>.json every 3 s. Copy it in as sitecustomize.py beside ../sitecustomize.py saved as v8patch.py."""
import os, sys, time, json, threading, collections
exec(compile(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "v8patch.py")).read(), "v8patch", "exec"))
OUTD = os.environ.get("CNT_DIR")
if OUTD:
    from tiered_recall.storage import _follower, _tables, _wal, _writer
    from tiered_recall.coordinator import link, memory, placement
    C = collections.defaultdict(lambda: [0, 0.0])
    def count(cls, name, key=None, result=False):
        orig = getattr(cls, name, None)
        if orig is None: return
        def f(*a, **k):
            c = time.thread_time()
            r = orig(*a, **k)
            e = C[key or name]; e[0] += 1; e[1] += time.thread_time() - c
            if result: C[(key or name) + "=" + str(r)][0] += 1
            return r
        setattr(cls, name, f)
    count(_follower.Follower, "follow_log_locked"); count(_follower.Follower, "reload_locked")
    count(_follower.Follower, "apply_own_record_locked", result=True); count(_follower.Follower, "sync_locked", result=True)
    count(_wal.LogFollower, "poll"); count(memory.TieredMemory, "search"); count(memory.TieredMemory, "add")
    count(memory.TieredMemory, "delete"); count(_writer.Writer, "_flush_locked")
    count(link.HotLink, "catch_up"); count(link.HotLink, "publish"); count(link.HotLink, "repair")
    count(memory.TieredMemory, "_after_cold_path")
    og = _tables.LanceTables.guard
    def guard(self, what, fn, *a, **k):
        c = time.thread_time(); w = time.perf_counter()
        try: return og(self, what, fn, *a, **k)
        finally:
            e = C["guard:" + what.split(" ")[0] + " " + " ".join(what.split(" ")[1:3])]; e[0] += 1; e[1] += time.perf_counter() - w
    _tables.LanceTables.guard = guard
    def dump():
        while True:
            time.sleep(3)
            with open(os.path.join(OUTD, f"{os.getpid()}.json"), "w") as fh:
                json.dump({k: v for k, v in C.items()}, fh)
    threading.Thread(target=dump, daemon=True).start()
