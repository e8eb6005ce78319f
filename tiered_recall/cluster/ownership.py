"""Who answers for a namespace: the directory's ownership view (the shards, a move in progress) and the rule every
shard, and every co-located reader, applies to each request. docs/cluster.md ("Moves") says why it is exact.

At one view version each namespace is served by exactly one shard:
- outside a move, its rendezvous owner among the ring's shards;
- namespaces of the batch being moved: their old owner (reads only: writes wait), the new one holding a copy it does
  not answer for yet;
- namespaces moved already in this transition (`placed`): their new owner;
- the others, during a transition towards the `target` ring: the old owner while it holds rows of the namespace,
  else the new owner (a namespace created during the transition goes straight to its new owner; the old owner never
  gains rows of it again, so it can vouch for that once).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .hashing import owner

SERVE, RETRY, REDIRECT = "serve", "retry", "redirect"


@dataclass(frozen=True)
class Decision:
    """What a shard does with a request: serve it, ask to retry shortly (a namespace moving), or send the caller to
    another shard (`vouched`: the old owner of a namespace in transition holds none of its rows)."""

    kind: str
    to: str | None = None
    vouched: bool = False


SERVED = Decision(SERVE)
MOVING = Decision(RETRY)


@dataclass(frozen=True)
class View:
    """The directory's ownership view at one version. ring: the shards namespaces hash onto; target: the ring a
    transition (a shard added or removed) leads to, None outside one; moving: the batch moving now, {namespace:
    (from, to)}; placed: namespaces moved already in this transition, {namespace: (from, to)}."""

    version: int
    ring: tuple[str, ...]
    target: tuple[str, ...] | None = None
    moving: dict[str, tuple[str, str]] = field(default_factory=dict)
    placed: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def quiet(self) -> bool:
        """No transition: every namespace is its ring owner's."""
        return self.target is None and not self.moving and not self.placed

    @property
    def shards(self) -> tuple[str, ...]:
        """Every shard that may hold namespaces at this version (the ring and the target)."""
        return tuple(sorted(set(self.ring) | set(self.target or ())))

    def route(self, namespace: str) -> str:
        """Where a client sends a request for the namespace first."""
        if namespace in self.moving:
            return self.moving[namespace][0]
        if namespace in self.placed:
            return self.placed[namespace][1]
        return owner(namespace, self.ring)

    def decide(self, me: str, namespace: str, *, write: bool, holds: Callable[[], bool],
               vouched: bool = False) -> Decision:
        """What shard `me` does with a request for the namespace. holds(): whether `me` holds rows of it (asked only
        during a transition); vouched: the old owner said it holds none (a redirect it gave)."""
        moving = self.moving.get(namespace)
        if moving is not None:
            source, _ = moving
            if me == source:
                return MOVING if write else SERVED
            return Decision(REDIRECT, source) if me not in moving else MOVING
        placed = self.placed.get(namespace)
        if placed is not None:
            return SERVED if me == placed[1] else Decision(REDIRECT, placed[1])
        now = owner(namespace, self.ring)
        if self.target is None:
            return SERVED if me == now else Decision(REDIRECT, now)
        new = owner(namespace, self.target)
        if now == new:
            return SERVED if me == new else Decision(REDIRECT, new)
        if me == now:
            return SERVED if holds() else Decision(REDIRECT, new, vouched=True)
        if me == new:
            return SERVED if vouched or holds() else Decision(REDIRECT, now)
        return Decision(REDIRECT, now)

    def serves_held(self, me: str, namespace: str) -> bool:
        """Whether `me`, which holds rows of the namespace, answers for it in a search over many namespaces."""
        return self.decide(me, namespace, write=False, holds=lambda: True).kind == SERVE

    def to_json(self) -> dict[str, Any]:
        """The view as JSON-able values (the manifest, a push, a shard's folder)."""
        return {"version": self.version, "ring": list(self.ring),
                "target": None if self.target is None else list(self.target),
                "moving": {ns: list(pair) for ns, pair in self.moving.items()},
                "placed": {ns: list(pair) for ns, pair in self.placed.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "View":
        """The view to_json() wrote."""
        return cls(version=int(data["version"]), ring=tuple(data["ring"]),
                   target=None if data.get("target") is None else tuple(data["target"]),
                   moving={ns: (pair[0], pair[1]) for ns, pair in (data.get("moving") or {}).items()},
                   placed={ns: (pair[0], pair[1]) for ns, pair in (data.get("placed") or {}).items()})
