"""Expiry of memories with a time to live: the background sweep that deletes them from both tiers, and the refresh
that starts a time to live again.

A search never returns an expired memory whatever the sweep has done (TieredMemory filters them out and searches
deeper); the sweep only keeps the store from holding them. It deletes a memory only after reading it again under
the store's write lock, so a memory whose time to live another process has just refreshed is kept.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np

from .records import EXPIRES_KEY, Memory, memory_of

if TYPE_CHECKING:
    from .memory import TieredMemory

logger = logging.getLogger("tiered_recall")

DEFAULT_SWEEP_S = 60.0
# The LanceDB filter that finds every memory with a time to live (its expiry is a key of the metadata's JSON).
HAS_EXPIRY_SQL = f"metadata LIKE '%\"{EXPIRES_KEY}\"%'"


class ExpirySweeper:
    """Runs sweep() every interval_s seconds in a daemon thread, and sooner when a search found expired memories
    (found()). sweep(candidate_ids) is TieredMemory's: it deletes those of the candidates, and of every memory with
    a time to live, that are expired; it returns how many it deleted."""

    def __init__(self, sweep: Callable[[set[int]], int], interval_s: float = DEFAULT_SWEEP_S) -> None:
        self._sweep = sweep
        self.interval_s = interval_s
        self._pending: set[int] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.swept = 0
        self.sweeps = 0
        self.last_error: str | None = None

    def start(self) -> None:
        """Starts the thread once (a store that never sees a time to live never starts one)."""
        with self._lock:
            if self._thread is not None or self._stopping.is_set():
                return
            self._thread = threading.Thread(target=self._run, name="tiered-recall-expiry", daemon=True)
            self._thread.start()

    def found(self, ids: Iterable[int]) -> None:
        """Expired memories a search or get stepped over: deleted at the next sweep, which starts now."""
        with self._lock:
            self._pending.update(int(i) for i in ids)
        self.start()
        self._wake.set()

    def run_once(self) -> int:
        """One sweep, now, in the calling thread; returns how many memories it deleted."""
        with self._lock:
            candidates, self._pending = self._pending, set()
        deleted = self._sweep(candidates)
        self.swept += deleted
        self.sweeps += 1
        return deleted

    def stop(self) -> None:
        """Stops the thread (at its next wake-up) and waits for it."""
        self._stopping.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=30)

    def stats(self) -> dict:
        """Sweeps run, memories deleted, the last error (None when the last sweep worked)."""
        return {"sweeps": self.sweeps, "deleted": self.swept, "interval_s": self.interval_s,
                "running": self._thread is not None and self._thread.is_alive(), "last_error": self.last_error}

    def _run(self) -> None:
        next_at = time.monotonic() + self.interval_s
        while not self._stopping.is_set():
            self._wake.wait(timeout=max(0.0, next_at - time.monotonic()))
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                self.run_once()
                self.last_error = None
            except Exception as error:  # a sweep that failed is tried again at the next interval
                self.last_error = f"{type(error).__name__}: {error}"
                logger.warning("tiered-recall: the expiry sweep failed (tried again in %.0f s): %s",
                               self.interval_s, self.last_error)
            if time.monotonic() >= next_at:
                next_at = time.monotonic() + self.interval_s


def refreshed(memory: "TieredMemory", memories: list[Memory]) -> dict[int, Memory]:
    """Each memory written again as it is, its time to live started again from now; {id: the new Memory}."""
    if not memories:
        return {}
    out: dict[int, Memory] = {}
    groups: dict[tuple[str, float], list[Memory]] = {}
    for m in memories:
        groups.setdefault((m.namespace, float(m.ttl_s)), []).append(m)
    for (namespace, ttl), group in groups.items():
        vectors = memory.vectors([m.id for m in group])
        kept = [(m, v) for m, v in zip(group, vectors) if v is not None]  # deleted meanwhile: nothing to refresh
        if not kept:
            continue
        ids = memory.add([m.text for m, _ in kept], vectors=np.stack([v for _, v in kept]), namespace=namespace,
                         ids=[m.id for m, _ in kept], session=[m.session for m, _ in kept],
                         role=[m.role for m, _ in kept], metadata=[m.metadata for m, _ in kept],
                         created_at=[m.created_at for m, _ in kept], ttl=ttl)
        out.update((i, m) for i, m in zip(ids, memory.get(ids)) if m is not None)
    return out


def sweep_expired(memory: "TieredMemory", candidates: set[int]) -> int:
    """Deletes the expired memories among candidates and among every memory with a time to live; each is read again
    while no other writer can write (TieredMemory.exclusive_writes), so one that another process has just refreshed
    is kept."""
    if memory.closed or memory.read_only:
        return 0
    ids = set(candidates) | {int(i) for i in memory.cold.ids_where(HAS_EXPIRY_SQL)}
    if not ids:
        return 0
    with memory.exclusive_writes():
        now_us = time.time_ns() // 1000
        rows = memory.cold.get(np.fromiter(ids, dtype=np.int64, count=len(ids)))
        expired = [int(r["id"]) for r in rows if r is not None and memory_of(r).expired(now_us)]
        if not expired:
            return 0
        return memory.delete(expired)
