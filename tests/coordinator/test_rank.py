"""The ranking of a search's candidates (planner.rank): best score first, ties by the smaller id, whether the
candidates come in order (the hot tier's answer alone, which it returns as it is) or not."""
from __future__ import annotations

import math

from tiered_recall.coordinator.planner import rank


def test_candidates_in_order_come_back_as_they_are() -> None:
    candidates = [(0.9, 7, "hot"), (0.5, 3, "hot"), (0.1, 9, "hot")]
    assert rank(list(candidates), {}, None, 0, 2) == candidates[:2]


def test_ties_go_to_the_smaller_id_and_disorder_is_sorted() -> None:
    tied = [(0.9, 7, "hot"), (0.9, 3, "hot"), (0.1, 9, "cold")]
    assert rank(tied, {}, None, 0, 3) == [(0.9, 3, "hot"), (0.9, 7, "hot"), (0.1, 9, "cold")]
    shuffled = [(0.1, 9, "cold"), (0.9, 7, "hot"), (0.5, 3, "hot")]
    assert rank(shuffled, {}, None, 0, 2) == [(0.9, 7, "hot"), (0.5, 3, "hot")]


def test_a_nan_score_is_ranked_as_the_sort_ranks_it() -> None:
    candidates = [(0.9, 1, "hot"), (math.nan, 2, "hot"), (0.5, 3, "hot")]
    expected = sorted(candidates, key=lambda t: (-t[0], t[1]))
    assert [i for _, i, _ in rank(list(candidates), {}, None, 0, 3)] == [i for _, i, _ in expected]
