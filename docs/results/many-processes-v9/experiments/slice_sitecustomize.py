"""Experiment: a short EEVDF slice request (sched_setattr sched_runtime) for the thread while it adds or deletes."""
import ctypes, functools, os

MODE = os.environ.get("TR_SLICE", "")
if MODE:
    libc = ctypes.CDLL(None, use_errno=True)

    class Attr(ctypes.Structure):
        _fields_ = [("size", ctypes.c_uint32), ("policy", ctypes.c_uint32), ("flags", ctypes.c_uint64),
                    ("nice", ctypes.c_int32), ("priority", ctypes.c_uint32), ("runtime", ctypes.c_uint64),
                    ("deadline", ctypes.c_uint64), ("period", ctypes.c_uint64)]

    def setslice(ns):
        a = Attr(48, 0, 0, os.getpriority(os.PRIO_PROCESS, 0), 0, ns, 0, 0)
        if libc.syscall(314, 0, ctypes.byref(a), 0) != 0:
            raise OSError(ctypes.get_errno(), "sched_setattr")

    SHORT = int(float(MODE) * 1000)  # TR_SLICE in microseconds

    import tiered_recall.coordinator.memory as M

    def wrap(fn):
        @functools.wraps(fn)
        def inner(*a, **k):
            setslice(SHORT)
            try:
                return fn(*a, **k)
            finally:
                setslice(0)
        return inner

    M.TieredMemory.add = wrap(M.TieredMemory.add)
    M.TieredMemory.delete = wrap(M.TieredMemory.delete)
