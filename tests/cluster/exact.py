"""What the cluster tests check answers against: every row each test wrote (kept in a model), and exact search over
them with numpy."""
from __future__ import annotations

import threading

import numpy as np

from tiered_recall.namespaces import namespace_name, under_prefix


class Model:
    """The rows a test wrote: id -> (stored namespace name, the vector as the cluster stores it)."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[str, np.ndarray]] = {}
        self._lock = threading.Lock()

    def put(self, namespace, ids, vectors) -> None:
        name = namespace_name(namespace)
        with self._lock:
            for i, v in zip(ids, np.asarray(vectors, dtype=np.float32)):
                self.rows[int(i)] = (name, v / np.linalg.norm(v))

    def drop(self, ids) -> None:
        with self._lock:
            for i in ids:
                self.rows.pop(int(i), None)

    def exact(self, q: np.ndarray, k: int, *, namespace=None, prefix=None) -> list[tuple[int, float]]:
        """The k best (id, score) in the scope, best first, ties by id (float64 scores)."""
        name = None if namespace is None else namespace_name(namespace)
        pre = None if prefix is None else namespace_name(prefix)
        with self._lock:
            chosen = [(i, v) for i, (ns, v) in self.rows.items()
                      if (name is None or ns == name) and (pre is None or under_prefix(ns, pre))]
        scored = [(i, float(np.dot(v.astype(np.float64), q.astype(np.float64)))) for i, v in chosen]
        return sorted(scored, key=lambda t: (-t[1], t[0]))[:k]


def same_answer(hits, expected: list[tuple[int, float]], tolerance: float = 1e-5) -> bool:
    """The hits are the exact answer: the same scores in order, and the same ids where no other row ties."""
    if len(hits) != len(expected):
        return False
    if any(abs(h.score - s) > tolerance for h, (_, s) in zip(hits, expected)):
        return False
    for h, (i, s) in zip(hits, expected):
        if h.id != i and not any(abs(s - t) <= tolerance for j, t in expected if j == h.id):
            return False
    return True


def unit(rng: np.random.Generator, dim: int) -> np.ndarray:
    q = rng.standard_normal(dim).astype(np.float32)
    return q / np.linalg.norm(q)
