"""Retrieval stages after the exact search: a pool of the best candidates (by vector, or by BM25 fused with the
vector ranking) is re-ranked by the question's words it contains, by its neighbouring turns, by temporal cues, and
spread across sessions.

Each stage weighs evidence it can check in the pool at query time, so that it helps on conversations of any shape
and stands aside where its evidence is missing: a word counts by how rare it is among the pooled turns (a word every
turn shares counts for little), a turn is lifted only by a neighbour that matches the question better than it does,
a time named in a turn counts only for a question that asks when. Every stage scores only what is in the pool, and
the pool is itself an exact answer (the skip rules hold for the vector ranking, the cold tier's BM25 index is
exact), so the re-ranked answer is the same whichever tier served it (docs/recall.md)."""
from __future__ import annotations

import functools
import itertools
import operator
import re
import threading
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple

import numpy as np

from ..errors import InvalidInput
from ..native_files import installed_extension, load_extension
from ..text_terms import tokenize

TURN_INDEX_KEY = "turn_index"  # metadata that ingest writes: a turn's place in its conversation
CONVERSATION_KEY = "conversation_key"
RRF_C = 60.0  # reciprocal-rank fusion's constant, as the cold tier's hybrid search uses
# How deep each ranking is read before fusion, by default: 64 is the largest k the CUDA hot tier answers on its
# batched, persistent-kernel path (TR_BQ_MAX_K in native/src/cuda/params.cuh); a deeper vector ranking takes the
# per-query kernel there, several times slower.
RRF_DEPTH = 64
DEPTH_MAX = 1000
COMPILED_STAGES_API = 4  # what the coordinator expects of _trstages (its API constant)
POOL_MAX = 1000
# A question asking for a time, and a turn that carries one (relative days, weekdays, months, years).
_TEMPORAL_QUESTION = re.compile(r"\b(when|what (year|month|date|day|time)|how long|which (year|month|day))\b", re.I)
_TIME_WORDS = re.compile(
    r"\b(yesterday|today|tonight|tomorrow|last (week|weekend|month|year|night|friday|saturday|sunday|monday|tuesday|"
    r"wednesday|thursday)|next (week|month|year)|ago|recently|this (week|weekend|month|year)|monday|tuesday|wednesday|"
    r"thursday|friday|saturday|sunday|january|february|march|april|may|june|july|august|september|october|november|"
    r"december|(19|20)\d\d)\b", re.I)
_TIME_WORDS_LOWERCASE = re.compile(_TIME_WORDS.pattern)  # the pattern is lowercase: for text lowercased first
# Words that say what kind of answer a question wants, not what it is about: the keyword match leaves them out (the
# BM25 index keeps them, as they may be content in a memory).
_QUESTION_WORDS = frozenset(tokenize(
    "what when where which who whom whose why how much many long often ever was were has have had can could would "
    "should kind sort"))


@dataclass(frozen=True)
class Stages:
    """Which stages a text search runs, and their weights (the presets' were tuned on the LoCoMo dev split and the
    tune half of benchmarks/data/chats: docs/recall.md).

    bm25_weight: the BM25 ranking's weight in reciprocal-rank fusion with the vector ranking; None: vector only, as
        in the presets (fusion by rank lifts a turn that shares one common word with the question as much as one
        that holds all its words; keyword_weight weighs the words instead).
    keyword_weight: a candidate gains this weight times the share of the question's words it contains, each word
        weighing its inverse document frequency among the pooled turns (question words such as "when" left out).
    neighbour_weight: a candidate whose pooled neighbour (the turn just before or after it in its conversation, from
        ingest's turn_index) scores higher gains this share of the difference; never more than that neighbour's
        score, so the stage does not lift a turn past the one that lifted it. 0: off; at most 1.
    temporal_weight: for a question asking when, a candidate whose text names a time gains this much.
    session_spread: each candidate already ranked from the same session costs this much.
    Weights are on the pool's scores scaled to [0, 1] (best 1, worst 0).
    pool: how many exact candidates the stages re-rank (at least k).
    depth: with BM25 fusion, how deep the vector and BM25 rankings are read before they are fused.
    """

    bm25_weight: float | None = None
    keyword_weight: float = 0.0
    neighbour_weight: float = 0.0
    temporal_weight: float = 0.0
    session_spread: float = 0.0
    pool: int = 50
    depth: int = RRF_DEPTH

    def __post_init__(self) -> None:
        for name in ("keyword_weight", "neighbour_weight", "temporal_weight", "session_spread"):
            value = getattr(self, name)
            top = 1 if name == "neighbour_weight" else 10
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= top:
                raise InvalidInput(f"Stages.{name} must be a number from 0 to {top}, got {value!r}")
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
        return bool(self.keyword_weight or self.neighbour_weight or self.temporal_weight or self.session_spread)


class Candidate(NamedTuple):
    """One pooled memory as rerank reads it (a staged search hands rank_pool columns instead)."""

    id: int
    score: float  # the pool's ranking score: cosine, or the fused reciprocal-rank score
    text: str
    session: str | None
    metadata: dict[str, Any]


def fused_pool(vector_ids: Sequence[int], bm25_ids: Sequence[int], bm25_weight: float,
               depth: int) -> list[tuple[int, float]]:
    """The best `depth` of the reciprocal-rank fusion of two rankings (best first), as (id, fused score) pairs, best
    first, ties by smaller id: what sorting fuse's items by (-score, id) gives, without a Python loop over them."""
    ids, totals = _fused(vector_ids, bm25_ids, bm25_weight)
    order = np.lexsort((ids, -totals))[:depth]
    return list(zip(ids[order].tolist(), totals[order].tolist()))


def fuse(vector_ids: Sequence[int], bm25_ids: Sequence[int], bm25_weight: float) -> dict[int, float]:
    """Reciprocal-rank fusion of two rankings (best first): id -> sum of weight / (RRF_C + rank). (fused_pool gives
    the best of it ranked.)"""
    fused: dict[int, float] = defaultdict(float)
    for rank, memory_id in enumerate(vector_ids, start=1):
        fused[int(memory_id)] += 1.0 / (RRF_C + rank)
    for rank, memory_id in enumerate(bm25_ids, start=1):
        fused[int(memory_id)] += bm25_weight / (RRF_C + rank)
    return dict(fused)


def _fused(vector_ids: Sequence[int], bm25_ids: Sequence[int], bm25_weight: float) -> tuple[np.ndarray, np.ndarray]:
    """(distinct ids, their fused scores): each id's terms added in the order a loop over the vector ranking, then
    the BM25 ranking, adds them, so the sums are the same floats."""
    vector = np.asarray(vector_ids, dtype=np.int64).reshape(-1)
    keyword = np.asarray(bm25_ids, dtype=np.int64).reshape(-1)
    terms = np.concatenate([1.0 / (RRF_C + np.arange(1, vector.shape[0] + 1)),
                            bm25_weight / (RRF_C + np.arange(1, keyword.shape[0] + 1))])
    ids, at = np.unique(np.concatenate([vector, keyword]), return_inverse=True)
    return ids, np.bincount(at, weights=terms, minlength=ids.shape[0])


# The memory texts whose words are kept (most recently used first): the same memories come back search after search.
TERMS_KEPT = 65536


class TurnFeatures(NamedTuple):
    """What the stages read of one memory, worked out once from its text and metadata: the terms of its text, whether
    it names a time, and its place in its conversation with the places of the turns before and after it. A place is
    a number its FeatureCache gives each (conversation, turn_index) it meets, so that the neighbour stage compares
    numbers, not tuples; features are compared only with those of the same cache."""

    terms: frozenset[str]
    timed: bool
    place: int  # the number of (conversation, turn_index), or UNPLACED
    before: int  # the number of (conversation, turn_index - 1), or NO_NEIGHBOUR
    after: int


# A memory without a usable turn_index (missing, not an int, or a conversation key that cannot be hashed) has no
# place its neighbours could name: it is looked up under NO_NEIGHBOUR, which no place is.
UNPLACED, NO_NEIGHBOUR = -1, -2


def turn_features(text: str, metadata: dict, place_number: Callable[[Hashable], int]) -> TurnFeatures:
    """A memory's TurnFeatures (its terms and time cue are cached by text); place_number numbers its places."""
    turn = metadata.get(TURN_INDEX_KEY)
    if isinstance(turn, int):
        conversation = metadata.get(CONVERSATION_KEY)
        try:
            hash(conversation)
        except TypeError:  # a list or dict as the conversation key: the turn is read as having no place
            pass
        else:
            return TurnFeatures(_terms(text), names_a_time(text), place_number((conversation, turn)),
                                place_number((conversation, turn - 1)), place_number((conversation, turn + 1)))
    return TurnFeatures(_terms(text), names_a_time(text), UNPLACED, NO_NEIGHBOUR, NO_NEIGHBOUR)


class FeatureCache:
    """TurnFeatures by memory id, for one store's searches: the same memories are pooled search after search. An
    entry is used only for the very Memory it was made from, so a memory replaced in the store's cache (a new text or
    metadata) gets new features; past `limit` entries the cache starts again, its place numbers with it (before a
    call, never during one: one call's features always share their numbering)."""

    def __init__(self, limit: int = TERMS_KEPT) -> None:
        self._entries: dict[int, tuple[Any, TurnFeatures]] = {}
        self._places: dict[Hashable, int] = {}
        self._limit = limit
        self._lock = threading.Lock()

    def _place_number(self, place: Hashable) -> int:
        places = self._places
        number = places.get(place)
        if number is None:
            number = places[place] = len(places)
        return number

    def of(self, memories: Sequence[Any]) -> list[TurnFeatures]:
        """The features of each memory (anything with id, text and metadata), in order."""
        with self._lock:
            entries = self._entries
            if len(entries) + len(memories) > self._limit:
                entries.clear()
                self._places.clear()
            out = []
            for memory in memories:
                entry = entries.get(memory.id)
                if entry is None or entry[0] is not memory:
                    entry = entries[memory.id] = (memory, turn_features(memory.text, memory.metadata,
                                                                        self._place_number))
                out.append(entry[1])
            return out


def rerank(pool: Sequence[Candidate], query_text: str, k: int, stages: Stages, *,
           compiled: bool = True) -> list[tuple[Candidate, float]]:
    """The best k of the pool under the stages' scoring, with those scores (the pool's scaled to [0, 1] plus what
    the stages add); ties keep the pool's order. compiled: as rank_pool's."""
    places, scores = rank_pool([candidate.score for candidate in pool], FeatureCache(max(len(pool), 1)).of(pool),
                               [candidate.session for candidate in pool], query_text, k, stages, compiled=compiled)
    return [(pool[place], score) for place, score in zip(places, scores)]


def rank_pool(pool_scores: Sequence[float], features: Sequence[TurnFeatures], sessions: Sequence[Any] | None,
              query_text: str, k: int, stages: Stages, *, compiled: bool = True) -> tuple[list[int], list[float]]:
    """rerank over a pool given as columns: the places (in the pool) of the best k and their scores. sessions is
    read only for a session spread. compiled: through _trstages where it is installed (the same places and scores
    as the Python loops, bit for bit; False: the Python loops)."""
    count = len(features)
    if not count:
        return [], []
    fast = compiled_stages() if compiled else None
    if fast is None:
        adjusted = _adjusted(pool_scores, features, query_text, stages)
    else:
        holds, neighbours, timed = fast.pool_lookups(features if isinstance(features, list) else list(features),
                                                     _question_words(query_text) if stages.keyword_weight else ())
        adjusted = fast.pool_adjusted(
            pool_scores if isinstance(pool_scores, list) else list(pool_scores),
            _keyword_weights(holds.T) if stages.keyword_weight else None, float(stages.keyword_weight),
            neighbours if stages.neighbour_weight else None, float(stages.neighbour_weight),
            timed if stages.temporal_weight and _TEMPORAL_QUESTION.search(query_text) else None,
            float(stages.temporal_weight))
    if not stages.session_spread:
        if fast is not None:
            return fast.top_k(adjusted, k)
        order = np.argsort(-adjusted, kind="stable")[:k]
        return order.tolist(), adjusted[order].tolist()
    if sessions is None:
        raise ValueError("rank_pool: a session spread reads the pool's sessions; pass them")
    return _spread_over_sessions(sessions, adjusted, k, stages.session_spread)


def _adjusted(pool_scores: Sequence[float], features: Sequence[TurnFeatures], query_text: str,
              stages: Stages) -> np.ndarray:
    """The pool's scores after the stages, before the pool is ordered by them (the Python loops)."""
    raw = np.array(pool_scores, dtype=np.float64)
    # The stages work on the pool's scores scaled to [0, 1], so that one weight means the same for cosine
    # similarities (which crowd together) and for fused reciprocal-rank scores.
    low = raw.min()
    span = raw.max() - low
    scores = (raw - low) / span if span > 0 else np.ones_like(raw)
    if stages.keyword_weight:
        scores = scores + stages.keyword_weight * _keyword_match([f.terms for f in features], query_text)
    adjusted = scores.copy()
    if stages.neighbour_weight:
        adjusted += stages.neighbour_weight * np.maximum(_best_neighbour_scores(features, scores) - scores, 0.0)
    if stages.temporal_weight and _TEMPORAL_QUESTION.search(query_text):
        adjusted += stages.temporal_weight * np.fromiter(map(_timed, features), dtype=bool, count=len(features))
    return adjusted


@functools.lru_cache(maxsize=1)
def compiled_stages() -> Any:
    """The coordinator's compiled loops (native/src/stagefast.c, the module _trstages) from where the package keeps
    its compiled files, or None where that build had no Python headers or numpy: rank_pool, HotSet.use, a hot
    answer's hits and the query's scaling then run in Python, with the same rankings, counts and hits, and unit
    vectors that differ at most in the last bit of the length."""
    path = installed_extension("_trstages")
    return None if path is None else load_extension(
        path, "_trstages", COMPILED_STAGES_API,
        "the coordinator's loops run in Python (the retrieval stages about 0.1 ms slower a search)")


_timed = operator.itemgetter(1)


def keyword_match(question: str, texts: Sequence[str]) -> np.ndarray:
    """For each text, the share of the question's weight that its words carry, from 0 to 1: each word of the question
    (as the BM25 index reads words, question words left out) weighs its inverse document frequency among these texts,
    so a word most of them share counts for little and a rare one (a name, a number) for much; a word none of them
    holds still weighs in the whole, so a question whose words are mostly elsewhere lifts nothing much."""
    if not texts:
        return np.zeros(0)
    return _keyword_match(list(map(_terms, texts)), question)


def _keyword_match(term_sets: list[frozenset[str]], question: str) -> np.ndarray:
    words = _question_words(question)
    if not words:
        return np.zeros(len(term_sets))
    # (texts, words), one membership test per word and text, made by map without a Python frame per test.
    holds = np.array([list(map(operator.contains, term_sets, itertools.repeat(word))) for word in words],
                     dtype=bool).T
    return _keyword_weights(holds)


def _question_words(question: str) -> tuple[str, ...]:
    """The words of a question the keyword match weighs: as the BM25 index reads words, each once, question words
    left out."""
    return tuple(word for word in dict.fromkeys(tokenize(question)) if word not in _QUESTION_WORDS)


def _keyword_weights(holds: np.ndarray) -> np.ndarray:
    """keyword_match from holds (texts, words): whether each text holds each word (all zero for no words)."""
    count, width = holds.shape
    if not width:
        return np.zeros(count)
    found_in = holds.sum(axis=0)
    weights = np.log1p((count - found_in + 0.5) / (found_in + 0.5))  # BM25's inverse document frequency
    return (holds @ weights) / weights.sum()


@functools.lru_cache(maxsize=TERMS_KEPT)
def _terms(text: str) -> frozenset[str]:
    return frozenset(tokenize(text))


def prime_texts(texts: Iterable[str]) -> None:
    """Reads what the stages read of memory texts (their words, whether they name a time) ahead of the searches that
    pool them (a store's own adds: a process that opens a store leaves them to its searches rather than read up to
    TERMS_KEPT texts beside its first calls). A search otherwise reads each text the first time it pools it, which
    makes the first searches over new memories the slowest (docs/recall.md gives the figures)."""
    for text in texts:
        _terms(text)
        names_a_time(text)


@functools.lru_cache(maxsize=65536)
def names_a_time(text: str) -> bool:
    """Whether a memory's text names a time (a relative day, a weekday, a month, a year)."""
    if text.isascii():  # the same match: ASCII text lowercased, without the slower case-insensitive scan
        return _TIME_WORDS_LOWERCASE.search(text.lower()) is not None
    return _TIME_WORDS.search(text) is not None


def _best_neighbour_scores(features: Sequence[TurnFeatures], scores: np.ndarray) -> np.ndarray:
    """For each candidate, the best pool score among the turns right before and after it in its conversation (0 when
    neither is pooled). Two candidates at one turn of a conversation: the later in the pool is the one its neighbours
    see."""
    count = len(features)
    seen = dict(zip(map(_place, features), range(count)))  # a place named twice keeps the later
    padded = np.append(scores, 0.0)  # the score of "not pooled"
    before = np.fromiter(map(seen.get, map(_before, features), itertools.repeat(count)), dtype=np.intp, count=count)
    after = np.fromiter(map(seen.get, map(_after, features), itertools.repeat(count)), dtype=np.intp, count=count)
    return np.maximum(padded[before], padded[after])


_place, _before, _after = operator.itemgetter(2), operator.itemgetter(3), operator.itemgetter(4)


def _spread_over_sessions(pool_sessions: Sequence[Any], adjusted: np.ndarray, k: int,
                          penalty: float) -> tuple[list[int], list[float]]:
    """Greedy: take the best candidate after charging `penalty` for each one already taken from its session (ties:
    the earlier in the pool)."""
    sessions: dict[Any, int] = {}
    session = np.fromiter((sessions.setdefault(name, len(sessions)) for name in pool_sessions),
                          dtype=np.int64, count=len(pool_sessions))
    taken_per_session = np.zeros(len(sessions))
    open_places = np.ones(len(pool_sessions), dtype=bool)
    places: list[int] = []
    charged_scores: list[float] = []
    for _ in range(min(k, len(pool_sessions))):
        charged = adjusted - penalty * taken_per_session[session]
        best = int(np.argmax(np.where(open_places, charged, -np.inf)))
        open_places[best] = False
        taken_per_session[session[best]] += 1
        places.append(best)
        charged_scores.append(float(charged[best]))
    return places, charged_scores
