"""A sidecar's shared-memory segment as a client process sees it: its name and file, the header check at attach,
and the state any process reads straight from the mapping without a call (namespace table, counters, the crowd).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import IncompatibleLayout, InvalidInput, SidecarUnavailable
from . import layout as L

SHM_DIR = Path("/dev/shm")
NS_DTYPE = np.dtype([("ns_hash", "<u8"), ("hot_rows", "<u8"), ("total_rows", "<u8"), ("_r", "<u8")])
DTYPE_NAMES = {L.DTYPE_F32: "f32", L.DTYPE_F16: "f16"}
BACKEND_NAMES = {L.BACKEND_CPU: "cpu", L.BACKEND_CUDA: "cuda"}
CODES_NAMES = {L.CODES_OFF: "off", L.CODES_INT8: "int8"}
MASK64 = (1 << 64) - 1


def validate_name(name: str) -> str:
    """Segment names become a file in /dev/shm: keep them to a safe alphabet so no path can escape."""
    if not isinstance(name, str) or not name or len(name) > L.NAME_MAX or name.startswith(".") or ".." in name:
        raise InvalidInput(
            f"invalid sidecar name {name!r}: use 1-{L.NAME_MAX} characters of [A-Za-z0-9_.-], not starting with '.'"
        )
    if any(not (c.isascii() and (c.isalnum() or c in "_.-")) for c in name):
        raise InvalidInput(f"invalid sidecar name {name!r}: only [A-Za-z0-9_.-] are allowed")
    return name


def segment_path(name: str) -> Path:
    """The shared-memory file of sidecar `name` (/dev/shm/tiered-recall.NAME); the name is validated first."""
    return SHM_DIR / f"{L.SEGMENT_PREFIX}{validate_name(name)}"


NAMESPACE_PLACES_KEPT = 4096  # namespaces whose entry's place in the table a client keeps


def mix64(x: int) -> int:
    """The sidecar's hash of a namespace hash to its first probe in the namespace table (layout.h)."""
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & MASK64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & MASK64
    x ^= x >> 33
    return x


def checked_header(fd: int, path: Path, name: str, dim: int | None) -> "L.Header":
    """The segment's header, refused (naming the fix) when it is another user's, still being made, of another layout
    version or dim, or smaller than it says."""
    st = os.fstat(fd)
    if st.st_uid != os.getuid():
        raise SidecarUnavailable(
            f"segment {path} is owned by uid {st.st_uid}, not by you (uid {os.getuid()}): refusing to attach"
        )
    if st.st_size < L.HEADER_BYTES:
        raise SidecarUnavailable(f"segment {path} is still being created or is truncated: retry shortly")
    raw = os.pread(fd, L.HEADER_BYTES, 0)
    head = L.Header.from_buffer_copy(raw)
    if head.magic != L.MAGIC:
        raise IncompatibleLayout(f"{path} is not a tiered-recall segment (bad magic): remove it or pick another name")
    if head.layout_version != L.LAYOUT_VERSION or head.header_bytes != L.HEADER_BYTES:
        raise IncompatibleLayout(
            f"segment layout v{head.layout_version}, client v{L.LAYOUT_VERSION}: restart the sidecar "
            "with the installed version (`tiered-recall serve`)"
        )
    if dim is not None and head.dim != dim:
        raise IncompatibleLayout(
            f"sidecar {name!r} serves dim {head.dim}, you asked for dim {dim}: use dim={head.dim} "
            "or start a sidecar with another --name"
        )
    if st.st_size < head.segment_bytes:
        raise IncompatibleLayout(f"segment {path} is smaller than its header says: restart the sidecar")
    if L.search_result_offset(1, head.dim) + head.max_k * 12 > head.slot_payload_bytes:  # search() relies on it
        raise IncompatibleLayout(
            f"segment {path}: one query at k={head.max_k} does not fit a slot: restart the sidecar"
        )
    return head


class SegmentReads:
    """What a client reads straight from its mapped segment, no call to the sidecar: the namespace table, the
    header's counters and state, and its own client entry. HotTier (client.py) maps the segment and sets the views
    these read: _mm, _header, _ns_table, _ns_words, _ns_mask, _ns_places (an empty dict) and _entry_words."""

    def namespace_rows(self, namespace_hash: int) -> tuple[int, int]:
        """(hot rows, total rows as last set) of one namespace; (0, 0) when unknown. The entry's place is kept once
        found (the sidecar never moves an entry, and the place is checked on each read): a search reads this twice."""
        h = (int(namespace_hash) & MASK64) or 1
        words = self._ns_words
        at = self._ns_places.get(h)
        if at is not None and words[at] == h:
            return words[at + 1], words[at + 2]
        mask = self._ns_mask
        i = mix64(h) & mask
        for _ in range(mask + 1):
            cur = words[4 * i]
            if cur == h:
                if len(self._ns_places) >= NAMESPACE_PLACES_KEPT:
                    self._ns_places.clear()
                self._ns_places[h] = 4 * i
                return words[4 * i + 1], words[4 * i + 2]
            if cur == 0:
                return 0, 0
            i = (i + 1) & mask
        return 0, 0

    def namespace_table(self) -> dict[int, tuple[int, int]]:
        """{namespace hash: (hot rows, total rows)} of every namespace the sidecar has an entry for."""
        used = self._ns_table[self._ns_table["ns_hash"] != 0]
        return {int(e["ns_hash"]): (int(e["hot_rows"]), int(e["total_rows"])) for e in used}

    @property
    def hot_rows(self) -> int:
        """Rows in the hot tier now, read straight from the segment header."""
        return int(self._header.hot_rows)

    def note_work(self) -> None:
        """Counts one operation of this process on its store in the segment (its client entry's activity), whether
        or not it sends the sidecar a request: the sidecar's sweep counts the processes at work from it
        (busy_clients), which crowded and no_spare_core read. A plain store to shared memory, no call."""
        words = self._entry_words
        if words is not None:
            try:
                words[1] = (words[1] + 1) & 0xFFFFFFFF
            except ValueError:  # another thread closed this client meanwhile: nothing left to count
                pass

    @property
    def no_spare_core(self) -> bool:
        """At least as many client processes were at work in the sidecar's last sweep (100 ms) as the machine has
        cores: a scan the sidecar runs on the CPU then takes a core from one of them, and its caller waits for a core
        to run again. Advisory: it may change which exact path a store takes, never what it answers."""
        h = self._header
        return int(h.busy_clients) >= int(h.cores) > 0

    @property
    def crowded(self) -> bool:
        """More client processes were at work in the sidecar's last sweep (100 ms) than the machine has cores, as
        the sidecar published them: a process that blocks (a sleep, a lock, a reply) then waits for a core to run
        again, so waiting in short naps costs far more than the nap. Advisory: it changes how long callers wait,
        never what they get."""
        h = self._header
        return int(h.busy_clients) > int(h.cores)

    @property
    def owner_pid(self) -> int:
        """The sidecar's pid, read from the segment header."""
        return int(self._header.owner_pid)

    @property
    def instance(self) -> tuple[int, int]:
        """(owner pid, start time in ns): tells one run of a sidecar from a later one on the same segment name."""
        h = self._header
        return int(h.owner_pid), int(h.started_ns)

    @property
    def search_path(self) -> str:
        """How search() reaches the sidecar: "compiled" (the _trfast extension) or "ctypes" (a build without
        Python headers; 1.5-3 us slower a search). Benchmarks print it beside their figures."""
        return "compiled" if self._fast is not None else "ctypes"

    def alive(self) -> bool:
        """The sidecar says it serves and its process exists (a syscall and a /proc read)."""
        from .proc import pid_alive

        return self.serving() and pid_alive(self.owner_pid)

    def serving(self) -> bool:
        """The segment's state word says READY: one memory read, cheap enough for every request. A
        sidecar killed outright still reads READY; its next request then fails with SidecarUnavailable."""
        return self._mm is not None and self._header.state == L.SERVER_READY

    def stats(self) -> dict:
        """The sidecar's geometry and counters, with search latency percentiles from its histogram (µs, bucket
        midpoints)."""
        h = self._header
        hist = np.array(h.latency_hist[:], dtype=np.int64)

        def percentile(p: float) -> float | None:
            total = int(hist.sum())
            if total == 0:
                return None
            rank = p * total
            bucket = int(np.searchsorted(np.cumsum(hist), rank))
            return float(1.5 * (1 << bucket)) / 1e3  # bucket midpoint, microseconds

        return {
            "name": self.name, "backend": self.backend, "dtype": self.dtype, "dim": self.dim,
            "capacity": self.capacity, "hot_rows": int(h.hot_rows), "requests": int(h.requests),
            "searches": int(h.searches), "queries": int(h.queries), "upserted_rows": int(h.upserted_rows),
            "deleted_rows": int(h.deleted_rows), "evicted_rows": int(h.evicted_rows), "errors": int(h.errors),
            "reclaimed_slots": int(h.reclaimed_slots), "namespaces": int(h.namespaces),
            "search_p50_us": percentile(0.5), "search_p99_us": percentile(0.99),
            "search_mean_us": (int(h.search_ns_total) / int(h.searches) / 1e3) if h.searches else None,
            "owner_pid": int(h.owner_pid), "slots": int(h.slot_count),
            "codes": CODES_NAMES.get(int(h.codes), str(int(h.codes))), "code_scans": int(h.code_scans),
            "code_fallbacks": int(h.code_fallbacks),
        }
