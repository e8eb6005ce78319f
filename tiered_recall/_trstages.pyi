"""Type stub for the coordinator's compiled loops `tiered_recall._trstages` (native/src/stagefast.c).

`tiered_recall.coordinator.stages.compiled_stages` loads it from where the package keeps its compiled files and uses
it only when `API` matches `COMPILED_STAGES_API`; `rank_pool` then reads a pool's features and orders it here, with
the same places and scores, bit for bit, as its Python loops; `HotSet.use` counts a search's uses here, with the same
counts as its numpy path; a hot answer's hits are built here, as `records.hit_of` builds them; and
`validate.scaled_to_unit` scales every query here.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

API: int
"""What the module offers (4: pool_lookups, pool_adjusted, top_k, count_uses, hot_hits, scaled_to_unit); must equal
COMPILED_STAGES_API."""


def pool_lookups(features: list[tuple], words: tuple[str, ...], /) -> tuple[
        npt.NDArray[np.bool_], npt.NDArray[np.intp], npt.NDArray[np.bool_]]:
    """features: TurnFeatures (terms, timed, place, before, after: the places numbered, ints) of each pooled memory;
    words: the question's.

    Returns holds (len(words), len(features)) bool, C order (whether each memory's terms hold each word; the caller
    reads its transpose), neighbours (2, len(features)) intp (the pool row of the turn before, then after, each
    memory: the later row where a place is pooled twice, len(features) where none is) and timed (len(features),)
    bool. TypeError for anything but a list of such tuples and a tuple of words."""


def pool_adjusted(pool_scores: list[float], keyword: npt.NDArray[np.float64] | None, keyword_weight: float,
                  neighbours: npt.NDArray[np.intp] | None, neighbour_weight: float,
                  timed: npt.NDArray[np.bool_] | None, temporal_weight: float, /) -> npt.NDArray[np.float64]:
    """The stages' score of each pooled memory: its pool score scaled to [0, 1] (1 where the scores span nothing),
    plus keyword_weight * keyword, plus neighbour_weight times how far its better pooled neighbour scores above it,
    plus temporal_weight where timed; None leaves a stage out. Each operation as numpy orders it."""


def top_k(adjusted: npt.NDArray[np.float64], k: int, /) -> tuple[list[int], list[float]]:
    """The rows of the best k by adjusted (ties and NaNs in pool order, NaNs last) and their scores, as
    np.argsort(-adjusted, kind="stable")[:k] gives them."""


def count_uses(slot_of: dict[int, int], ids: list[int], freq: npt.NDArray[np.float64],
               freq_at: npt.NDArray[np.int64], last_use: npt.NDArray[np.int64], now: int, /) -> None:
    """HotSet.use without a half-life: each distinct id of ids that slot_of tracks counts one use at tick now
    (freq[slot] += 1.0, freq_at[slot] = last_use[slot] = now). Returns NotImplemented, having changed nothing, for
    an id that is not a Python int. TypeError for columns that are not a HotSet's (dtype, length, contiguous,
    writeable); ValueError for a slot outside them."""


def hot_hits(rows: dict[int, object], ids: list[int], scores: list[float], memory_type: type, hit_type: type,
             tier: str, /) -> list | None:
    """records.hit_of of each cached memory of ids (rows maps an id to its cached Memory): a hit_type allocated as
    object.__new__ allocates it, given a copy of the memory's attribute dict with score and tier set. None, having built nothing, where an id is not
    cached, is cached as anything but exactly memory_type, or has a time to live, or past 64 ids. TypeError for
    arguments of other types or scores of another length than ids."""


def scaled_to_unit(vector: npt.NDArray[np.float32], /) -> npt.NDArray[np.float32] | None:
    """A 1-D float32 vector (any stride) divided by its length: the squares summed in float64 over eight running sums
    in a fixed order, the division in float32. None where the length is zero, NaN, infinite or outside (1e-30,
    1e30). TypeError for anything but a 1-D float32 array."""
