"""What a process holds, read from /proc and glibc (RSS and its parts, open files, threads, the heap), and the GPU
memory and shared-memory segments in use: the soak benchmarks print them before and after a run."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def rss_kb(pid: int) -> int | None:
    """The process's resident set size in kB (VmRSS), or None when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_parts_kb(pid: int) -> dict | None:
    """RSS split: anonymous (heap, stacks: what a process holds) and file-backed (mapped code and files: shared
    through the page cache, and loaded once per code path; LanceDB's first flush maps ~16 MB more of its library)."""
    try:
        fields = {line.split(":")[0]: int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if line.startswith(("RssAnon:", "RssFile:", "RssShmem:"))}
    except (OSError, ValueError, IndexError):
        return None
    return {"anon": fields.get("RssAnon"), "file": fields.get("RssFile"), "shmem": fields.get("RssShmem")}


def fd_targets(pid: int) -> list[str] | None:
    """What each open fd points at, with store paths and numbers folded so two lists compare by kind."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    out = []
    for n in names:
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{n}"))
        except OSError:
            continue
    return sorted(out)


def fds(pid: int) -> int | None:
    """How many file descriptors the process has open, or None when they cannot be listed."""
    t = fd_targets(pid)
    return None if t is None else len(t)


def threads(pid: int) -> int | None:
    """How many threads the process runs, or None when they cannot be listed."""
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None


def _fold(target: str, tmp: str) -> str:
    import re

    target = target.replace(tmp, "<tmp>")
    target = re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27,}", "<uuid>", target)
    return re.sub(r"\[\d+\]", "[n]", target)


def fd_kinds(pid: int, tmp: str) -> dict[str, int]:
    """Open fds counted by what they point at, with `tmp` (the run's folder), uuids and bracketed numbers
    (socket:[n]) folded so two lists compare by kind."""
    from collections import Counter

    return dict(Counter(_fold(t, tmp) for t in fd_targets(pid) or []))


def shm_segments() -> list[str]:
    """The tiered-recall shared-memory segments in /dev/shm, sorted."""
    return sorted(p for p in os.listdir("/dev/shm") if p.startswith("tiered-recall."))


def gpu_figures(pids: list[int]) -> dict | str:
    """Device memory used in all and by the given processes, or "no GPU" when nvidia-smi sees none."""
    if shutil.which("nvidia-smi") is None:
        return "no GPU"
    try:
        total = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=20)
        if total.returncode != 0 or not total.stdout.strip():
            return "no GPU"
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20)
        per = {}
        for line in apps.stdout.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and parts[0].isdigit() and int(parts[0]) in pids:
                per[int(parts[0])] = int(parts[1])
        return {"used_mib": [int(x) for x in total.stdout.split()], "by_pid_mib": per}
    except (OSError, ValueError, subprocess.SubprocessError):
        return "no GPU"


def trimmed_rss_kb() -> int | None:
    """This process's RSS after glibc's malloc_trim(0) hands freed heap back to the system: what RSS drops by is
    memory the allocator kept after the program freed it, not memory the program still holds (None off glibc)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return None
    return rss_kb(os.getpid())


def malloc_kb() -> dict | None:
    """glibc's own account of this process's heap (mallinfo2, every arena): in_use = blocks the program holds (small
    and mmapped), free_held = freed blocks the allocator keeps. Anonymous RSS well above in_use + free_held is
    memory no malloc call holds (thread stacks, other mappings); in_use above a fresh process's is live data."""
    import ctypes

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                         "fsmblks", "uordblks", "fordblks", "keepcost")]
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = Mallinfo2
    m = fn()
    return {"in_use": (m.uordblks + m.hblkhd) // 1024, "free_held": m.fordblks // 1024, "mmapped": m.hblkhd // 1024}
