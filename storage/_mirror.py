"""In-memory copy of (id, namespace, created_at, vector) for exact search at memory speed; LanceDB stays the truth.

Rows live at positions (append-only, tombstoned, repacked once a quarter are dead). An optional listener (the FAISS
index, whose labels are these positions) hears every added/removed position and every repack, so it stays in step.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np


class MirrorListener(Protocol):
    """Hears every change to the mirror's positions (the FAISS index, whose labels are positions)."""

    def on_add(self, positions: np.ndarray, vectors: np.ndarray) -> None:
        """Rows were appended at positions ((m,) int64) with these vectors ((m, dim) float32)."""
        ...

    def on_remove(self, positions: np.ndarray) -> None:
        """The rows at positions were tombstoned."""
        ...

    def on_repack(self, new_of_old: np.ndarray) -> None:
        """Positions moved: new_of_old[p] is the new position of old position p (-1: a dead row, dropped)."""
        ...


# Positions are repacked once more than 1/_REPACK_DEAD_SHARE of them are dead, so the mirror holds at most 4/3 of
# its live rows: repacked only at half dead, a process that adds and deletes in balance holds up to twice its live
# rows, and its arrays double once more when an add comes before the next delete (in the soak, benchmarks/soak.py,
# the largest growth of a worker's heap). A repack copies the live rows once per third of them deleted.
_REPACK_DEAD_SHARE = 4

# Elements (rows x dim) per matrix-vector product. Past ~500k elements OpenBLAS (numpy's BLAS) splits one product
# over its threads; with many processes on few cores each such product then waits for its helper thread to be
# scheduled, and a 16k x 32 product that takes ~0.05 ms alone takes milliseconds. Products over at most this many
# elements run on the calling thread alone.
_MATVEC_ELEMENTS = 1 << 18


def scores_of(vectors: np.ndarray, query: np.ndarray) -> np.ndarray:
    """vectors @ query, in row blocks small enough that BLAS computes each on the calling thread (the same
    per-row inner products: rows are independent)."""
    n = vectors.shape[0]
    rows = max(1, _MATVEC_ELEMENTS // max(1, vectors.shape[1]))
    if n <= rows:
        return vectors @ query
    out = np.empty(n, np.result_type(vectors.dtype, query.dtype))
    for lo in range(0, n, rows):
        np.matmul(vectors[lo:lo + rows], query, out=out[lo:lo + rows])
    return out


# Rows per block when top_k_with_ties bounds the k-th score by the blocks' maxima (see _candidates_above_kth).
_TOP_K_BLOCK = 64


def _candidates_above_kth(scores: np.ndarray, k: int) -> np.ndarray | None:
    """Positions of every score >= a lower bound of the k-th best, or None when no bound is found this way. The k-th
    largest of the maxima of k or more blocks is such a bound: each of the k blocks at or above it holds a score at
    least that high, so the k-th best score is too, and no score tied with the k-th is left out. Selecting among a
    few hundred block maxima and comparing once costs a fraction of a partition of every score (numpy's partition
    and argpartition of 20k float32 scores took ~5 ns a score)."""
    n = scores.shape[0]
    full = n - n % _TOP_K_BLOCK
    maxima = scores[:full].reshape(-1, _TOP_K_BLOCK).max(axis=1)
    if full < n:
        maxima = np.append(maxima, scores[full:].max())
    if maxima.shape[0] < 4 * k:
        return None
    bound = np.partition(maxima, maxima.shape[0] - k)[maxima.shape[0] - k]
    if not np.isfinite(bound) or np.isnan(maxima).any():
        return None  # fewer than k blocks hold a finite score (or a NaN hides one): the plain way below
    return np.flatnonzero(scores >= bound)


def top_k_with_ties(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Best k of finite `scores` (non-finite means filtered out), best first, equal scores broken by smaller id."""
    if scores.shape[0] >= 16 * _TOP_K_BLOCK and k * 4 * _TOP_K_BLOCK <= scores.shape[0]:
        cand = _candidates_above_kth(scores, k)
        if cand is not None:
            order = np.lexsort((ids[cand], -scores[cand]))[:k]
            chosen = cand[order]
            return ids[chosen].astype(np.int64, copy=False), scores[chosen].astype(np.float32, copy=False)
    finite = np.isfinite(scores)
    if not finite.all():
        scores, ids = scores[finite], ids[finite]
    n = scores.shape[0]
    if n == 0:
        return np.empty(0, np.int64), np.empty(0, np.float32)
    if n > k:
        part = np.argpartition(-scores, k - 1)[:k]
        threshold = scores[part].min()
        # Every row tied with the k-th score competes on id, so the cut cannot depend on partition order.
        cand = np.flatnonzero(scores >= threshold)
    else:
        cand = np.arange(n)
    order = np.lexsort((ids[cand], -scores[cand]))[:k]
    chosen = cand[order]
    return ids[chosen].astype(np.int64, copy=False), scores[chosen].astype(np.float32, copy=False)


class VectorMirror:
    """Append-only arrays with tombstones; an id maps to its live row. Rebuilt when tombstones pile up."""

    def __init__(self, dim: int, capacity: int = 1024):
        self.dim = dim
        self._n = 0
        self._ids = np.empty(capacity, np.int64)
        self._vectors = np.empty((capacity, dim), np.float32)
        self._ns_codes = np.empty(capacity, np.int32)
        self._created = np.empty(capacity, np.int64)
        self._alive = np.zeros(capacity, bool)
        self._pos: dict[int, int] = {}
        self.namespaces: list[str] = []
        self._ns_code: dict[str, int] = {}
        self._ns_live: list[int] = []  # live rows per namespace code
        self._ns_rows: list[list] = []  # per code: [positions array (may hold dead rows), used length]
        self._ns_bits: dict[int, np.ndarray] = {}  # per code, built on demand: packed bitmap of live positions
        self.epoch = 0  # bumped when positions move (repack)
        self.listener: MirrorListener | None = None

    # ---- bookkeeping -------------------------------------------------------------------------
    @property
    def live_rows(self) -> int:
        """Rows alive now (ids with a position)."""
        return len(self._pos)

    def nbytes(self) -> int:
        """Roughly the bytes the mirror's arrays take at their allocated capacity (held against its budget)."""
        return self._vectors.nbytes + self._ids.nbytes * 3

    def _code(self, namespace: str) -> int:
        code = self._ns_code.get(namespace)
        if code is None:
            code = self._ns_code[namespace] = len(self.namespaces)
            self.namespaces.append(namespace)
            self._ns_live.append(0)
            self._ns_rows.append([np.empty(16, np.int64), 0])
        return code

    def _note_ns_rows(self, codes: np.ndarray, lo: int) -> None:
        listed = codes.tolist()
        # Rows of one namespace (most writes): their positions are lo.. at once, with no grouping to do.
        groups = [(listed[0], np.arange(lo, lo + len(listed), dtype=np.int64))] if len(set(listed)) == 1 else \
            [(code, lo + np.flatnonzero(codes == code)) for code in np.unique(codes).tolist()]
        for code, pos in groups:
            slot = self._ns_rows[code]
            arr, used = slot
            if used + pos.size > arr.shape[0]:
                grown = np.empty(max(used + pos.size, 2 * arr.shape[0]), np.int64)
                grown[:used] = arr[:used]
                slot[0] = arr = grown
            arr[used:used + pos.size] = pos
            slot[1] = used + pos.size
            self._ns_live[code] += int(pos.size)
            bits = self._ns_bits.get(code)
            if bits is not None:
                self._ns_bits[code] = bits = _grow_bits(bits, lo + int(codes.shape[0]))
                np.bitwise_or.at(bits, pos >> 3, (1 << (pos & 7)).astype(np.uint8))

    def _repack_due(self) -> bool:
        return self._n > 1024 and (self._n - self.live_rows) * _REPACK_DEAD_SHARE > self._n

    def _reserve(self, extra: int) -> None:
        need = self._n + extra
        cap = self._ids.shape[0]
        if need <= cap:
            return
        if self._repack_due():  # make room by dropping the dead rather than doubling the arrays around them
            self._repack(room=extra)
            return
        self._reallocate(slice(0, self._n), self._n, max(need, cap * 2))

    def _reallocate(self, take, rows: int, capacity: int) -> None:
        """New arrays of `capacity` positions holding the `rows` positions `take` (a slice or an index array) at
        their front; positions past them are free (not alive)."""
        for name in ("_ids", "_ns_codes", "_created", "_alive"):
            old = getattr(self, name)
            new = np.zeros(capacity, old.dtype)
            new[:rows] = old[take]
            setattr(self, name, new)
        vectors = np.empty((capacity, self.dim), np.float32)
        vectors[:rows] = self._vectors[take]
        self._vectors = vectors

    # ---- changes -----------------------------------------------------------------------------
    def upsert(self, ids: np.ndarray, vectors: np.ndarray, namespaces: list[str], created_at_us: np.ndarray) -> None:
        """Appends the rows, ids (m,) int64, vectors (m, dim) float32, namespaces and created_at_us (m,) int64;
        an id already present loses its old position first. The listener hears the new positions."""
        self.remove(ids)
        m = ids.shape[0]
        self._reserve(m)
        lo, hi = self._n, self._n + m
        self._ids[lo:hi] = ids
        self._vectors[lo:hi] = vectors
        codes = np.fromiter((self._code(ns) for ns in namespaces), np.int32, count=m)
        self._ns_codes[lo:hi] = codes
        self._created[lo:hi] = created_at_us
        self._alive[lo:hi] = True
        for offset, row_id in enumerate(ids.tolist()):
            self._pos[row_id] = lo + offset
        self._n = hi
        self._note_ns_rows(codes, lo)
        if self.listener is not None:
            self.listener.on_add(np.arange(lo, hi, dtype=np.int64), self._vectors[lo:hi])

    def remove(self, ids: np.ndarray) -> int:
        """Tombstones the live rows of ids (absent ids are ignored) and repacks when dead rows pile up; returns how many
        were live."""
        gone = []
        for row_id in ids.tolist():
            pos = self._pos.pop(row_id, None)
            if pos is not None:
                self._alive[pos] = False
                gone.append(pos)
        if gone:
            positions = np.asarray(gone, np.int64)
            for code, pos in zip(self._ns_codes[positions].tolist(), gone):
                self._ns_live[code] -= 1
                bits = self._ns_bits.get(code)
                if bits is not None:
                    bits[pos >> 3] &= np.uint8(~(1 << (pos & 7)) & 0xFF)
            if self.listener is not None:
                self.listener.on_remove(positions)
        if gone and self._repack_due():
            self._repack()
        return len(gone)

    def _repack(self, room: int = 0) -> None:
        """The live rows to the front of new arrays with `room` positions free after them."""
        keep = np.flatnonzero(self._alive[: self._n])
        live = keep.shape[0]
        new_of_old = np.full(self._n, -1, np.int64)
        new_of_old[keep] = np.arange(live)
        self._reallocate(keep, live, live + room)
        self._n = live
        self._pos = {row_id: i for i, row_id in enumerate(self._ids[:live].tolist())}
        self._ns_bits.clear()
        for code, slot in enumerate(self._ns_rows):
            slot[0], slot[1] = np.empty(16, np.int64), 0
            self._ns_live[code] = 0
        self._note_ns_rows(self._ns_codes[: self._n], 0)
        self.epoch += 1
        if self.listener is not None:
            self.listener.on_repack(new_of_old)

    # ---- reads -------------------------------------------------------------------------------
    @property
    def n(self) -> int:
        """Positions in use (live and dead)."""
        return self._n

    def positions(self, ids: np.ndarray) -> np.ndarray:
        """Positions of the live rows among ids, in the order asked (absent ids are left out)."""
        return (p := self.positions_or_minus1(ids))[p >= 0]

    def positions_or_minus1(self, ids: np.ndarray) -> np.ndarray:
        """Position of each id, -1 where it has no live row; (len(ids),) int64."""
        get = self._pos.get
        return np.fromiter((get(i, -1) for i in ids.tolist()), np.int64, count=ids.shape[0])

    def ids_at(self, positions: np.ndarray) -> np.ndarray:
        """Row id at each position (live or dead)."""
        return self._ids[positions]

    def vectors_at(self, positions: np.ndarray) -> np.ndarray:
        """The vector at each position, (len(positions), dim) float32 (live or dead)."""
        return self._vectors[positions]

    def alive_at(self, positions: np.ndarray) -> np.ndarray:
        """Whether each position holds a live row."""
        return self._alive[positions]

    def live_positions(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Live positions in [lo, hi) (hi: every position in use), ascending."""
        hi = self._n if hi is None else hi
        return lo + np.flatnonzero(self._alive[lo:hi])

    def label_ids(self) -> np.ndarray:
        """Row id at each position, -1 where dead (what a FAISS label meant when saved)."""
        return np.where(self._alive[: self._n], self._ids[: self._n], -1)

    def alive_mask(self) -> np.ndarray:
        """(n,) bool view: True where the position holds a live row; do not keep it across writes."""
        return self._alive[: self._n]

    def all_vectors(self) -> np.ndarray:
        """(n, dim) view of every position's vector, live or dead; do not keep it across writes."""
        return self._vectors[: self._n]

    def namespace_live(self, namespace: str) -> int:
        """Live rows of one namespace."""
        code = self._ns_code.get(namespace)
        return 0 if code is None else self._ns_live[code]

    def namespace_positions(self, namespace: str) -> np.ndarray:
        """Live positions of one namespace (ascending), without scanning the whole mirror."""
        code = self._ns_code.get(namespace)
        if code is None:
            return np.empty(0, np.int64)
        arr, used = self._ns_rows[code]
        pos = arr[:used]
        pos = pos[self._alive[pos]]
        if pos.shape[0] * 2 < used and used > 64:  # drop dead entries once they dominate
            self._ns_rows[code] = [pos.copy(), pos.shape[0]]
        return pos

    def namespace_bitmap(self, namespace: str) -> np.ndarray:
        """Packed little-endian bitmap over positions: bit p set when position p is live and in `namespace`
        (for faiss.IDSelectorBitmap); kept in step with writes once built."""
        code = self._ns_code.get(namespace)
        if code is None:
            return np.zeros(1, np.uint8)
        bits = self._ns_bits.get(code)
        if bits is None:
            bits = positions_bitmap(self.namespace_positions(namespace), self._n)
            self._ns_bits[code] = bits
        return bits

    def search_positions(self, query: np.ndarray, positions: np.ndarray, k: int,
                         exclude_ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k among live `positions`."""
        scores = scores_of(self._vectors[positions], query)
        ids = self._ids[positions]
        if exclude_ids is not None and exclude_ids.size:
            scores[np.isin(ids, exclude_ids)] = -np.inf
        return top_k_with_ties(scores, ids, k)

    def search(self, query: np.ndarray, k: int, *, namespace: str | None = None,
               only_ids: np.ndarray | None = None, exclude_ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Exact top k of the live rows by inner product with query (dim,), best first, ties by smaller id; only rows
        of namespace and/or only_ids when given, never exclude_ids. Returns (ids int64, scores float32)."""
        n = self._n
        if only_ids is not None:
            rows = self.positions(only_ids)
            if namespace is not None:
                code = self._ns_code.get(namespace, -1)
                rows = rows[self._ns_codes[rows] == code]
            scores = scores_of(self._vectors[rows], query)
            ids = self._ids[rows]
        elif namespace is not None:
            return self.search_positions(query, self.namespace_positions(namespace), k, exclude_ids)
        else:
            scores = scores_of(self._vectors[:n], query)
            ids = self._ids[:n]
            if self.live_rows != n:
                scores[~self._alive[:n]] = -np.inf
        if exclude_ids is not None and exclude_ids.size:
            scores[np.isin(ids, exclude_ids)] = -np.inf
        return top_k_with_ties(scores, ids, k)

    def count(self, namespace: str | None = None) -> int:
        """Live rows (of one namespace when given)."""
        return self.live_rows if namespace is None else self.namespace_live(namespace)

    def namespace_counts(self) -> dict[str, int]:
        """Live rows per namespace, those with none left out."""
        return {ns: int(c) for ns, c in zip(self.namespaces, self._ns_live) if c}

    def namespaces_of(self, ids: np.ndarray) -> set[str]:
        """The namespaces the live rows among ids are in."""
        pos = self.positions(ids)
        return {self.namespaces[c] for c in np.unique(self._ns_codes[pos]).tolist()}

    def rows(self, ids: np.ndarray) -> dict:
        """The live rows among ids, in the order asked (absent ids are left out), as recent() returns them."""
        pos = self.positions_or_minus1(ids)
        pos = pos[pos >= 0]
        return {
            "ids": self._ids[pos].copy(),
            "vectors": self._vectors[pos].copy(),
            "namespace": [self.namespaces[c] for c in self._ns_codes[pos].tolist()],
            "created_at_us": self._created[pos].copy(),
        }

    def recent(self, limit: int, namespace: str | None = None) -> dict:
        """The newest `limit` live rows (of one namespace when given) by created_at, newest first (equal times: larger
        id first): {"ids", "vectors", "namespace", "created_at_us"}, copies."""
        n = self._n
        rows = self.namespace_positions(namespace) if namespace is not None else np.flatnonzero(self._alive[:n])
        # Newest first; equal timestamps put the larger (later-assigned) id first.
        order = np.lexsort((-self._ids[rows], -self._created[rows]))[:limit]
        rows = rows[order]
        return {
            "ids": self._ids[rows].copy(),
            "vectors": self._vectors[rows].copy(),
            "namespace": [self.namespaces[c] for c in self._ns_codes[rows].tolist()],
            "created_at_us": self._created[rows].copy(),
        }


def positions_bitmap(positions: np.ndarray, n: int) -> np.ndarray:
    """Packed little-endian bitmap of `positions` over [0, n) (faiss.IDSelectorBitmap's layout)."""
    mask = np.zeros(max(n, 1), bool)
    mask[positions] = True
    return np.packbits(mask, bitorder="little")


def _grow_bits(bits: np.ndarray, n: int) -> np.ndarray:
    need = (n + 7) // 8
    if need <= bits.shape[0]:
        return bits
    grown = np.zeros(max(need, 2 * bits.shape[0]), np.uint8)
    grown[: bits.shape[0]] = bits
    return grown
