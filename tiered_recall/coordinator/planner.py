"""The planner: every routing decision of a search, as pure functions of the evidence it has read (docs/skip-rules.md
says why each is exact): whether to ask the hot tier at all (plan), whether its answer may skip the cold tier
(decide), how the two tiers' candidates become one ranking (merge, rank), and what a search that read the disk
promotes into the hot tier afterwards (promotion). search.py gathers the evidence and carries the decisions out."""
from __future__ import annotations

import operator

from dataclasses import dataclass
from typing import Protocol

import numpy as np

F32_MARGIN = 1e-5  # rule 2's allowance for rounding in the hot tier's scores: f32 rows ...
F16_MARGIN = 2e-3  # ... and f16 rows (a CUDA hot tier)
SKIPPING_RULES = ("complete", "bound", "threshold")  # the rules that answer from the hot tier alone


class ScopeFacts(Protocol):
    """What plan() may ask of a scope (a namespace, or None: every namespace) before the hot tier is: each a cheap
    read (segment counts, the bounds' state, a row count), taken only when the decision needs it."""

    def sidecar_takes_a_core(self, hot) -> bool:
        """A CPU sidecar with no core to spare: whatever it is asked to do takes a core from a client."""

    def own_copy_small(self, namespace: str | None) -> bool:
        """The cold tier answers the scope by an exact scan of this process's mirror that costs less than a round
        trip to a sidecar with no core to spare."""

    def complete_hint(self, hot, namespace: str | None) -> bool:
        """The hot tier's counts say it holds the whole scope (checked again after the hot answer)."""

    def bounds_usable(self, hot, namespace: str | None) -> bool:
        """This process's bounds cover every cold-only row of the scope (checked again after the hot answer)."""


@dataclass(frozen=True)
class Plan:
    """Whether a search asks the hot tier; when it does not, the rule that answers (from the cold tier alone) and
    whether that answer is exact over the hot tier too (nothing there was missed)."""

    ask_hot: bool
    rule: str | None = None
    trusted: bool = False


ASK_HOT = Plan(True)
NO_HOT = Plan(False, "no-hot", False)
NO_SPARE_CORE = Plan(False, "no-spare-core", True)
COLD_ALONE = Plan(False, "cold", True)


def plan(rules: tuple[str, ...], confidence: float | None, facts: ScopeFacts, hot, namespace: str | None,
         filtered: bool) -> Plan:
    """The first step of a vector search of one scope, with the hot tier `hot` (None: none attached). Not asked: no
    hot tier, or a `where` filter, which only the cold tier evaluates ("no-hot"); a CPU sidecar with no core to spare
    and a scope this process's mirror scans for less ("no-spare-core": the round trip would take a core from a client
    and cost the caller a wait for one; nothing is missed, so the answer is trusted); no rule that could answer from
    the hot tier ("cold": its candidates would add nothing to the cold tier's exact answer but a round trip)."""
    if hot is None or filtered:
        return NO_HOT
    if facts.sidecar_takes_a_core(hot) and facts.own_copy_small(namespace):
        return NO_SPARE_CORE
    if "threshold" in rules and confidence is not None:
        return ASK_HOT  # the approximate rule needs the hot scores
    if "complete" in rules and facts.complete_hint(hot, namespace):
        return ASK_HOT
    if "bound" in rules and facts.bounds_usable(hot, namespace):
        return ASK_HOT
    return COLD_ALONE


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
    else:
        scores = [candidate[0] for candidate in candidates]
        if all(map(operator.gt, scores, scores[1:])):  # the hot tier's answer alone: already in order, no ties
            return candidates[:k]
    candidates.sort(key=lambda t: (-t[0], t[1]))
    return candidates[:k]


def promotion(*, whole_namespace: bool, namespace_to_load: bool, cold_hits: bool,
              sidecar_takes_a_core: bool) -> str | None:
    """What a search that read the cold tier promotes into the hot tier: its whole namespace ("namespace"), for one
    the policy keeps whole and that is not all hot yet, else its cold hits the hot tier lacks ("hits"); "skipped"
    when it would, but the sidecar's work takes a core from a client: a promotion holds the store's write lock across
    that round trip, and the writers whose hot side is due queue behind it (cold hits promote again once a core is
    spare); None when nothing is to be promoted."""
    wanted = namespace_to_load if whole_namespace else cold_hits
    if not wanted:
        return None
    if sidecar_takes_a_core:
        return "skipped"
    return "namespace" if whole_namespace else "hits"


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
