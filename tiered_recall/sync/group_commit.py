"""Group commit of the hot tier's side of writes: whoever holds the store's write lock applies every write logged
since the last such application, by any process, in log order, and certifies them (docs/skip-rules.md). What
applying a batch means for the hot tier (the placement policy, the bounds) is the coordinator's: a HotSide.

A logged write is durable, and counted in the write generations, once its record is in the write-ahead log; the
record carries its bump. Its writer then takes the store's write lock only if no other process has already applied
it: with several writers waiting, the first one in applies all their records at once and the others find theirs
done. The hot tier's side is stated by the records alone (the last operation of each id, the namespaces touched),
so it may be applied again harmlessly; the position applied up to lives beside the certificates, in the store
folder.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from .certificates import HotCertificates, repair
from .log_format import Rows


# How many more times a holder of the write lock applies the log when records arrived while it applied.
LATECOMER_ROUNDS = 2


@dataclass(frozen=True)
class NewestRows:
    """The newest logged row of each id a batch of records upserts, oldest first (so the newest end most recent)."""

    ids: np.ndarray  # (n,) int64
    vectors: np.ndarray  # (n, dim) float32
    namespaces: list[str]
    created_at_us: np.ndarray  # (n,) int64


class HotSide(Protocol):
    """The coordinator's part of applying records to the hot tier (its placement policy decides where rows go)."""

    def apply(self, hot, removed: list[int], newest: NewestRows | None, namespaces: set[str] | None) -> None:
        """Removes `removed` from the hot tier, publishes the totals of `namespaces` (None: every namespace's, since
        some record did not say which it touched), and places `newest`."""


class LoggedWrites:
    """One process's part in applying the log to the hot tier (call apply() under the store's write lock)."""

    def __init__(self, cold, hot_side: HotSide, certs: HotCertificates) -> None:
        self.cold, self.hot_side, self.certs = cold, hot_side, certs
        self._reader = cold.log_reader()
        self.applied_records = 0  # records this process applied for any writer (stats)
        self.applications = 0  # times it held the lock and applied at least one record
        self.restarts = 0  # times the position was unknown or gone and every hot row was checked instead
        self.left_to_others = 0  # this process's writes whose hot side it left to the lock's holder or a search

    def close(self) -> None:
        """Closes the log reader."""
        if self._reader is not None:
            self._reader.close()

    def covers(self, end: tuple[int, int]) -> bool:
        """True when the hot tier already has the side of the logged write whose record ends at `end`."""
        return self.certs.covers(end)

    def waiting_bytes(self, end: tuple[int, int]) -> float:
        """Bytes of the log between the applied position and `end` (a record's end): what the next apply() would
        read up to it, across one rotation of the log too. Infinite when the position is not known or lies more than
        one log generation earlier."""
        applied = self.certs.applied()
        if applied is None or self._reader is None:
            return float("inf")
        return self._reader.bytes_between(applied, end)

    def apply(self, hot, epoch: tuple[int, int], *, own_note: tuple[int, int] | None = None,
              own_side: Callable[[], None] | None = None) -> bool:
        """Applies every record past the applied position to the hot tier, then moves the position past them.
        own_note / own_side: this process's write that bypassed the log (its "changed" note starts at own_note):
        own_side() does its hot-tier side when the note is reached, in its place in the log order. Returns whether
        own_side ran: not when the log could not be followed (every hot row was checked instead, against a cold
        tier that may hold later writes of the same ids than own_side knows)."""
        start = self.certs.applied()
        events = None
        if start is not None and self._reader is not None:
            try:
                self._reader.seek(*start)
                events = self._reader.poll()
            except FileNotFoundError:
                events = None
        if events is None or any(kind == "gap" for kind, _ in events):
            self._restart(hot, epoch)  # the position is unknown, or its log generations were deleted
            return False
        batch: list = []
        for kind, record in events:
            if kind in ("rows", "deleted"):
                batch.append(record)
            elif kind == "note" and own_note is not None and (record.gen, record.offset) == tuple(own_note):
                self._apply_batch(hot, batch, epoch)
                batch = []
                own_side()
                own_side = None  # done, in order
        self._apply_batch(hot, batch, epoch)
        self.certs.set_applied(self._reader.position)
        return own_side is None

    def apply_with_latecomers(self, hot, epoch: tuple[int, int], rounds: int = LATECOMER_ROUNDS) -> bool:
        """apply(), then again while records were logged meanwhile (at most `rounds` more times): the writers
        that found the lock taken while it applied and left their records to it (HotLink.publish) are covered
        before the lock goes, instead of waiting for the next holder or search."""
        done = self.apply(hot, epoch)
        for _ in range(rounds):
            if not self.more_logged():
                break
            done = self.apply(hot, epoch)
        return done

    def more_logged(self) -> bool:
        """True when records were logged past where the last apply() stopped: writes in flight, which their writers
        (or the next holder of the lock) apply; a scope stale only for them needs no repair. False without a log."""
        return self._reader is not None and self._reader.has_more()

    def _restart(self, hot, epoch: tuple[int, int]) -> None:
        """Checks every hot row against the cold tier and certifies from there, with the position where that read
        began (certificates.repair)."""
        self.restarts += 1
        self.certs.set_applied(None)
        repair(hot, self.cold, self.certs, epoch, None)

    def _apply_batch(self, hot, batch: list, epoch: tuple[int, int]) -> None:
        """The hot side of records, in log order: each id's last operation (its newest row placed, or its removal)
        and the totals of every namespace touched (HotSide.apply), then each record's bump certified where it
        chains on the certificate (HotCertificates.advance)."""
        if not batch:
            return
        last: dict[int, tuple[Rows, int] | None] = {}
        names: set[str] = set()
        every_namespace = False
        for record in batch:
            if isinstance(record, Rows):
                for j, row_id in enumerate(record.ids.tolist()):
                    last[row_id] = (record, j)
                names.update(record.namespaces)
            else:
                for row_id in record.ids.tolist():
                    last[row_id] = None
            bump = record.bump
            if bump is None or bump.namespaces is None:
                every_namespace = True  # which namespaces the ids were in is not known: publish every total
            else:
                names.update(bump.namespaces)
        gone = [row_id for row_id, op in last.items() if op is None]
        kept = [op for op in last.values() if op is not None]
        newest = None
        if kept:
            kept.sort(key=lambda op: (op[0].gen, op[0].offset, op[1]))  # oldest first: the newest end most recent
            newest = NewestRows(np.array([int(rec.ids[j]) for rec, j in kept], dtype=np.int64),
                                np.stack([rec.vectors[j] for rec, j in kept]),
                                [rec.namespaces[j] for rec, j in kept],
                                np.array([int(rec.created_at_us[j]) for rec, j in kept], dtype=np.int64))
        self.hot_side.apply(hot, gone, newest, None if every_namespace else names)
        for record in batch:
            self.certs.advance(record.bump, epoch)
        self.applied_records += len(batch)
        self.applications += 1

    def figures(self) -> dict:
        """What this process did for the group commit (stats()["hot_writes"])."""
        return {"applied_records": self.applied_records, "applications": self.applications,
                "restarts": self.restarts, "left_to_others": self.left_to_others}
