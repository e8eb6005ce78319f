"""Retrieval stages after the exact search: a pool of the best candidates (by vector, or by BM25 fused with the
vector ranking) is re-ranked by its neighbouring turns, by temporal cues, and spread across sessions.

Every stage scores only what is in the pool, and the pool is itself an exact answer (the skip rules hold for the
vector ranking, the cold tier's BM25 index is exact), so the re-ranked answer is the same whichever tier served it
(docs/recall.md)."""
from __future__ import annotations

import functools
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidInput

TURN_INDEX_KEY = "turn_index"  # metadata that ingest writes: a turn's place in its conversation
CONVERSATION_KEY = "conversation_key"
RRF_C = 60.0  # reciprocal-rank fusion's constant, as the cold tier's hybrid search uses
# How deep each ranking is read before fusion, by default: 64 is the largest k the CUDA hot tier answers on its
# batched, persistent-kernel path (TR_BQ_MAX_K in native/src/cuda/params.cuh); a deeper vector ranking takes the
# per-query kernel there, several times slower.
RRF_DEPTH = 64
DEPTH_MAX = 1000
POOL_MAX = 1000
# A question asking for a time, and a turn that carries one (relative days, weekdays, months, years).
_TEMPORAL_QUESTION = re.compile(r"\b(when|what (year|month|date|day|time)|how long|which (year|month|day))\b", re.I)
_TIME_WORDS = re.compile(
    r"\b(yesterday|today|tonight|tomorrow|last (week|weekend|month|year|night|friday|saturday|sunday|monday|tuesday|"
    r"wednesday|thursday)|next (week|month|year)|ago|recently|this (week|weekend|month|year)|monday|tuesday|wednesday|"
    r"thursday|friday|saturday|sunday|january|february|march|april|may|june|july|august|september|october|november|"
    r"december|(19|20)\d\d)\b", re.I)


@dataclass(frozen=True)
class Stages:
    """Which stages a text search runs, and their weights (tuned on the LoCoMo dev split: docs/recall.md).

    bm25_weight: the BM25 ranking's weight in reciprocal-rank fusion with the vector ranking; None: vector only.
    neighbour_weight: a candidate gains this share of the best score among its pooled neighbours (the turns just
        before and after it in its conversation, from ingest's turn_index); 0: off.
    temporal_weight: for a question asking when, a candidate whose text names a time gains this much.
    session_spread: each candidate already ranked from the same session costs this much.
    Weights are on the pool's scores scaled to [0, 1] (best 1, worst 0).
    pool: how many exact candidates the stages re-rank (at least k).
    depth: with BM25 fusion, how deep the vector and BM25 rankings are read before they are fused.
    """

    bm25_weight: float | None = None
    neighbour_weight: float = 0.0
    temporal_weight: float = 0.0
    session_spread: float = 0.0
    pool: int = 50
    depth: int = RRF_DEPTH

    def __post_init__(self) -> None:
        for name in ("neighbour_weight", "temporal_weight", "session_spread"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 10:
                raise InvalidInput(f"Stages.{name} must be a number from 0 to 10, got {value!r}")
        weight = self.bm25_weight
        if weight is not None and (isinstance(weight, bool) or not isinstance(weight, (int, float))
                                   or not 0 < weight <= 10):
            raise InvalidInput(f"Stages.bm25_weight must be None or a number in (0, 10], got {self.bm25_weight!r}")
        if isinstance(self.pool, bool) or not isinstance(self.pool, int) or not 1 <= self.pool <= POOL_MAX:
            raise InvalidInput(f"Stages.pool must be an int from 1 to {POOL_MAX}, got {self.pool!r}")
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or not 1 <= self.depth <= DEPTH_MAX:
            raise InvalidInput(f"Stages.depth must be an int from 1 to {DEPTH_MAX}, got {self.depth!r}")

    @property
    def reranks(self) -> bool:
        """Whether any stage re-ranks the pool (BM25 fusion alone only builds it)."""
        return bool(self.neighbour_weight or self.temporal_weight or self.session_spread)


@dataclass(frozen=True)
class Candidate:
    """One pooled memory as the stages see it."""

    id: int
    score: float  # the pool's ranking score: cosine, or the fused reciprocal-rank score
    text: str
    session: str | None
    metadata: dict[str, Any]


def fuse(vector_ids: Sequence[int], bm25_ids: Sequence[int], bm25_weight: float) -> dict[int, float]:
    """Reciprocal-rank fusion of two rankings (best first): id -> sum of weight / (RRF_C + rank)."""
    fused: dict[int, float] = defaultdict(float)
    for rank, memory_id in enumerate(vector_ids, start=1):
        fused[int(memory_id)] += 1.0 / (RRF_C + rank)
    for rank, memory_id in enumerate(bm25_ids, start=1):
        fused[int(memory_id)] += bm25_weight / (RRF_C + rank)
    return dict(fused)


def rerank(pool: Sequence[Candidate], query_text: str, k: int, stages: Stages) -> list[tuple[Candidate, float]]:
    """The best k of the pool under the stages' scoring, with those scores (the pool's scaled to [0, 1] plus what
    the stages add); ties keep the pool's order."""
    if not pool:
        return []
    raw = np.array([candidate.score for candidate in pool], dtype=np.float64)
    # The stages work on the pool's scores scaled to [0, 1], so that one weight means the same for cosine
    # similarities (which crowd together) and for fused reciprocal-rank scores.
    span = raw.max() - raw.min()
    scores = (raw - raw.min()) / span if span > 0 else np.ones_like(raw)
    adjusted = scores.copy()
    if stages.neighbour_weight:
        adjusted += stages.neighbour_weight * _best_neighbour_scores(pool, scores)
    if stages.temporal_weight and _TEMPORAL_QUESTION.search(query_text):
        timed = np.array([names_a_time(candidate.text) for candidate in pool])
        adjusted += stages.temporal_weight * timed
    if not stages.session_spread:
        order = np.lexsort((np.arange(len(pool)), -adjusted))[:k]
        return [(pool[i], float(adjusted[i])) for i in order]
    return _spread_over_sessions(pool, adjusted, k, stages.session_spread)


@functools.lru_cache(maxsize=65536)  # the same memories come back search after search
def names_a_time(text: str) -> bool:
    """Whether a memory's text names a time (a relative day, a weekday, a month, a year)."""
    return _TIME_WORDS.search(text) is not None


def _best_neighbour_scores(pool: Sequence[Candidate], scores: np.ndarray) -> np.ndarray:
    """For each candidate, the best pool score among the turns right before and after it (0 when neither is pooled)."""
    at: dict[tuple[Any, int], int] = {}
    for index, candidate in enumerate(pool):
        turn = candidate.metadata.get(TURN_INDEX_KEY)
        if isinstance(turn, int):
            at[(candidate.metadata.get(CONVERSATION_KEY), turn)] = index
    best = np.zeros(len(pool))
    for (conversation, turn), index in at.items():
        neighbours = [at[key] for key in ((conversation, turn - 1), (conversation, turn + 1)) if key in at]
        if neighbours:
            best[index] = max(scores[i] for i in neighbours)
    return best


def _spread_over_sessions(pool: Sequence[Candidate], adjusted: np.ndarray, k: int,
                          penalty: float) -> list[tuple[Candidate, float]]:
    """Greedy: take the best candidate after charging `penalty` for each one already taken from its session."""
    taken_per_session: dict[Any, int] = defaultdict(int)
    remaining = list(range(len(pool)))
    chosen: list[tuple[Candidate, float]] = []
    while remaining and len(chosen) < k:
        charged = {i: adjusted[i] - penalty * taken_per_session[pool[i].session] for i in remaining}
        best = max(remaining, key=lambda i: (charged[i], -i))
        remaining.remove(best)
        taken_per_session[pool[best].session] += 1
        chosen.append((pool[best], float(charged[best])))
    return chosen
