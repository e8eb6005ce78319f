"""Experiment patches for benchmarks/many_processes.py (2026-12-04, seventh session), not part of the product.

Put this folder on PYTHONPATH and pick one patch with TR_HACK; every worker process of the benchmark then runs
with it (Python imports sitecustomize at start-up). Each mode changes one thing, to see whether it moves the add
p99 with 8 writers on the 2-core machine (docs/results.md, seventh session, says what each did):

    nosync        no fdatasync of logged writes (not durable: only to see what the disk wait costs)
    slice         a 0.1 ms EEVDF slice request (sched_setattr's sched_runtime) while blocked in fdatasync
    slice2        the same, and while blocked waiting for a flock
    nogenfsync    no fsyncs when the log rotates to a new generation (not crash-safe: only to measure)
    yield         sched_yield() before taking the log's append lock (the section starts with a fresh slice)
    nodefer       writers on a crowded machine never apply the log to the hot tier themselves
    flushS_R      the log flushed every S seconds or R rows (wal_flush_s, wal_flush_rows), e.g. flush2_2048
    spinN         the append lock's flock retried without blocking for N microseconds before it blocks
    longN         an N ms slice request while the append lock is held
    allfollow     every logged add applies other writers' records under the append lock, as before this session
                  (the code before the new_ids change, for an A/B within one installation)

    cd /tmp && TR_HACK=yield PYTHONPATH=/path/to/docs/results/many-processes-v7 \
        python /path/to/benchmarks/many_processes.py --processes 8 --mix 95/5 --seconds 8
"""
import os
mode = os.environ.get("TR_HACK", "")
if mode == "nosync":
    from tiered_recall.storage import _wal
    def sync(self, fd, end=None):
        return None
    _wal.WriteAheadLog.sync = sync
elif mode.startswith("slice"):
    import ctypes, struct, fcntl
    libc = ctypes.CDLL(None, use_errno=True)
    def _get():
        buf = ctypes.create_string_buffer(56)
        libc.syscall(315, 0, buf, 56, 0)
        return buf
    base = struct.unpack_from('<Q', _get().raw, 24)[0]
    def set_slice(ns):
        buf = _get(); b = bytearray(buf.raw)
        struct.pack_into('<Q', b, 24, ns); struct.pack_into('<Q', b, 8, 0)
        libc.syscall(314, 0, ctypes.create_string_buffer(bytes(b), 56), 0)
    real_sync, real_flock = os.fdatasync, fcntl.flock
    def fdatasync(fd):
        set_slice(100_000)
        try: return real_sync(fd)
        finally: set_slice(base)
    os.fdatasync = fdatasync
    if mode == "slice2":
        def flock(fd, op):
            if op == fcntl.LOCK_EX:
                try: return real_flock(fd, op | fcntl.LOCK_NB)
                except BlockingIOError: pass
                set_slice(100_000)
                try: return real_flock(fd, op)
                finally: set_slice(base)
            return real_flock(fd, op)
        fcntl.flock = flock
if mode == "nogenfsync":
    from tiered_recall.storage import _wal
    def _write_generation(self, header, carried=b""):
        tmp = os.path.join(self.folder, f".{header.gen:016d}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            data = _wal._pack_header(header) + carried
            os.write(fd, data)
        finally:
            os.close(fd)
        os.rename(tmp, self.path_of(header.gen))
    _wal.WriteAheadLog._write_generation = _write_generation
if mode == "yield":
    from tiered_recall.storage import _wal
    _orig_locked = _wal.WriteAheadLog.locked
    def locked(self):
        if self._append_lock is not None and self._append_lock._depth == 0:
            os.sched_yield()
        return _orig_locked(self)
    _wal.WriteAheadLog.locked = locked
if mode == "nodefer":
    from tiered_recall.coordinator import link
    link.DEFERRED_LOG_BYTES = 1 << 40
if mode.startswith("flush"):
    import functools
    from tiered_recall.storage import cold_store
    _s, _r = mode[5:].split("_")
    cold_store.ColdStore.__init__ = functools.partialmethod(cold_store.ColdStore.__init__, wal_flush_s=float(_s), wal_flush_rows=int(_r))
if mode.startswith("spin"):
    import fcntl, time as _t
    from tiered_recall.storage import _wal
    _limit = float(mode[4:]) / 1e6
    real_flock = fcntl.flock
    class F:
        LOCK_EX, LOCK_NB, LOCK_UN, LOCK_SH = fcntl.LOCK_EX, fcntl.LOCK_NB, fcntl.LOCK_UN, fcntl.LOCK_SH
        @staticmethod
        def flock(fd, op):
            if op == fcntl.LOCK_EX:
                end = _t.perf_counter() + _limit
                while True:
                    try:
                        return real_flock(fd, op | fcntl.LOCK_NB)
                    except BlockingIOError:
                        if _t.perf_counter() > end:
                            break
            return real_flock(fd, op)
    _wal.fcntl = F
if mode.startswith("long"):
    import ctypes, struct, contextlib
    from tiered_recall.storage import _wal
    libc = ctypes.CDLL(None, use_errno=True)
    _long = int(float(mode[4:]) * 1e6)
    def _attr(ns):
        b = bytearray(56)
        struct.pack_into('<II', b, 0, 56, 0)  # size, SCHED_OTHER
        struct.pack_into('<Q', b, 24, ns)
        return ctypes.create_string_buffer(bytes(b), 56)
    LONG, DEFAULT = _attr(_long), _attr(0)
    _orig_locked = _wal.WriteAheadLog.locked
    @contextlib.contextmanager
    def locked(self):
        outer = self._append_lock is not None and self._append_lock._depth == 0
        if outer:
            libc.syscall(314, 0, LONG, 0)
        try:
            with _orig_locked(self) as got:
                yield got
        finally:
            if outer:
                libc.syscall(314, 0, DEFAULT, 0)
    _wal.WriteAheadLog.locked = locked
if mode == "allfollow":
    from tiered_recall.storage import _writer
    _orig_add = _writer.Writer.add
    def add(self, rows, *, new_ids=False):
        return _orig_add(self, rows, new_ids=False)
    _writer.Writer.add = add
