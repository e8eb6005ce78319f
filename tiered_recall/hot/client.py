"""HotTier: the client of one sidecar's shared-memory segment (attach, search, upsert, delete, list, counts);
what it reads straight from the mapping without a call is segment.py's.

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
from typing import Sequence

import numpy as np

from ..errors import (
    HotTierFull,
    InvalidInput,
    SidecarError,
    SidecarUnavailable,
)
from . import layout as L
from .native import client_library, fast_search_module
from .segment import (BACKEND_NAMES, CODES_NAMES, DTYPE_NAMES, MASK64, NS_DTYPE, SegmentReads, checked_header,
                      segment_path, validate_name)

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

_INVALID_STATUSES = {L.E_BAD_K, L.E_BAD_COUNT, L.E_NOT_FINITE, L.E_ZERO_VECTOR, L.E_BAD_FLAGS, L.E_BAD_PAYLOAD}
_MAPPINGS_IN_USE: list[mmap.mmap] = []  # segments a closed HotTier could not unmap (HotTier.close)
_F32 = np.dtype(np.float32)


def _as_ids(ids: Sequence[int] | np.ndarray, what: str = "ids") -> np.ndarray:
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise InvalidInput(f"{what} must be a 1-d sequence of integers, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise InvalidInput(f"{what} must be integers, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.int64)


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


class HotTier(SegmentReads):
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
            head = checked_header(fd, path, name, dim)
            self._mm = mmap.mmap(fd, head.segment_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._anchor = C.c_char.from_buffer(self._mm)
        self._base = C.addressof(self._anchor)
        self._header = L.Header.from_buffer(self._mm)
        h = self._header
        self.dim = int(h.dim)
        self.capacity = int(h.capacity)
        self.dtype = DTYPE_NAMES.get(h.dtype, str(h.dtype))
        self.backend = BACKEND_NAMES.get(h.backend, str(h.backend))
        self.codes = CODES_NAMES.get(h.codes, str(h.codes))  # "int8": the backend scans 8-bit codes first (--codes)
        if int(h.backend) == L.BACKEND_CUDA:  # see DEFAULT_CUDA_SPIN_US and DEFAULT_CUDA_YIELD_US
            if spin_us is None:
                self._spin_ns = int(DEFAULT_CUDA_SPIN_US * 1e3)
            if yield_us is None:
                self._yield_ns = int(DEFAULT_CUDA_YIELD_US * 1e3)
        self.max_k = int(h.max_k)
        self.max_upsert_rows = int(h.max_upsert_rows)
        self.max_search_queries = int(h.max_search_queries)
        self._payload_bytes = int(h.slot_payload_bytes)
        self._ns_table = np.frombuffer(self._mm, dtype=NS_DTYPE, count=int(h.ns_entries), offset=int(h.ns_offset))
        self._ns_mask = int(h.ns_entries) - 1
        self._ns_places: dict[int, int] = {}
        # The same table as 64-bit words (hash, hot rows, total rows, reserved per entry): indexing a memoryview
        # gives Python ints at once, where a structured array's entry costs a numpy scalar per field.
        ns_start, ns_end = int(h.ns_offset), int(h.ns_offset) + NS_DTYPE.itemsize * int(h.ns_entries)
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

    def expect(self, seconds: float) -> None:
        """A request follows within `seconds` (a text search while its query is embedded): the sidecar keeps polling
        until then instead of going to sleep, and a sleeping one wakes now, so the request does not pay the wake-up;
        a CUDA sidecar stops its persistent kernel meanwhile (it would hold the GPU from the embedding). At most
        AWAKE_AHEAD_MAX_NS ahead; the sidecar still sleeps while its clients take every core. A plain store and a
        doorbell, no round trip."""
        self._enter()
        try:
            self._lib.tr_client_expect(self._base, max(0, min(int(seconds * 1e9), L.AWAKE_AHEAD_MAX_NS)))
        finally:
            self._leave()

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
            ns = int(namespace_hash) & MASK64
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
            ns = np.full(n, int(namespace_hashes) & MASK64, dtype=np.uint64)
        else:
            ns = np.asarray([int(x) & MASK64 for x in namespace_hashes], dtype=np.uint64)
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
            payload[:m] = [h & MASK64 for h, _ in chunk]
            payload[m:] = [max(0, int(t)) for _, t in chunk]
            self._call(L.OP_SET_TOTALS, count=m, payload=payload)

    def list_ids(self, namespace_hash: int | None = None) -> np.ndarray:
        """Ids of every hot row (of one namespace, by hash, when given), in row order. Exact only while no other
        client writes to the hot tier meanwhile (rows move when others are deleted): callers hold the store's
        write lock."""
        flags, ns = (0, 0) if namespace_hash is None else (L.FLAG_NS_FILTER, int(namespace_hash) & MASK64)
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
