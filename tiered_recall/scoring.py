"""Scoring of merged candidates: one score scale across tiers, optional recency weighting and metadata boosts.

Both tiers score a memory by the inner product of unit vectors (cosine), so hot and cold scores
are directly comparable. A Scoring re-ranks the merged candidates, the same way whichever tier
they came from:

    final = cosine + recency_weight * 0.5 ** (age_s / half_life_s) + sum(boost.weight for matching boosts)

Boost(field, value, weight): field is "role", "session", "namespace" or "metadata.<key>"; the
boost applies when the memory's field equals value. The skip rules stay provable with scoring:
`max_bonus` bounds what any unseen row could gain (see TieredMemory.search).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidInput

_FIELDS = ("role", "session", "namespace")


@dataclass(frozen=True)
class Boost:
    """Adds weight to a memory's score when its field ("role", "session", "namespace" or "metadata.<key>")
    equals value."""

    field: str
    value: Any
    weight: float

    def __post_init__(self) -> None:
        if not (self.field in _FIELDS or (self.field.startswith("metadata.") and len(self.field) > 9)):
            raise InvalidInput(f"Boost field must be one of {_FIELDS} or 'metadata.<key>', got {self.field!r}")
        if not isinstance(self.weight, (int, float)) or not math.isfinite(self.weight):
            raise InvalidInput(f"Boost weight must be a finite number, got {self.weight!r}")

    def applies(self, memory) -> bool:
        """True when the memory's field equals value (a metadata key it lacks never matches)."""
        if self.field.startswith("metadata."):
            meta = memory.metadata or {}
            key = self.field[9:]
            return key in meta and meta[key] == self.value
        return getattr(memory, self.field) == self.value


@dataclass(frozen=True)
class Scoring:
    """recency_weight: w >= 0; half_life_s: age at which the recency bonus halves; boosts: Boost list;
    candidates: each tier proposes k * candidates rows (at most 256) for the re-rank."""

    recency_weight: float = 0.0
    half_life_s: float = 7 * 24 * 3600.0
    boosts: tuple[Boost, ...] = field(default_factory=tuple)
    candidates: int = 4

    def __post_init__(self) -> None:
        if not (isinstance(self.recency_weight, (int, float)) and self.recency_weight >= 0):
            raise InvalidInput(f"recency_weight must be a number >= 0, got {self.recency_weight!r}")
        if not (isinstance(self.half_life_s, (int, float)) and self.half_life_s > 0):
            raise InvalidInput(f"half_life_s must be > 0 seconds, got {self.half_life_s!r}")
        if not isinstance(self.candidates, int) or self.candidates < 1:
            raise InvalidInput(f"candidates must be a positive int, got {self.candidates!r}")
        object.__setattr__(self, "boosts", tuple(self.boosts))
        for b in self.boosts:
            if not isinstance(b, Boost):
                raise InvalidInput(f"boosts must be Boost(...) instances, got {b!r}")

    @property
    def active(self) -> bool:
        """True when the scoring changes anything (a recency weight or a boost)."""
        return self.recency_weight > 0 or bool(self.boosts)

    def recency_bonus(self, created_us: int, now_us: int | None = None) -> float:
        """recency_weight * 0.5 ** (age_s / half_life_s) of a row created at created_us (now_us: default now)."""
        if self.recency_weight == 0:
            return 0.0
        now_us = time.time_ns() // 1000 if now_us is None else now_us
        age_s = max(0.0, (now_us - created_us) / 1e6)
        return self.recency_weight * 0.5 ** (age_s / self.half_life_s)

    def boost(self, memory) -> float:
        """The sum of the weights of the boosts that apply to the memory."""
        return sum(b.weight for b in self.boosts if b.applies(memory))

    def score(self, cosine: float, memory, now_us: int | None = None) -> float:
        """The final score: cosine plus the memory's recency bonus and boosts."""
        created_us = int(memory.created_at.timestamp() * 1e6)
        return cosine + self.recency_bonus(created_us, now_us) + self.boost(memory)

    @property
    def max_boost(self) -> float:
        """The most boosts can add to any memory (positive weights only; each field has one value)."""
        by_field: dict[str, float] = {}
        for b in self.boosts:
            if b.weight > 0:
                by_field[b.field] = max(by_field.get(b.field, 0.0), b.weight)
        return sum(by_field.values())

    def max_bonus(self, newest_us: int | None, now_us: int | None = None) -> float:
        """The most a row created no later than newest_us can gain (None: any age)."""
        rec = self.recency_weight if newest_us is None else self.recency_bonus(newest_us, now_us)
        return rec + self.max_boost
