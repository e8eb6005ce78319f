"""Probe (2026-12-04, eighth session; not part of the product): every outer hold of the log's locks and of the
store's write lock, with its caller, its wait, its wall time and the thread's CPU time inside it (and, inside an
add's or delete's hold, the CPU of the follow, the own-record apply, the bump, the write), one line each, into
$LOCKPROBE_DIR/l-<pid>.txt. run.sh copies it in as sitecustomize.py beside ../sitecustomize.py's TR_HACK=before
patch, which it runs first."""
import os as _o
exec(compile(open(_o.path.join(_o.path.dirname(_o.path.abspath(__file__)), "v8patch.py")).read(), "v8patch", "exec"))
# probe: every outer hold of the WAL append lock and the store write lock: caller, wait, hold (wall, thread cpu)
import os, sys, time, contextlib
OUT = os.environ.get("LOCKPROBE_DIR")
if OUT:
    from tiered_recall.storage import _wal
    from tiered_recall.coordinator import write_lock
    buf = []
    def flush():
        with open(os.path.join(OUT, f"l-{os.getpid()}.txt"), "a") as f:
            f.write("".join(buf)); buf.clear()
    def caller():
        f = sys._getframe(3); names = []
        while f is not None and len(names) < 4:
            n = f.f_code.co_name
            if n not in ("__enter__", "held", "locked", "inner", "helper"): names.append(n)
            f = f.f_back
        return ">".join(names)
    def wrap(orig, kind):
        @contextlib.contextmanager
        def held(self, *a, **k):
            outer = getattr(self, "_depth", 0) == 0
            t0 = time.perf_counter()
            with orig(self, *a, **k) as got:
                t1 = time.perf_counter(); c1 = time.thread_time(); acc.clear() if outer else None
                try:
                    yield got
                finally:
                    if outer and got is not False:
                        t2 = time.perf_counter()
                        buf.append(f"{kind} {time.time():.4f} {(t1-t0)*1e3:.3f} {(t2-t1)*1e3:.3f} {(time.thread_time()-c1)*1e3:.3f} {caller()} " + ",".join(f"{k}={v*1e3:.3f}" for k, v in acc.items()) + "\n")
                        if len(buf) > 100: flush()
        return held
    from tiered_recall.storage import _follower, _writer, _generations
    acc = {}
    def timed(cls, name):
        orig = getattr(cls, name, None)
        if orig is None: return
        def f(*a, **k):
            c = time.thread_time()
            try: return orig(*a, **k)
            finally: acc[name] = acc.get(name, 0.0) + time.thread_time() - c
        setattr(cls, name, f)
    timed(_follower.Follower, "follow_log_locked"); timed(_follower.Follower, "apply_own_record_locked")
    timed(_generations.WriteGenerations, "bump"); timed(_wal.WriteAheadLog, "write"); timed(_writer.Writer, "_queue_waits_locked")
    _wal._FileLock.held = wrap(_wal._FileLock.held, "wal")
    write_lock.StoreWriteLock.held = wrap(write_lock.StoreWriteLock.held, "wl")
