"""HotTier: the client of one sidecar's shared-memory segment (attach, search, upsert, delete, list, counts).

Everything that mirrors native details stays private; the public surface takes and returns numpy
arrays and raises the exceptions of `tiered_recall.errors`.
"""
from __future__ import annotations

import ctypes as C
import mmap
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import (
    HotTierFull,
    IncompatibleLayout,
    InvalidInput,
    SidecarError,
    SidecarUnavailable,
)
from . import layout as L
from .native import client_library, fast_search_module

SHM_DIR = Path("/dev/shm")
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_SPIN_US = 50.0
# A CUDA sidecar answers a search in ~20-150 us (launch, scan, completion), so a client that sleeps
# after 50 us pays a futex wake (server side, per slot) plus its own wake-up latency on nearly every
# search. Against a CUDA segment the default spin is longer; an explicit spin_us always wins.
DEFAULT_CUDA_SPIN_US = 300.0
# After the spin a client polls with sched_yield before it sleeps. A client woken from the futex pays the
# wake-up of an idle core: on the GPU machine its time beyond the sidecar's own (p50) was 14-23 us for a
# 1M x 768 search and 36-72 us for a 4M one, against 7-10 us and 9-33 us polling like this. Yielding leaves
# the core to any runnable thread. Off against a CPU sidecar: there the clients share the cores with the
# sidecar's scan threads (on a 2-core machine a yielding client made a 100k x 384 search 5.0 -> 6.2 ms).
DEFAULT_CUDA_YIELD_US = 10_000.0

_NS_DTYPE = np.dtype([("ns_hash", "<u8"), ("hot_rows", "<u8"), ("total_rows", "<u8"), ("_r", "<u8")])
_DTYPE_NAMES = {L.DTYPE_F32: "f32", L.DTYPE_F16: "f16"}
_BACKEND_NAMES = {L.BACKEND_CPU: "cpu", L.BACKEND_CUDA: "cuda"}
_INVALID_STATUSES = {L.E_BAD_K, L.E_BAD_COUNT, L.E_NOT_FINITE, L.E_ZERO_VECTOR, L.E_BAD_FLAGS, L.E_BAD_PAYLOAD}
_MASK64 = (1 << 64) - 1
_MAPPINGS_IN_USE: list[mmap.mmap] = []  # segments a closed HotTier could not unmap (HotTier.close)
_F32 = np.dtype(np.float32)


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


def _mix64(x: int) -> int:
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & _MASK64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & _MASK64
    x ^= x >> 33
    return x


def _as_ids(ids: Sequence[int] | np.ndarray, what: str = "ids") -> np.ndarray:
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise InvalidInput(f"{what} must be a 1-d sequence of integers, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise InvalidInput(f"{what} must be integers, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _checked_header(fd: int, path: Path, name: str, dim: int | None) -> "L.Header":
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


class SearchResult:
    """ids: (nq, k) int64, -1 past the hits; scores: (nq, k) float32; hits: valid entries per query."""

    __slots__ = ("ids", "scores", "hits", "service_ns")

    def __init__(self, ids: np.ndarray, scores: np.ndarray, hits: int, service_ns: int) -> None:
        self.ids = ids
        self.scores = scores
        self.hits = hits
        self.service_ns = service_ns

    def __repr__(self) -> str:
        return f"SearchResult(hits={self.hits}, ids={self.ids!r}, scores={self.scores!r})"


class HotTier:
    """A client attached to one sidecar's segment. Thread-safe; one per process is plenty.

    Attach with `HotTier.attach(name)`; the segment must be owned by this user and speak this
    package's layout version, else `IncompatibleLayout` says how to fix it.
    """

    def __init__(self, name: str, *, dim: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 spin_us: float | None = None, yield_us: float | None = None) -> None:
        self.name = validate_name(name)
        self.timeout_s = float(timeout_s)
        self._timeout_ns = int(self.timeout_s * 1e9)
        for label, value in (("spin_us", spin_us), ("yield_us", yield_us)):
            if value is not None and not 0 <= value <= 1e6 * self.timeout_s:
                raise InvalidInput(f"{label}={value} is out of range: use 0 to {1e6 * self.timeout_s:g} us (timeout_s)")
        self._spin_ns = int((DEFAULT_SPIN_US if spin_us is None else spin_us) * 1e3)
        self._yield_ns = int((yield_us or 0) * 1e3)
        self._lib = client_library()
        self._search_fn = self._lib.tr_client_search
        self._tls = threading.local()
        # Calls through ctypes inside the segment now, one token each (the fast path counts its own): close() waits
        # for them before it unmaps, so a thread closing the client cannot pull the mapping from under another's
        # call. A call adds its token and then reads _closing; close() sets _closing and then reads the tokens
        # (list append and pop are atomic), so one of the two sees the other. A lock cost ~1 us a call here.
        self._inflight: list[None] = []
        self._closing = False
        self._pid = os.getpid()
        path = segment_path(name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise SidecarUnavailable(
                f"no sidecar segment {path}: start one with `tiered-recall serve --name {name} ...`"
            ) from None
        except PermissionError:
            raise SidecarUnavailable(f"segment {path} belongs to another user: it cannot be attached") from None
        try:
            head = _checked_header(fd, path, name, dim)
            self._mm = mmap.mmap(fd, head.segment_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._anchor = C.c_char.from_buffer(self._mm)
        self._base = C.addressof(self._anchor)
        self._header = L.Header.from_buffer(self._mm)
        h = self._header
        self.dim = int(h.dim)
        self.capacity = int(h.capacity)
        self.dtype = _DTYPE_NAMES.get(h.dtype, str(h.dtype))
        self.backend = _BACKEND_NAMES.get(h.backend, str(h.backend))
        if int(h.backend) == L.BACKEND_CUDA:  # see DEFAULT_CUDA_SPIN_US and DEFAULT_CUDA_YIELD_US
            if spin_us is None:
                self._spin_ns = int(DEFAULT_CUDA_SPIN_US * 1e3)
            if yield_us is None:
                self._yield_ns = int(DEFAULT_CUDA_YIELD_US * 1e3)
        self.max_k = int(h.max_k)
        self.max_upsert_rows = int(h.max_upsert_rows)
        self.max_search_queries = int(h.max_search_queries)
        self._payload_bytes = int(h.slot_payload_bytes)
        self._ns_table = np.frombuffer(self._mm, dtype=_NS_DTYPE, count=int(h.ns_entries), offset=int(h.ns_offset))
        self._ns_mask = int(h.ns_entries) - 1
        # The same table as 64-bit words (hash, hot rows, total rows, reserved per entry): indexing a memoryview
        # gives Python ints at once, where a structured array's entry costs a numpy scalar per field.
        ns_start, ns_end = int(h.ns_offset), int(h.ns_offset) + _NS_DTYPE.itemsize * int(h.ns_entries)
        self._ns_words = memoryview(self._mm)[ns_start:ns_end].cast("Q")
        fast = fast_search_module()
        self._fast = None if fast is None else fast.FastClient(self._base, self._pid, self._timeout_ns, self._spin_ns,
                                                               self._yield_ns, SearchResult)
        self._client_index = self._lib.tr_client_register(self._base, self._pid)
        # This client's entry as two 32-bit words (pid, activity): note_work() moves the second on. None when the
        # table of clients was full (the sweep then counts this process only by its requests).
        self._entry_words = None
        if self._client_index >= 0:
            entry = int(h.clients_offset) + C.sizeof(L.ClientEntry) * self._client_index
            self._entry_words = memoryview(self._mm)[entry:entry + C.sizeof(L.ClientEntry)].cast("I")
        self.ping()

    @classmethod
    def attach(cls, name: str, *, dim: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
               spin_us: float | None = None, yield_us: float | None = None) -> "HotTier":
        """spin_us: how long a call busy-polls for its answer; yield_us: how long it then polls with sched_yield
        before it sleeps on a futex (defaults depend on the sidecar's backend; see DEFAULT_CUDA_YIELD_US)."""
        return cls(name, dim=dim, timeout_s=timeout_s, spin_us=spin_us, yield_us=yield_us)

    # ---- plumbing ----

    def _search_call(self, queries: np.ndarray, ids: np.ndarray, scores: np.ndarray, result: L.CallResult,
                     nq: int) -> L.SearchCall:
        """A tr_search_call over these buffers (which must outlive it), with this client's waits; flags, k and the
        namespace are set before each call."""
        return L.SearchCall(base=self._base, queries=queries.ctypes.data, ids=ids.ctypes.data,
                            scores=scores.ctypes.data, result=C.addressof(result), pid=self._pid, nq=nq,
                            timeout_ns=self._timeout_ns, spin_ns=self._spin_ns, yield_ns=self._yield_ns)

    def _new_scratch(self) -> tuple:
        qbuf = np.empty(self.dim, dtype=np.float32)
        idbuf = np.empty((1, self.max_k), dtype=np.int64)
        scbuf = np.empty((1, self.max_k), dtype=np.float32)
        result = L.CallResult()
        call = self._search_call(qbuf, idbuf, scbuf, result, 1)
        return qbuf, idbuf, scbuf, {}, result, call, C.addressof(call)

    def _enter(self) -> None:
        self._inflight.append(None)
        if self._closing or self._mm is None:
            self._inflight.pop()
            raise SidecarUnavailable("this HotTier is closed: attach again")

    def _leave(self) -> None:
        self._inflight.pop()

    def _call(self, opcode: int, *, flags: int = 0, k: int = 0, count: int = 0, ns_hash: int = 0,
              payload: np.ndarray | None = None, out: np.ndarray | None = None, out_offset: int = 0) -> L.CallResult:
        result = L.CallResult()
        self._enter()
        try:
            rc = self._lib.tr_client_call(
                self._base, self._pid, opcode, flags, k, count, ns_hash,
                None if payload is None else payload.ctypes.data, 0 if payload is None else payload.nbytes,
                None if out is None else out.ctypes.data, out_offset, 0 if out is None else out.nbytes,
                self._timeout_ns, self._spin_ns, self._yield_ns, C.byref(result),
            )
        finally:
            self._leave()
        if rc != L.CALL_OK:
            raise self._call_error(rc)
        if result.status != L.OK:
            raise self._status_error(result.status, result.message)
        return result

    @staticmethod
    def _status_error(status: int, message: bytes) -> Exception:
        text = message.decode("utf-8", "replace")
        if status == L.E_FULL:
            return HotTierFull(text)
        if status in _INVALID_STATUSES:
            return InvalidInput(text)
        return SidecarError(f"sidecar error {status}: {text}")

    def _call_error(self, rc: int) -> Exception:
        header = getattr(self, "_header", None)  # gone when another thread closed this client meanwhile
        pid = header.owner_pid if header is not None else "?"
        if rc == L.CALL_TIMEOUT:
            return SidecarUnavailable(f"sidecar {self.name!r} (pid {pid}) did not answer within {self.timeout_s:g} s")
        if rc in (L.CALL_DEAD, L.CALL_NOT_READY):
            return SidecarUnavailable(
                f"sidecar {self.name!r} (pid {pid}) is not running: start it again (a new one reclaims the segment)"
            )
        if rc == L.CALL_NO_SLOT:
            return SidecarUnavailable(
                f"every request slot of sidecar {self.name!r} stayed busy for {self.timeout_s:g} s: "
                "start it with more --slots or fewer concurrent clients"
            )
        if rc == L.CALL_TOO_LARGE:
            return InvalidInput("request does not fit a slot: send smaller batches")
        return SidecarError(f"client call failed with code {rc}")

    # ---- requests ----

    def ping(self) -> int:
        """Empty round trip; returns the sidecar's service time in ns."""
        return int(self._call(L.OP_PING).service_ns)

    def search(self, queries: np.ndarray, *, k: int = 10, namespace_hash: int | None = None,
               normalize: bool = False, touch: bool = True) -> SearchResult:
        """queries: (d,) or (nq, d) float32, C-contiguous, unit norm unless normalize=True."""
        fast = self._fast
        if fast is not None and type(queries) is np.ndarray:
            # The compiled fast path (native/src/fastsearch.c) returns the SearchResult, (rc, status, message) when
            # the call failed, or None for arguments it does not take: the checks below then say what is wrong.
            answer = fast.search(queries, k, normalize, touch, namespace_hash)
            if type(answer) is SearchResult:
                return answer
            if answer is not None:
                rc, status, message = answer
                raise self._call_error(rc) if rc != L.CALL_OK else self._status_error(status, message)
        q = queries
        if not isinstance(q, np.ndarray) or (q.dtype is not _F32 and q.dtype != _F32) or not q.flags.c_contiguous:
            raise InvalidInput(
                "queries must be a C-contiguous float32 numpy array: pass np.ascontiguousarray(q, dtype=np.float32)"
            )
        nq = 1 if q.ndim == 1 else (q.shape[0] if q.ndim == 2 else -1)
        if nq < 1 or q.shape[-1] != self.dim:
            raise InvalidInput(f"queries must have shape ({self.dim},) or (n, {self.dim}); got {q.shape}")
        if type(k) is not int and not isinstance(k, (int, np.integer)):
            raise InvalidInput(f"k must be an int, got {type(k).__name__}")
        if not 1 <= k <= self.max_k:
            raise InvalidInput(f"k={k} is out of range: use 1 <= k <= {self.max_k}")
        # one query with any valid k always fits (checked at attach)
        if nq > 1 and (nq > self.max_search_queries
                       or L.search_result_offset(nq, self.dim) + nq * k * 12 > self._payload_bytes):
            raise InvalidInput(f"{nq} queries do not fit one request: send at most {self.max_search_queries} at a time")
        # NaN/inf and all-zero queries are rejected by the sidecar itself (E_NOT_FINITE and E_ZERO_VECTOR
        # become InvalidInput naming the fix); checking here too cost ~1 us of a ~7 us round trip.
        flags = (L.FLAG_NORMALIZE if normalize else 0) | (0 if touch else L.FLAG_NO_TOUCH)
        ns = 0
        if namespace_hash is not None:
            flags |= L.FLAG_NS_FILTER
            ns = int(namespace_hash) & _MASK64
        if self._mm is None:
            raise SidecarUnavailable("this HotTier is closed: attach again")
        if nq == 1:
            # Per-thread scratch, built once: taking an array's address costs ~1 us in numpy, and ctypes ~0.1 us
            # per argument, so the call is one address, and copying a query in and k results out (through
            # views kept per k: slicing costs more than the copy) costs a fraction of that.
            scratch = getattr(self._tls, "scratch", None)
            if scratch is None:
                scratch = self._tls.scratch = self._new_scratch()
            qbuf, idbuf, scbuf, views_by_k, result, call, call_address = scratch
            qbuf[...] = q if q.ndim == 1 else q[0]
        else:
            result = L.CallResult()
            ids = np.empty((nq, k), dtype=np.int64)
            scores = np.empty((nq, k), dtype=np.float32)
            call = self._search_call(q, ids, scores, result, nq)
            call_address = C.addressof(call)
        call.flags = flags
        call.k = k
        call.ns_hash = ns
        self._enter()
        try:
            rc = self._search_fn(call_address)
        finally:
            self._leave()
        if nq == 1:
            views = views_by_k.get(k)
            if views is None:
                views = views_by_k[k] = (idbuf[:, :k], scbuf[:, :k])
            ids = views[0].copy()
            scores = views[1].copy()
        if rc != L.CALL_OK:
            raise self._call_error(rc)
        if result.status != L.OK:
            raise self._status_error(result.status, result.message)
        return SearchResult(ids, scores, result.reply_count, result.service_ns)

    def upsert(self, ids: Sequence[int] | np.ndarray, vectors: np.ndarray, namespace_hashes: Sequence[int] | np.ndarray | int,
               *, created_at_us: Sequence[int] | np.ndarray | None = None, normalize: bool = False) -> np.ndarray:
        """Inserts or replaces rows; returns the ids evicted (least recently used) to make room."""
        ids_arr = _as_ids(ids)
        n = ids_arr.shape[0]
        vec = np.asarray(vectors)
        if vec.ndim != 2 or vec.shape != (n, self.dim):
            raise InvalidInput(f"vectors must have shape ({n}, {self.dim}) to match {n} ids; got {vec.shape}")
        if vec.dtype.kind != "f":
            raise InvalidInput(f"vectors must be floating point, got dtype {vec.dtype}")
        vec = np.ascontiguousarray(vec, dtype=np.float32)  # NaN, inf and zero rows: the sidecar refuses them itself
        if n == 0:
            return np.empty(0, dtype=np.int64)
        if n > self.capacity:
            raise HotTierFull(f"{n} rows exceed the hot tier's capacity of {self.capacity}")
        if np.isscalar(namespace_hashes):
            ns = np.full(n, int(namespace_hashes) & _MASK64, dtype=np.uint64)
        else:
            ns = np.asarray([int(x) & _MASK64 for x in namespace_hashes], dtype=np.uint64)
            if ns.shape != (n,):
                raise InvalidInput(f"namespace_hashes must hold {n} values, got {ns.shape[0]}")
        if created_at_us is None:
            created = np.full(n, time.time_ns() // 1000, dtype=np.int64)
        else:
            created = np.ascontiguousarray(created_at_us, dtype=np.int64)
            if created.shape != (n,):
                raise InvalidInput(f"created_at_us must hold {n} values, got {created.shape}")
        flags = L.FLAG_NORMALIZE if normalize else 0
        evicted: list[np.ndarray] = []
        step = self.max_upsert_rows
        for start in range(0, n, step):
            m = min(step, n - start)
            voff = L.upsert_vectors_offset(m)
            payload = np.zeros(voff + m * self.dim * 4, dtype=np.uint8)
            payload[: 8 * m] = ids_arr[start:start + m].view(np.uint8)
            payload[8 * m: 16 * m] = ns[start:start + m].view(np.uint8)
            payload[16 * m: 24 * m] = created[start:start + m].view(np.uint8)
            payload[voff:] = vec[start:start + m].reshape(-1).view(np.uint8)
            out = np.empty(m * 8, dtype=np.uint8)
            res = self._call(L.OP_UPSERT, flags=flags, count=m, payload=payload, out=out,
                             out_offset=L.upsert_reply_offset(m, self.dim))
            evicted.append(out.view(np.int64)[: res.reply_count].copy())
        return np.concatenate(evicted)

    def _id_batches(self, ids: np.ndarray):
        step = max(1, (self._payload_bytes // 9) - 64)
        for start in range(0, ids.shape[0], step):
            yield ids[start:start + step]

    def delete(self, ids: Sequence[int] | np.ndarray) -> int:
        """Removes rows by id; returns how many were present."""
        deleted = 0
        for batch in self._id_batches(_as_ids(ids)):
            deleted += self._call(L.OP_DELETE, count=batch.shape[0], payload=batch).reply_count
        return deleted

    def contains(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Boolean mask: which ids are in the hot tier now."""
        ids_arr = _as_ids(ids)
        masks = []
        for batch in self._id_batches(ids_arr):
            out = np.empty(batch.shape[0], dtype=np.uint8)
            self._call(L.OP_CONTAINS, count=batch.shape[0], payload=batch, out=out,
                       out_offset=L.contains_reply_offset(batch.shape[0]))
            masks.append(out.astype(bool))
        return np.concatenate(masks) if masks else np.zeros(0, dtype=bool)

    def set_namespace_totals(self, totals: dict[int, int]) -> None:
        """Tells every process the total rows (both tiers) of namespaces, by hash."""
        if not totals:
            return
        items = list(totals.items())
        step = max(1, self._payload_bytes // 16 - 8)
        for start in range(0, len(items), step):
            chunk = items[start:start + step]
            m = len(chunk)
            payload = np.empty(2 * m, dtype=np.uint64)
            payload[:m] = [h & _MASK64 for h, _ in chunk]
            payload[m:] = [max(0, int(t)) for _, t in chunk]
            self._call(L.OP_SET_TOTALS, count=m, payload=payload)

    def list_ids(self, namespace_hash: int | None = None) -> np.ndarray:
        """Ids of every hot row (of one namespace, by hash, when given), in row order. Exact only while no other
        client writes to the hot tier meanwhile (rows move when others are deleted): callers hold the store's
        write lock."""
        flags, ns = (0, 0) if namespace_hash is None else (L.FLAG_NS_FILTER, int(namespace_hash) & _MASK64)
        step = (self._payload_bytes - L.LIST_IDS_OFFSET) // 8
        out = np.empty(L.LIST_IDS_OFFSET + 8 * step, dtype=np.uint8)
        parts: list[np.ndarray] = []
        cursor = 0
        while True:
            payload = np.array([cursor], dtype=np.uint64)
            res = self._call(L.OP_LIST_IDS, flags=flags, count=step, ns_hash=ns, payload=payload, out=out)
            parts.append(out[L.LIST_IDS_OFFSET:L.LIST_IDS_OFFSET + 8 * res.reply_count].view(np.int64).copy())
            cursor = int(out[:8].view(np.uint64)[0])
            if cursor >= self.hot_rows:
                break
        return np.concatenate(parts)

    def clear(self) -> int:
        """Removes every hot row (the namespace totals stay); returns how many it removed."""
        return int(self._call(L.OP_CLEAR).reply_count)

    # ---- state read straight from the segment ----

    def namespace_rows(self, namespace_hash: int) -> tuple[int, int]:
        """(hot rows, total rows as last set) of one namespace; (0, 0) when unknown."""
        h = (int(namespace_hash) & _MASK64) or 1
        mask = self._ns_mask
        i = _mix64(h) & mask
        words = self._ns_words
        for _ in range(mask + 1):
            cur = words[4 * i]
            if cur == h:
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
        }

    def close(self) -> None:
        """Detaches. Calls that other threads have inside the segment finish first (each within its timeout); calls
        made after this raise SidecarUnavailable."""
        if getattr(self, "_mm", None) is None:
            return
        if self._closing:
            return
        self._closing = True
        wait_s = self.timeout_s + 1.0
        fast, self._fast = self._fast, None
        drained = fast.close(wait_s) if fast is not None else True
        deadline = time.monotonic() + wait_s
        while drained and self._inflight:
            if time.monotonic() >= deadline:
                drained = False
                break
            time.sleep(0.0005)
        if drained and self._client_index >= 0:
            self._lib.tr_client_unregister(self._base, self._client_index, self._pid)
        self._ns_words.release()
        words, self._entry_words = self._entry_words, None
        if words is not None:
            words.release()
        del self._header, self._anchor, self._ns_table, self._ns_words
        self._base = 0
        mm, self._mm = self._mm, None
        if drained:
            mm.close()
        else:  # a call outlived its own timeout: keep the mapping rather than crash it
            _MAPPINGS_IN_USE.append(mm)
            warnings.warn(f"HotTier {self.name!r} closed while a call was still inside its segment after "
                          f"{wait_s:g} s: the mapping is kept", RuntimeWarning, stacklevel=2)

    def __enter__(self) -> "HotTier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
