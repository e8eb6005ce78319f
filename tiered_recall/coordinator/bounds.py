"""Provable bounds on what the cold tier could add to a search (skip rule 2).

The cold-only rows of each namespace are covered by a few *cones*: a unit axis a_j and the
smallest cosine cos(alpha_j) between the axis and any row the cone covers. For a unit query q
and a unit row x in cone j, the angle between q and x is at least angle(q, a_j) - alpha_j
(triangle inequality on the sphere), so

    q.x <= cos(max(0, angle(q, a_j) - alpha_j))
         = (q.a_j) cos(alpha_j) + sqrt(1 - (q.a_j)^2) sin(alpha_j)      when angle(q, a_j) > alpha_j
         = 1                                                             otherwise.

This is never looser than DESIGN's q.c_j + r_j with c_j the mean and r_j the radius (for a
cone, c = cos(alpha) a and r = sin(alpha) give q.c + r >= the bound above), so it skips more
often and is exactly as safe. 
Invariant the coordinator keeps: every row of a namespace that is not in the hot tier is covered
by one of that namespace's cones. Rows may leave the cold-only set (promoted, deleted) without
shrinking any cone: the bound stays valid, it only loosens, and `loose` says when a rebuild
from the cold tier would tighten it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

ROWS_PER_CONE = 4          # rebuilds aim at about this many rows per cone
MAX_CONES = 256            # per namespace: bound evaluation costs MAX_CONES x dim flops at most
NEW_CONE_BELOW_COS = 0.9   # an incremental row farther than this from every axis opens a new cone
_EPS = 1e-6                # rounding allowance: float32 rows, float64 arithmetic


def cone_bounds(q: np.ndarray, axes: np.ndarray, cos_alpha: np.ndarray, centers: np.ndarray | None = None,
                radius: np.ndarray | None = None) -> np.ndarray:
    """Upper bound of q.x over each cluster. q: (d,) unit; axes: (m, d) unit; cos_alpha: (m,);
    centers (m, d) and radius (m,) optional (then the ball bound q.c + r caps it too). Returns (m,) float64."""
    if axes.shape[0] == 0:
        return np.empty(0)
    if centers is not None:
        ball = centers.astype(np.float64) @ q.astype(np.float64) + radius
        return np.minimum(cone_bounds(q, axes, cos_alpha), ball)
    c = np.clip(axes.astype(np.float64) @ q.astype(np.float64), -1.0, 1.0)
    ca = np.clip(cos_alpha.astype(np.float64), -1.0, 1.0)
    s = np.sqrt(np.maximum(0.0, 1.0 - c * c))
    sa = np.sqrt(np.maximum(0.0, 1.0 - ca * ca))
    bound = c * ca + s * sa
    inside = c >= ca  # angle(q, a) <= alpha: q itself points into the cone
    bound[inside] = 1.0
    return np.minimum(bound, 1.0)


def _cluster_sums(x: np.ndarray, assign: np.ndarray, m: int) -> np.ndarray:
    """Sum of the rows of x in each of m clusters (np.add.at, by sorting: a sixth of its time at 5k x 32)."""
    order = np.argsort(assign, kind="stable")
    counts = np.bincount(assign, minlength=m)
    sums = np.zeros((m, x.shape[1]), dtype=x.dtype)
    nonempty = counts > 0
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    sums[nonempty] = np.add.reduceat(x[order], starts[nonempty], axis=0)
    return sums


_blas = None


def _one_blas_thread():
    """BLAS on the calling thread alone, for the duration: a rebuild's products (rows x cones) are just big
    enough for OpenBLAS to split them over threads, and with several store processes on few cores each split
    waits for its helper thread to be scheduled (8-process soak on 2 cores: k-means over 5k x 32 rows into 256
    cones took 250 ms with 2 threads, 145 with one)."""
    global _blas
    if _blas is None:
        from threadpoolctl import ThreadpoolController

        _blas = ThreadpoolController()
    return _blas.limit(limits=1, user_api="blas")


def spherical_kmeans(x: np.ndarray, m: int, *, iters: int = 6, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """x: (n, d) unit rows -> (axes (m', d) unit, assignment (n,)); empty clusters are dropped."""
    n = x.shape[0]
    m = max(1, min(m, n))
    rng = np.random.default_rng(seed)
    # farthest-first seeding: a cheap k-means++ that spreads axes over the rows
    chosen = [int(rng.integers(n))]
    best = x @ x[chosen[0]]
    for _ in range(1, m):
        nxt = int(np.argmin(best))
        chosen.append(nxt)
        best = np.maximum(best, x @ x[nxt])
    axes = x[chosen].astype(np.float32)
    assign = np.zeros(n, dtype=np.int64)
    for _ in range(iters):
        assign = np.argmax(x @ axes.T, axis=1)
        sums = _cluster_sums(x, assign, axes.shape[0])
        norms = np.linalg.norm(sums, axis=1)
        keep = norms > 1e-12
        axes = (sums[keep] / norms[keep, None]).astype(np.float32)
        if axes.shape[0] == 0:
            axes = x[:1].astype(np.float32)
    assign = np.argmax(x @ axes.T, axis=1)
    used = np.unique(assign)
    remap = np.full(axes.shape[0], -1, dtype=np.int64)
    remap[used] = np.arange(used.size)
    return axes[used], remap[assign]


@dataclass
class NamespaceBound:
    """Cones covering the cold-only rows of one namespace, and the ids this process knows are cold-only."""

    dim: int
    axes: np.ndarray = None  # (m, d) float32 unit
    cos_alpha: np.ndarray = None  # (m,) float64
    newest_us: np.ndarray = None  # (m,) int64: newest created_at covered (for recency bonuses)
    centers: np.ndarray = None  # (m, d) float64: the ball centre of each cluster
    radius: np.ndarray = None  # (m,) float64: max |x - centre| (plus a rounding allowance)
    ids: set = field(default_factory=set)
    covered: int = 0  # rows ever folded into the cones since the last rebuild

    def __post_init__(self) -> None:
        if self.axes is None:
            self._empty()

    def _empty(self) -> None:
        self.axes = np.empty((0, self.dim), dtype=np.float32)
        self.cos_alpha = np.empty(0)
        self.newest_us = np.empty(0, dtype=np.int64)
        self.centers = np.empty((0, self.dim))
        self.radius = np.empty(0)

    def add(self, ids, vectors: np.ndarray, created_us) -> None:
        """Folds rows into the cones (widening or opening one); they join the cold-only set."""
        vectors = np.asarray(vectors, dtype=np.float32).reshape(-1, self.dim)
        created = np.asarray(created_us, dtype=np.int64).reshape(-1)
        for i, x, t in zip(ids, vectors, created):
            self.ids.add(int(i))
            self.covered += 1
            x64 = x.astype(np.float64)
            if self.axes.shape[0]:
                dots = self.axes.astype(np.float64) @ x64
                j = int(np.argmax(dots))
                if dots[j] >= self.cos_alpha[j] or dots[j] >= NEW_CONE_BELOW_COS or self.axes.shape[0] >= MAX_CONES:
                    self.cos_alpha[j] = min(self.cos_alpha[j], dots[j] - _EPS)  # widen the nearest cone just enough
                    self.radius[j] = max(self.radius[j], float(np.linalg.norm(x64 - self.centers[j])) + _EPS)
                    self.newest_us[j] = max(self.newest_us[j], t)
                    continue
            self.axes = np.vstack([self.axes, x[None, :]])
            self.cos_alpha = np.append(self.cos_alpha, 1.0 - _EPS)
            self.newest_us = np.append(self.newest_us, t)
            self.centers = np.vstack([self.centers, x64[None, :]])
            self.radius = np.append(self.radius, _EPS)

    def discard(self, ids) -> None:
        """Rows leave the cold-only set (promoted or deleted); the cones keep covering them (still a valid bound)."""
        for i in ids:
            self.ids.discard(int(i))

    def rebuild(self, ids, vectors: np.ndarray, created_us) -> None:
        """Replaces the cones with tight ones over exactly these cold-only rows."""
        vectors = np.asarray(vectors, dtype=np.float32).reshape(-1, self.dim)
        created = np.asarray(created_us, dtype=np.int64).reshape(-1)
        self.ids = {int(i) for i in ids}
        self.covered = len(self.ids)
        n = vectors.shape[0]
        if n == 0:
            self._empty()
            return
        m = min(MAX_CONES, max(1, math.ceil(n / ROWS_PER_CONE)))
        with _one_blas_thread():
            axes, assign = spherical_kmeans(vectors, m)
        v64 = vectors.astype(np.float64)
        m = axes.shape[0]
        dots = np.einsum("nd,nd->n", v64, axes[assign].astype(np.float64))
        cos_alpha = np.ones(m)
        np.minimum.at(cos_alpha, assign, dots)
        newest = np.full(m, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(newest, assign, created)
        centers = np.zeros((m, self.dim))
        np.add.at(centers, assign, v64)
        centers /= np.bincount(assign, minlength=m)[:, None]
        radius = np.zeros(m)
        np.maximum.at(radius, assign, np.linalg.norm(v64 - centers[assign], axis=1))
        self.axes, self.cos_alpha, self.newest_us = axes, cos_alpha - _EPS, newest
        self.centers, self.radius = centers, radius + _EPS

    @property
    def loose(self) -> bool:
        """True when the cones cover many rows that are no longer cold-only: a rebuild would tighten them."""
        return self.covered > 2 * len(self.ids) + ROWS_PER_CONE or self.axes.shape[0] > max(1, len(self.ids))

    def bound(self, q: np.ndarray) -> float:
        """Largest score any cold-only row could have for the unit query q (-inf when none)."""
        if not self.ids or self.axes.shape[0] == 0:
            return -math.inf
        return float(cone_bounds(q, self.axes, self.cos_alpha, self.centers, self.radius).max())

    def bound_with_bonus(self, q: np.ndarray, bonus_of_newest) -> float:
        """Like bound, plus bonus_of_newest(newest_us) per cone (a recency bonus grows with created_at)."""
        if not self.ids or self.axes.shape[0] == 0:
            return -math.inf
        b = cone_bounds(q, self.axes, self.cos_alpha, self.centers, self.radius)
        return float(max(b[j] + bonus_of_newest(int(self.newest_us[j])) for j in range(b.shape[0])))


class BoundIndex:
    """NamespaceBound per namespace (by name), kept by one coordinator process.

    Sharing across processes: summaries are per process and conservatively invalidated. The
    coordinator compares the sidecar's membership counters (upserted / deleted / evicted rows,
    hot rows, owner pid) with what its own writes explain; any change it did not make (another
    process wrote, the sidecar restarted) sets valid=False, rule 2 stops skipping, and the
    summaries are rebuilt from the cold tier (rate-limited) before it skips again.
    """

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.by_namespace: dict[str, NamespaceBound] = {}
        self.where: dict[int, str] = {}  # cold-only id -> its namespace
        self.valid = False

    def get(self, namespace: str) -> NamespaceBound:
        """The namespace's NamespaceBound, made empty on first use."""
        nb = self.by_namespace.get(namespace)
        if nb is None:
            nb = self.by_namespace[namespace] = NamespaceBound(self.dim)
        return nb

    def cold_only_count(self, namespace: str | None = None) -> int:
        """How many rows this process knows are cold-only (of the namespace, or of all when None)."""
        if namespace is None:
            return len(self.where)
        nb = self.by_namespace.get(namespace)
        return 0 if nb is None else len(nb.ids)

    def add(self, namespace: str, ids, vectors, created_us) -> None:
        """Folds cold-only rows of a namespace into its cones; an id that was cold-only in another namespace leaves
        that one's set."""
        ids = [int(i) for i in ids]
        self.discard(ids)  # an id moving between namespaces leaves the old one's set
        self.get(namespace).add(ids, vectors, created_us)
        for i in ids:
            self.where[i] = namespace

    def discard(self, ids) -> None:
        """Ids leave the cold-only sets (promoted to hot, or deleted); cones are kept (still valid)."""
        for i in ids:
            ns = self.where.pop(int(i), None)
            if ns is not None:
                self.by_namespace[ns].ids.discard(int(i))

    def reset_ids(self, namespace: str, ids) -> None:
        """The cold-only ids of a namespace are exactly these (before a rebuild of its cones)."""
        nb = self.get(namespace)
        for i in nb.ids:
            self.where.pop(i, None)
        for i in ids:
            self.where[int(i)] = namespace

    def bound(self, q, namespace: str | None, bonus_of_newest=None) -> float:
        """Best score any cold-only row (of the namespace, or of all when None) could reach."""
        groups = self.by_namespace.values() if namespace is None else [self.by_namespace.get(namespace)]
        best = -math.inf
        for nb in groups:
            if nb is None:
                continue
            b = nb.bound(q) if bonus_of_newest is None else nb.bound_with_bonus(q, bonus_of_newest)
            best = max(best, b)
        return best

    def stats(self) -> dict:
        """valid, namespaces with cold-only rows, cones, and cold-only rows (for TieredMemory.stats())."""
        return {"valid": self.valid, "namespaces": sum(1 for nb in self.by_namespace.values() if nb.ids),
                "cones": int(sum(nb.axes.shape[0] for nb in self.by_namespace.values())),
                "cold_only_rows": len(self.where)}

    def clear(self) -> None:
        """Forgets every cone and cold-only id; invalid until rebuilt."""
        self.by_namespace.clear()
        self.where.clear()
        self.valid = False
