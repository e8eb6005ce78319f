"""The cold tier's in-memory vector mirror under churn: how many positions it keeps, and that it still answers."""
from __future__ import annotations

import numpy as np

import pytest

from tiered_recall.storage._mirror import VectorMirror, _candidates_above_kth, top_k_with_ties


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


class Relabels:
    """A listener like the FAISS index: follows every position through adds, removals and repacks."""

    def __init__(self, mirror: VectorMirror) -> None:
        self.mirror = mirror
        self.id_at: dict[int, int] = {}  # position -> id
        self.repacks = 0

    def on_add(self, positions: np.ndarray, vectors: np.ndarray) -> None:
        self.id_at.update(zip(positions.tolist(), self.mirror.ids_at(positions).tolist()))

    def on_remove(self, positions: np.ndarray) -> None:
        for p in positions.tolist():
            del self.id_at[p]

    def on_repack(self, new_of_old: np.ndarray) -> None:
        self.id_at = {int(new_of_old[p]): i for p, i in self.id_at.items()}
        self.repacks += 1


def test_mirror_keeps_at_most_four_thirds_of_its_live_rows_under_churn_and_answers_like_a_fresh_one():
    """Adds and deletes alike (the soak's balanced mix), each round's adds before its deletes: the order in which
    the arrays used to double just before a repack. Positions (live plus dead) stay within 4/3 of the live rows and
    the arrays within 3x; the listener's labels, the ids' vectors and exact searches all match a fresh mirror."""
    rng = np.random.default_rng(21)
    dim, batch = 16, 150
    mirror = VectorMirror(dim)
    mirror.listener = labels = Relabels(mirror)
    vectors: dict[int, np.ndarray] = {}
    next_id = 0

    def add(n: int) -> None:
        nonlocal next_id
        ids = np.arange(next_id, next_id + n, dtype=np.int64)
        x = unit(rng, n, dim)
        mirror.upsert(ids, x, ["a" if i % 3 else "b" for i in ids.tolist()], ids * 10)
        vectors.update(zip(ids.tolist(), x))
        next_id += n

    add(3000)
    most_positions = 0.0
    for _ in range(80):  # 12,000 adds and deletes: four times the live rows
        add(batch)
        gone = rng.choice(np.fromiter(vectors, np.int64), size=batch, replace=False)
        assert mirror.remove(gone) == batch
        for i in gone.tolist():
            del vectors[i]
        assert mirror.live_rows == len(vectors) == 3000
        most_positions = max(most_positions, mirror.n / mirror.live_rows)
        assert mirror.n * 3 <= mirror.live_rows * 4, f"{mirror.n} positions for {mirror.live_rows} live rows"
        assert mirror.nbytes() <= 3 * mirror.live_rows * (dim * 4 + 24)
    assert labels.repacks >= 10 and most_positions > 1.25  # the rule was exercised, not just never reached
    assert labels.id_at == {p: i for p, i in enumerate(mirror.label_ids().tolist()) if i >= 0}
    ids = np.fromiter(vectors, np.int64)
    np.testing.assert_array_equal(mirror.vectors_at(mirror.positions(ids)), np.stack([vectors[i] for i in ids.tolist()]))

    fresh = VectorMirror(dim)
    fresh.upsert(ids, np.stack([vectors[i] for i in ids.tolist()]), ["a" if i % 3 else "b" for i in ids.tolist()],
                 ids * 10)
    for q in unit(rng, 5, dim):
        for namespace in (None, "b"):
            got, want = mirror.search(q, 10, namespace=namespace), fresh.search(q, 10, namespace=namespace)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_allclose(got[1], want[1], rtol=1e-6)


def _top_k_by_full_sort(scores, ids, k):
    finite = np.isfinite(scores)
    s, i = scores[finite], ids[finite]
    order = np.lexsort((i, -s))[:k]
    return i[order], s[order].astype(np.float32)


@pytest.mark.parametrize("seed", range(4))
def test_top_k_by_block_maxima_equals_a_full_sort_with_ties_and_filtered_rows(seed):
    """The block-maxima bound keeps every score tied with the k-th, and filtered (-inf) rows never count: the answer
    is a full sort's, ties by smaller id, whether or not the bound applies."""
    rng = np.random.default_rng(seed)
    bounded = 0
    for trial in range(150):
        n, k = int(rng.integers(900, 20_000)), int(rng.integers(1, 100))
        scores = rng.standard_normal(n).astype(np.float32)
        if trial % 3 == 0:
            scores = np.round(scores * 4) / 4  # many ties, at the k-th score too
        if trial % 5 == 0:
            scores[rng.random(n) < 0.5] = -np.inf
        if trial % 7 == 0:
            scores[rng.random(n) < 0.995] = -np.inf  # fewer blocks with a finite score than k
        ids = rng.integers(0, 2**62, n).astype(np.int64)
        got, want = top_k_with_ties(scores, ids, k), _top_k_by_full_sort(scores, ids, k)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        bounded += _candidates_above_kth(scores, k) is not None and k * 256 <= n
    assert bounded > 20  # the bound itself was exercised, not only the plain way
