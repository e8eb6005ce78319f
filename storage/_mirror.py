"""In-memory copy of (id, namespace, created_at, vector) for exact search at memory speed; LanceDB stays the truth."""
from __future__ import annotations

import numpy as np


def top_k_with_ties(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Best k of finite `scores` (non-finite means filtered out), best first, equal scores broken by smaller id."""
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

    # ---- bookkeeping -------------------------------------------------------------------------
    @property
    def live_rows(self) -> int:
        return len(self._pos)

    def nbytes(self) -> int:
        return self._vectors.nbytes + self._ids.nbytes * 3

    def _code(self, namespace: str) -> int:
        code = self._ns_code.get(namespace)
        if code is None:
            code = self._ns_code[namespace] = len(self.namespaces)
            self.namespaces.append(namespace)
        return code

    def _reserve(self, extra: int) -> None:
        need = self._n + extra
        cap = self._ids.shape[0]
        if need <= cap:
            return
        new_cap = max(need, cap * 2)
        for name in ("_ids", "_ns_codes", "_created", "_alive"):
            old = getattr(self, name)
            new = np.zeros(new_cap, old.dtype)
            new[: self._n] = old[: self._n]
            setattr(self, name, new)
        vectors = np.empty((new_cap, self.dim), np.float32)
        vectors[: self._n] = self._vectors[: self._n]
        self._vectors = vectors

    # ---- changes -----------------------------------------------------------------------------
    def upsert(self, ids: np.ndarray, vectors: np.ndarray, namespaces: list[str], created_at_us: np.ndarray) -> None:
        self.remove(ids)
        m = ids.shape[0]
        self._reserve(m)
        lo, hi = self._n, self._n + m
        self._ids[lo:hi] = ids
        self._vectors[lo:hi] = vectors
        self._ns_codes[lo:hi] = [self._code(ns) for ns in namespaces]
        self._created[lo:hi] = created_at_us
        self._alive[lo:hi] = True
        for offset, row_id in enumerate(ids.tolist()):
            self._pos[row_id] = lo + offset
        self._n = hi

    def remove(self, ids: np.ndarray) -> int:
        removed = 0
        for row_id in ids.tolist():
            pos = self._pos.pop(row_id, None)
            if pos is not None:
                self._alive[pos] = False
                removed += 1
        if removed and self._n > 1024 and self.live_rows < self._n // 2:
            self._repack()
        return removed

    def _repack(self) -> None:
        keep = np.flatnonzero(self._alive[: self._n])
        self._ids = self._ids[keep].copy()
        self._vectors = self._vectors[keep].copy()
        self._ns_codes = self._ns_codes[keep].copy()
        self._created = self._created[keep].copy()
        self._alive = np.ones(keep.shape[0], bool)
        self._n = keep.shape[0]
        self._pos = {row_id: i for i, row_id in enumerate(self._ids.tolist())}

    # ---- reads -------------------------------------------------------------------------------
    def positions(self, ids: np.ndarray) -> np.ndarray:
        get = self._pos.get
        pos = np.fromiter((get(i, -1) for i in ids.tolist()), np.int64, count=ids.shape[0])
        return pos[pos >= 0]

    def search(self, query: np.ndarray, k: int, *, namespace: str | None = None,
               only_ids: np.ndarray | None = None, exclude_ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        n = self._n
        if only_ids is not None:
            rows = self.positions(only_ids)
            if namespace is not None:
                code = self._ns_code.get(namespace, -1)
                rows = rows[self._ns_codes[rows] == code]
            scores = self._vectors[rows] @ query
            ids = self._ids[rows]
        else:
            scores = self._vectors[:n] @ query
            ids = self._ids[:n]
            if self.live_rows != n:
                scores[~self._alive[:n]] = -np.inf
            if namespace is not None:
                code = self._ns_code.get(namespace, -1)
                scores[self._ns_codes[:n] != code] = -np.inf
        if exclude_ids is not None and exclude_ids.size:
            scores[np.isin(ids, exclude_ids)] = -np.inf
        return top_k_with_ties(scores, ids, k)

    def count(self, namespace: str | None = None) -> int:
        if namespace is None:
            return self.live_rows
        code = self._ns_code.get(namespace)
        if code is None:
            return 0
        n = self._n
        return int(np.count_nonzero((self._ns_codes[:n] == code) & self._alive[:n]))

    def namespace_counts(self) -> dict[str, int]:
        n = self._n
        counts = np.bincount(self._ns_codes[:n][self._alive[:n]], minlength=len(self.namespaces))
        return {ns: int(c) for ns, c in zip(self.namespaces, counts) if c}

    def recent(self, limit: int, namespace: str | None = None) -> dict:
        n = self._n
        mask = self._alive[:n].copy()
        if namespace is not None:
            mask &= self._ns_codes[:n] == self._ns_code.get(namespace, -1)
        rows = np.flatnonzero(mask)
        # Newest first; equal timestamps put the larger (later-assigned) id first.
        order = np.lexsort((-self._ids[rows], -self._created[rows]))[:limit]
        rows = rows[order]
        return {
            "ids": self._ids[rows].copy(),
            "vectors": self._vectors[rows].copy(),
            "namespace": [self.namespaces[c] for c in self._ns_codes[rows].tolist()],
            "created_at_us": self._created[rows].copy(),
        }
