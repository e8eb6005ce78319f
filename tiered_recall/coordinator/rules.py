"""The skip rules and the merge, as pure functions of what a search has read (docs/skip-rules.md says why each is
exact): whether the cold tier may be left out, and how the two tiers' candidates become one ranking."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

F32_MARGIN = 1e-5  # rule 2's allowance for rounding in the hot tier's scores: f32 rows ...
F16_MARGIN = 2e-3  # ... and f16 rows (a CUDA hot tier)


@dataclass(frozen=True)
class Evidence:
    """What the hot side of a search established, for decide()."""

    certified: bool  # a certificate covered the scope before the hot answer, and still did after it
    complete: bool  # the hot tier holds every row of the scope (rule 1's counts)
    bounds_usable: bool  # this process's bounds cover every cold-only row of the scope (rule 2's preconditions)
    hot_kth: float | None  # the hot k-th final score, None when the hot tier had fewer than k
    cold_bound: float | None  # the best a cold-only row could score; None when not evaluated
    unfetched: float  # the best a hot row that was not fetched could score (-inf: all were fetched)
    f16: bool  # the hot tier keeps f16 rows


def decide(rules: tuple[str, ...], confidence: float | None, e: Evidence) -> str:
    """The rule that answers from the hot tier alone ("complete", "bound", "threshold"), or "cold". Uncertified
    hot rows may be gone or stale, so without a certificate it is always "cold" (even for the approximate rule)."""
    if not e.certified:
        return "cold"
    if "complete" in rules and e.complete:
        return "complete"
    if "bound" in rules and e.bounds_usable and e.cold_bound is not None:
        ceiling = max(e.cold_bound, e.unfetched)
        margin = F16_MARGIN if e.f16 else F32_MARGIN
        if ceiling == -np.inf or (e.hot_kth is not None and e.hot_kth > ceiling + margin):
            return "bound"
    if "threshold" in rules and e.hot_kth is not None and confidence is not None and e.hot_kth >= confidence:
        return "threshold"
    return "cold"


def hot_kth(hot_scores: np.ndarray, k: int, fetched: int, finals: list[float] | None,
            max_bonus: float) -> tuple[float | None, float]:
    """(the k-th best final score among the hot candidates, or None when fewer than k; the most a hot row that was
    not fetched could score, -inf when every hot row of the scope was fetched). finals: the candidates' final
    scores under the store's Scoring (None without one), best first."""
    if finals is None:
        kth = float(hot_scores[k - 1]) if len(hot_scores) >= k else None
        return kth, -np.inf  # unfetched hot rows score below the k-th raw score
    kth = finals[k - 1] if len(finals) >= k else None
    full = len(hot_scores) >= fetched
    unfetched = float(hot_scores[-1]) + max_bonus if full else -np.inf
    return kth, unfetched


def merge(hot_ids: np.ndarray, hot_scores: np.ndarray, cold_ids: np.ndarray | None, cold_scores: np.ndarray | None,
          *, trust_hot: bool) -> list[tuple[float, int, str]]:
    """Candidates (score, id, tier): the hot ones alone (no cold answer), or the union by id where the hot copy
    wins; untrusted (uncertified) hot rows are left out, since they may be gone or stale."""
    if cold_ids is None:
        return [(s, i, "hot") for i, s in zip(hot_ids.tolist(), hot_scores.tolist())]
    best = {i: (s, "cold") for i, s in zip(np.asarray(cold_ids).tolist(), np.asarray(cold_scores).tolist())}
    if trust_hot:
        for i, s in zip(hot_ids.tolist(), hot_scores.tolist()):
            best[i] = (s, "hot")
    return [(s, i, tier) for i, (s, tier) in best.items()]


def rank(candidates: list[tuple[float, int, str]], found: dict, scoring, now_us: int,
         k: int) -> list[tuple[float, int, str]]:
    """The k best by final score (the store's Scoring applied when it has one), ties by smaller id."""
    if scoring is not None:
        candidates = [(scoring.score(s, found[i], now_us), i, tier) for s, i, tier in candidates if i in found]
    candidates.sort(key=lambda t: (-t[0], t[1]))
    return candidates[:k]


@dataclass
class Answer:
    """One search's ranked hits and how they were decided (what a SearchReport reports)."""

    hits: list
    rule: str
    path: str
    hot_kth: float | None
    cold_bound: float | None


def union_of_answers(answers: list[Answer], k: int) -> Answer:
    """The best k of several namespaces' answers (a prefix searched namespace by namespace): each is exact for its
    namespace, so the best k of their union, best first with ties by id, are exact for all of them. The rule and
    path are the answers' own where they agree, else "prefix" and "hot+cold"."""
    merged = sorted((h for a in answers for h in a.hits), key=lambda h: (-h.score, h.id))[:k]
    rules = {a.rule for a in answers}
    paths = {a.path for a in answers}
    return Answer(merged, rules.pop() if len(rules) == 1 else "prefix", paths.pop() if len(paths) == 1 else "hot+cold",
                  None, None)


def sql_string(value: str) -> str:
    """value as a SQL string literal."""
    return "'" + value.replace("'", "''") + "'"
