"""Placement: which rows this process puts into the hot tier and takes out (the policy), what it knows the hot tier
holds (HotSet), and the rule-2 bounds over the rows that are only cold, kept valid while nothing else moved."""
from __future__ import annotations

import time
from collections import Counter
from typing import Iterable

import numpy as np

from ..namespaces import namespace_hash
from ..policies import LFU, Policy
from ..sync import NewestRows
from .bounds import BoundIndex
from .stages import compiled_stages

RESYNC_EVERY_S = 2.0  # at most this often, rebuild hot-set tracking and bounds after another process wrote
# ... and at most this share of a process's time: a resync reads every cold row and rebuilds every bound, so
# with other writers at work it would cost O(store) every 2 s per process; until the next one, rule 2 is off for
# this process and searches read the cold tier.
RESYNC_MAX_SHARE = 0.1
# ... and only once the store's writes have stood still this long: a resync read while other processes keep writing
# is out of date at their next write, before a search can use it, and each one reads the whole store.
RESYNC_QUIET_S = 0.05


def signature(hot) -> tuple:
    """The sidecar's membership counters: any change this process did not make shows here."""
    h = hot._header
    return int(h.owner_pid), int(h.upserted_rows), int(h.deleted_rows), int(h.evicted_rows), int(h.hot_rows)


class Placement:
    """The policy's side of the hot tier, per process.

    Tracking (the HotSet and the bounds) is valid while the sidecar's counters are the ones this process expects
    (its own changes added in) and the store's write count is the one it read at its last resync (its own writes
    added in): any other process's change to either tier turns rule 2 off until the next resync.
    """

    def __init__(self, dim: int, policy: Policy, cold, moves: Counter) -> None:
        self.dim = dim
        self.policy = policy
        self.cold = cold
        self.moves = moves
        self.hotset: HotSet | None = None
        self.bounds = BoundIndex(dim)
        self.expected: tuple | None = None  # signature()[:4] as this process's own changes leave it
        self.writes_seen = -1  # the store's write count the tracking knows of (-1: none)
        self.next_resync = 0.0
        self._writes_heard = (-1, 0.0)  # the store's write count last seen, and since when it has stood still
        self.tick = 0  # the policy's clock: one tick per search or write

    # ---- is the tracking current? ----
    def invalidate(self) -> None:
        """The tracking no longer describes the hot tier: rule 2 stops skipping until the next resync."""
        self.bounds.valid = False
        self.expected = None

    def tracking_ok(self, hot, writes_now: int, backlog: bool) -> bool:
        """True while the hot set and bounds still describe the hot tier exactly, and no other process has written
        to the cold tier since they were read."""
        if not self.bounds.valid or self.expected is None or self.hotset is None or backlog:
            return False
        if writes_now != self.writes_seen:
            self.bounds.valid = False
            return False
        sig = signature(hot)
        if sig[:4] != self.expected or sig[4] != len(self.hotset):
            self.bounds.valid = False
            return False
        return True

    def note_own_write(self, bump) -> None:
        """After this process's write: the tracking stays valid only if no other write came between."""
        if self.writes_seen == bump.writes_before:
            self.writes_seen = bump.writes_before + 1
        else:
            self.invalidate()

    def counts_agree(self, hot, namespace: str | None) -> bool:
        """Rule 2 needs every row that is not hot to be covered: hot rows + cold-only rows we cover must equal the
        published total (catches another process's add in flight or a cold-only delete)."""
        if namespace is None:
            return int(signature(hot)[4]) + self.bounds.cold_only_count() == self.cold.count()
        hot_rows, total_rows = hot.namespace_rows(namespace_hash(namespace))
        return total_rows > 0 and hot_rows + self.bounds.cold_only_count(namespace) == total_rows

    def cold_bound(self, q: np.ndarray, namespace: str | None, scoring, now_us: int) -> float:
        """The best score a cold-only row of the scope could reach (with the scoring's best bonus)."""
        if scoring is None:
            return self.bounds.bound(q, namespace)
        bound = self.bounds.bound(q, namespace, lambda newest: scoring.recency_bonus(newest, now_us))
        return bound + scoring.max_boost

    # ---- resync: read the hot membership and rebuild every bound ----
    def resync_due(self, writes_now: int) -> bool:
        """True when a resync may run: its pacing allows it, and the store's write count has not moved for
        RESYNC_QUIET_S (as far as the calls here have seen it)."""
        now = time.monotonic()
        if writes_now != self._writes_heard[0]:
            self._writes_heard = (writes_now, now)
        return now >= self.next_resync and now - self._writes_heard[1] >= RESYNC_QUIET_S

    def resync(self, hot, *, write_lock, rewarm, cache) -> None:
        """At most every RESYNC_EVERY_S (and RESYNC_MAX_SHARE of the time; resync_due says when): re-reads which
        rows the hot tier holds (CONTAINS over every cold id) and rebuilds every bound. rewarm(hot) clears and
        refills a hot tier found to hold rows the cold tier does not; cache drops memories whose rows are gone."""
        started = time.monotonic()
        self.next_resync = started + RESYNC_EVERY_S
        try:
            self._resync_now(hot, write_lock, rewarm, cache)
        finally:
            took = time.monotonic() - started
            self.next_resync = started + max(RESYNC_EVERY_S, took / RESYNC_MAX_SHARE)

    def _resync_now(self, hot, write_lock, rewarm, cache) -> None:
        self.moves["resyncs"] += 1
        self.writes_seen = self.cold.generations.writes()  # before the cold tier is read: later writes show
        self.bounds.clear()
        if self.hotset is None or self.hotset.capacity != hot.capacity:
            self.hotset = HotSet(self.dim, hot.capacity)
        else:
            self.hotset.clear()
        before, rows, present, after = self._hot_membership(hot)
        if before == after and int(present.sum()) != after[4]:
            # The hot tier holds rows the cold tier does not: start it afresh. Only a mismatch read while the hot
            # tier's counters stood still says so; one read while another process writes (its add lands between
            # our cold read and CONTAINS) or warms (its own clear-and-refill) does not: taking those for foreign
            # rows cleared and refilled the whole tier, which other processes then read half-filled and cleared
            # again. Confirmed under the write lock (no add, delete or promotion meanwhile) before the clear.
            with write_lock.held():
                before, rows, present, after = self._hot_membership(hot)
                if before == after and int(present.sum()) != after[4]:
                    self.moves["rewarms"] += 1
                    rewarm(hot)
                    before, rows, present, after = self._hot_membership(hot)
        cache.keep_only(rows["ids"])
        self.policy.set_sizes(dict(Counter(rows["namespace"])), replace=True)
        self._track(rows, present)
        if before == after and after[4] == len(self.hotset):
            self.expected = after[:4]
            self.bounds.valid = True
        else:
            self.invalidate()  # someone wrote meanwhile: try again later
        self.load_pins(hot)

    def _hot_membership(self, hot) -> tuple[tuple, dict, np.ndarray, tuple]:
        """(signature before, every cold row, which of them the hot tier holds, signature after): the read is a
        consistent view of the hot tier only when the two signatures are equal."""
        before = signature(hot)
        rows = self.cold.recent(max(1, self.cold.count()))
        ids = rows["ids"]
        present = hot.contains(ids) if len(ids) else np.zeros(0, dtype=bool)
        return before, rows, present, signature(hot)

    def _track(self, rows: dict, present: np.ndarray) -> None:
        """The hot set from the rows present, and one bound per namespace over the others."""
        ids, namespaces, created = rows["ids"], rows["namespace"], rows["created_at_us"]
        hot_at = np.flatnonzero(present)
        if hot_at.size > self.hotset.capacity:
            self.invalidate()  # more rows than the tier holds: the read was torn; try again later
            hot_at = hot_at[: self.hotset.capacity]
        self.hotset.fill(ids[hot_at], [namespaces[j] for j in hot_at.tolist()], rows["vectors"][hot_at],
                         created[hot_at], self.tick)
        cold_only: dict[str, list[int]] = {}
        for j in np.flatnonzero(~present).tolist():
            cold_only.setdefault(namespaces[j], []).append(j)
        for ns, idx in cold_only.items():
            sel = np.asarray(idx, dtype=np.int64)
            self.bounds.get(ns).rebuild(ids[sel], rows["vectors"][sel], created[sel])
            self.bounds.where.update((int(i), ns) for i in ids[sel])

    def rebuild_bound(self, namespace: str) -> None:
        """Tightens one namespace's cones over exactly its cold-only rows (read from the cold tier)."""
        nb = self.bounds.by_namespace.get(namespace)
        if nb is None or self.hotset is None:
            return
        rows = self.cold.recent(max(1, self.cold.count(namespace)), namespace=namespace)
        keep = np.array([int(i) not in self.hotset for i in rows["ids"]], dtype=bool)
        if len(keep):
            self.bounds.reset_ids(namespace, rows["ids"][keep])
            nb.rebuild(rows["ids"][keep], rows["vectors"][keep], rows["created_at_us"][keep])
        else:
            self.bounds.reset_ids(namespace, [])
            nb.rebuild([], np.empty((0, self.dim), np.float32), [])
        self.moves["bound_rebuilds"] += 1

    # ---- moving rows in and out ----
    def fold_cold(self, namespace: str, ids, vectors, created_us) -> None:
        """Rows that are (now) only in the cold tier join their namespace's bound."""
        if len(ids):
            self.bounds.add(namespace, ids, vectors, created_us)

    def hot_delete(self, hot, ids: list[int]) -> None:
        """Deletes rows from the hot tier (policy victims, stale copies), folding the tracked ones into the bounds."""
        if not ids:
            return
        tracked = 0
        by_ns: dict[str, tuple[list, list, list]] = {}
        for i in ids:
            got = self.hotset.remove(i) if self.hotset is not None else None
            if got is not None:
                tracked += 1
                ns, vec, created = got
                bucket = by_ns.setdefault(ns, ([], [], []))
                bucket[0].append(i)
                bucket[1].append(vec)
                bucket[2].append(created)
        for ns, (bid, bvec, bcr) in by_ns.items():
            self.fold_cold(ns, bid, np.stack(bvec), bcr)
        deleted = hot.delete(np.asarray(ids, dtype=np.int64))
        if self.expected is not None:
            pid, up, de, ev = self.expected
            self.expected = (pid, up, de + deleted, ev)
        if deleted != tracked:
            self.invalidate()

    def apply(self, hot, removed: list[int], newest: NewestRows | None, namespaces: set[str] | None) -> None:
        """The hot side of a batch of logged writes (sync.HotSide, for the group commit): the totals of the namespaces
        touched (None: every namespace) read, removed ids deleted, the totals published, the newest rows placed."""
        totals = self.cold.namespace_counts() if namespaces is None else self.cold.counts(namespaces)
        self.policy.set_sizes(totals)
        if removed:
            self.hot_delete(hot, removed)
            self.bounds.discard(removed)
        publish_totals(hot, totals)
        if newest is not None:
            self.place(hot, newest.ids, newest.vectors, newest.namespaces, newest.created_at_us)

    def place(self, hot, ids: np.ndarray, vecs: np.ndarray, namespaces: list[str], created: np.ndarray, *,
              promoted: bool = False) -> None:
        """Puts rows into the hot tier under the policy: the policy's victims leave first (into the bounds), so the
        sidecar never evicts by itself; rows that find no room stay cold-only, and any older hot copy of them is
        removed (any process may have placed it)."""
        hs = self.hotset
        if hs is None:
            return
        place = self._admitted(ids, namespaces)
        self.hot_delete(hot, self._victims(ids, namespaces, place))
        self.bounds.discard(int(i) for i in ids)  # rows that stay cold-only are folded in again below
        unplaced = np.flatnonzero(~place)
        if unplaced.size:
            self.hot_delete(hot, [int(ids[j]) for j in unplaced])
        for j in unplaced:
            self.fold_cold(namespaces[j], [int(ids[j])], vecs[j:j + 1], [int(created[j])])
        sel = np.flatnonzero(place)
        if sel.size:
            self._upsert(hot, ids[sel], vecs[sel], [namespaces[j] for j in sel], created[sel], promoted)

    def _admitted(self, ids: np.ndarray, namespaces: list[str]) -> np.ndarray:
        """Which rows of a batch the policy lets in: a per-namespace window keeps a batch's newest rows, an
        admitting policy may keep new rows out, and never more than the whole tier."""
        hs, n = self.hotset, len(ids)
        place = np.ones(n, dtype=bool)
        cap = self.policy.per_namespace_cap()
        if cap is not None:
            seen: dict[str, int] = {}
            for j in range(n - 1, -1, -1):  # the newest rows of a batch win the window
                seen[namespaces[j]] = seen.get(namespaces[j], 0) + 1
                if seen[namespaces[j]] > cap:
                    place[j] = False
        if self.policy.admission:  # the policy may keep new rows out rather than displace better ones
            new_by_ns: dict[str, list[int]] = {}
            for j in np.flatnonzero(place):
                if int(ids[j]) not in hs and not self.policy.is_pinned(int(ids[j]), namespaces[j]):
                    new_by_ns.setdefault(namespaces[j], []).append(int(j))
            for ns, js in new_by_ns.items():
                ok = self.policy.admit(hs, ns, len(js), self.tick)
                for j in js[: len(js) - ok]:  # the oldest rows of the batch stay cold
                    place[j] = False
        if place.sum() > hs.capacity:
            place[np.flatnonzero(place)[: int(place.sum()) - hs.capacity]] = False
        return place

    def _victims(self, ids: np.ndarray, namespaces: list[str], place: np.ndarray) -> list[int]:
        """The hot rows the policy evicts to make room for the placed rows (a per-namespace window's overflow
        first); where pinned rows fill the tier, the oldest placed rows of the batch are left out instead."""
        hs = self.hotset
        cap = self.policy.per_namespace_cap()
        batch_ids = {int(i) for i in ids}
        victims: list[int] = []
        if cap is not None:
            new_per_ns: dict[str, int] = {}
            for j in np.flatnonzero(place):
                if int(ids[j]) not in hs:
                    new_per_ns[namespaces[j]] = new_per_ns.get(namespaces[j], 0) + 1
            for ns, m in new_per_ns.items():
                over = hs.per_namespace.get(ns, 0) + m - cap
                victims += hs.victims(self.policy, over, self.tick, exclude=batch_ids, namespace=ns)
        new = sum(1 for j in np.flatnonzero(place) if int(ids[j]) not in hs)
        need = len(hs) - len(victims) + new - hs.capacity
        if need > 0:
            more = hs.victims(self.policy, need + len(victims), self.tick, exclude=batch_ids | set(victims))
            victims += more[:need]
        shortfall = len(hs) - len(victims) + new - hs.capacity
        if shortfall > 0:  # pinned rows fill the tier: the oldest rows of this batch stay cold
            for j in np.flatnonzero(place):
                if shortfall <= 0:
                    break
                if int(ids[j]) not in hs:
                    place[j] = False
                    shortfall -= 1
        self.moves["evicted"] += len(victims)
        return victims

    def _upsert(self, hot, ids: np.ndarray, vecs: np.ndarray, namespaces: list[str], created: np.ndarray,
                promoted: bool) -> None:
        hs = self.hotset
        half_life = self.policy.half_life if isinstance(self.policy, LFU) else None
        hashes = np.array([namespace_hash(ns) for ns in namespaces], dtype=np.uint64)
        evicted = hot.upsert(ids, vecs, hashes, created_at_us=created)
        if self.expected is not None:
            pid, up, de, ev = self.expected
            self.expected = (pid, up + int(ids.size), de, ev + len(evicted))
        for j in range(ids.size):
            hs.put(int(ids[j]), namespaces[j], vecs[j], int(created[j]), self.tick, half_life)
        self.moves["promoted" if promoted else "inserted"] += int(ids.size)
        if len(evicted):  # only when another process filled the tier: fold what we know, then resync
            self.moves["sidecar_evicted"] += len(evicted)
            untracked = False
            for i in evicted.tolist():
                got = hs.remove(i)
                if got is None:
                    untracked = True
                    continue
                self.fold_cold(got[0], [i], got[1][None, :], [got[2]])
            if untracked:
                self.invalidate()

    def use(self, hot_hit_ids) -> None:
        """Search hits served by the hot tier count as uses."""
        if self.hotset is not None:
            half_life = self.policy.half_life if isinstance(self.policy, LFU) else None
            self.hotset.use(hot_hit_ids, self.tick, half_life)

    def not_hot(self, ids: list[int]) -> list[int]:
        """Of a search's cold hits, those this process's tracking does not place in the hot tier (all of them while
        nothing is tracked); the others count as uses, as hot hits do."""
        hs = self.hotset
        if hs is None:
            return list(ids)
        self.use(i for i in ids if i in hs)
        return [i for i in ids if i not in hs]

    def namespace_to_load(self, namespace: str) -> bool:
        """True when promote_namespace has rows to load: the namespace fits the hot tier and the tracking does not
        place all of it there yet."""
        hs = self.hotset
        total = self.cold.count(namespace)
        return hs is not None and 0 < total <= hs.capacity and hs.per_namespace.get(namespace, 0) < total

    def promote(self, hot, ids: list[int]) -> None:
        """Cold hits move into the hot tier (the policy makes room). Under the store's write lock."""
        rows = self.cold.vectors_of(ids)
        if len(rows["ids"]):
            self.place(hot, rows["ids"], rows["vectors"], rows["namespace"], rows["created_at_us"], promoted=True)

    def promote_namespace(self, hot, namespace: str) -> None:
        """Loads every row of a namespace the policy keeps whole into the hot tier (when it fits). Under the lock."""
        if not self.namespace_to_load(namespace):
            return
        hs, total = self.hotset, self.cold.count(namespace)
        rows = self.cold.recent(total, namespace=namespace)
        keep = np.array([int(i) not in hs for i in rows["ids"]], dtype=bool)
        if not keep.any():
            return
        ids, vecs, created = rows["ids"][keep], rows["vectors"][keep], rows["created_at_us"][keep]
        order = np.lexsort((ids, created))  # oldest first: a batch's newest rows win any shortfall
        self.place(hot, ids[order], vecs[order], [namespace] * len(order), created[order], promoted=True)

    def load_pins(self, hot) -> None:
        """Brings pinned namespaces and ids into the hot tier."""
        pol = self.policy
        want: list[dict] = []
        for ns in sorted(pol.pinned_namespaces):
            if self.cold.count(ns):
                rows = self.cold.recent(self.cold.count(ns), namespace=ns)
                want += [{"id": int(i), "vector": v, "namespace": ns, "created_at_us": int(c)}
                         for i, v, c in zip(rows["ids"], rows["vectors"], rows["created_at_us"])]
        if pol.pinned_ids:
            want += [r for r in self.cold.get(sorted(pol.pinned_ids)) if r is not None]
        want = [r for r in want if self.hotset is not None and r["id"] not in self.hotset]
        if want:
            self.place(hot, np.array([r["id"] for r in want], dtype=np.int64), np.stack([r["vector"] for r in want]),
                       [r["namespace"] for r in want], np.array([r["created_at_us"] for r in want], dtype=np.int64),
                       promoted=True)


def publish_totals(hot, counts: dict[str, int]) -> None:
    """Tells every process the total rows (both tiers) of namespaces."""
    hot.set_namespace_totals({namespace_hash(ns): n for ns, n in counts.items()})


class HotSet:
    """What this process knows the hot tier holds: per row its namespace, created_at, use
    statistics and a host copy of its vector (needed to fold an evicted row into the bounds)."""

    def __init__(self, dim: int, capacity: int) -> None:
        self.dim = dim
        self.capacity = capacity
        self.slot: dict[int, int] = {}
        self.free: list[int] = list(range(capacity - 1, -1, -1))
        self.ids = np.full(capacity, -1, dtype=np.int64)
        self.namespace: list[str | None] = [None] * capacity
        self.created_us = np.zeros(capacity, dtype=np.int64)
        self.last_use = np.zeros(capacity, dtype=np.int64)
        self.freq = np.zeros(capacity, dtype=np.float64)
        self.freq_at = np.zeros(capacity, dtype=np.int64)
        self.vectors = np.zeros((capacity, dim), dtype=np.float32)
        self.per_namespace: dict[str, int] = {}
        loops = compiled_stages()
        self._count_uses = None if loops is None else loops.count_uses

    def __len__(self) -> int:
        return len(self.slot)

    def __contains__(self, row_id: int) -> bool:
        return int(row_id) in self.slot

    def clear(self) -> None:
        """Forgets every row (the same dim and capacity)."""
        self.__init__(self.dim, self.capacity)

    def put(self, row_id: int, namespace: str, vector: np.ndarray, created_us: int, now: int,
            half_life: float | None = None) -> None:
        """Tracks a row placed in the hot tier (an insert counts as one use)."""
        row_id = int(row_id)
        s = self.slot.get(row_id)
        if s is None:
            s = self.free.pop()
            self.slot[row_id] = s
            self.freq[s] = 0.0
            self.freq_at[s] = now
        else:
            self._count(self.namespace[s], -1)
        self.ids[s] = row_id
        self.namespace[s] = namespace
        self._count(namespace, +1)
        self.vectors[s] = vector
        self.created_us[s] = created_us
        self.use_slot(s, now, 1.0, half_life)

    def fill(self, ids: np.ndarray, namespaces: list[str], vectors: np.ndarray, created_us: np.ndarray,
             now: int) -> None:
        """Tracks rows placed in the hot tier, into an empty table: the same state as put() of each row in
        order (distinct ids, one use each), in array operations (a resync fills ~10k rows: put() one by one
        was ~90 % of its time)."""
        m = int(len(ids))
        if self.slot or m > self.capacity:
            raise ValueError("HotSet.fill needs an empty table and at most capacity rows")
        if m == 0:
            return
        ids = np.asarray(ids, dtype=np.int64)
        self.slot = dict(zip(ids.tolist(), range(m)))
        if len(self.slot) != m:
            self.slot = {}
            raise ValueError("HotSet.fill needs distinct ids")
        self.free = list(range(self.capacity - 1, m - 1, -1))  # every slot was free; rows take 0 .. m-1
        self.ids[:m] = ids
        self.namespace[:m] = list(namespaces)
        self.vectors[:m] = vectors
        self.created_us[:m] = np.asarray(created_us, dtype=np.int64)
        self.freq[:m] = 1.0  # put(): 0, then one use of weight 1 (decay of 0 is 0)
        self.freq_at[:m] = now
        self.last_use[:m] = now
        for ns, n in Counter(namespaces).items():
            self.per_namespace[ns] = n

    def _count(self, namespace: str, delta: int) -> None:
        n = self.per_namespace.get(namespace, 0) + delta
        if n:
            self.per_namespace[namespace] = n
        else:
            self.per_namespace.pop(namespace, None)

    def use_slot(self, s: int, now: int, weight: float = 1.0, half_life: float | None = None) -> None:
        """Counts a use of slot s at tick now: adds weight to its frequency (aged first when half_life is given) and
        sets its last use."""
        if half_life is not None:
            self.freq[s] = self.freq[s] * np.exp2(-(now - self.freq_at[s]) / half_life) + weight
        else:
            self.freq[s] += weight
        self.freq_at[s] = now
        self.last_use[s] = now

    def use(self, ids: Iterable[int], now: int, half_life: float | None = None) -> None:
        """Counts one use of each tracked row of distinct ids (ids not tracked are ignored): use_slot() of each, in
        array operations (a search counts its hits' uses). Without a half-life, the compiled loop counts a list of
        Python ints: the same counts, without a numpy call per column on the answer's path."""
        if half_life is None and self._count_uses is not None:
            if type(ids) is not list:
                ids = list(ids)
            if self._count_uses(self.slot, ids, self.freq, self.freq_at, self.last_use, now) is None:
                return
        get = self.slot.get
        slots = np.array([s for i in ids if (s := get(int(i))) is not None], dtype=np.intp)
        if not slots.size:
            return
        if half_life is not None:
            self.freq[slots] = self.freq[slots] * np.exp2(-(now - self.freq_at[slots]) / half_life) + 1.0
        else:
            self.freq[slots] += 1.0
        self.freq_at[slots] = now
        self.last_use[slots] = now

    def remove(self, row_id: int) -> tuple[str, np.ndarray, int] | None:
        """Forgets a row; returns (namespace, vector copy, created_us) or None when it was not tracked."""
        s = self.slot.pop(int(row_id), None)
        if s is None:
            return None
        ns = self.namespace[s]
        self._count(ns, -1)
        out = (ns, self.vectors[s].copy(), int(self.created_us[s]))
        self.ids[s] = -1
        self.namespace[s] = None
        self.free.append(s)
        return out

    def live_slots(self, namespace: str | None = None) -> np.ndarray:
        """Slots of the tracked rows, (n,) int64; only those of namespace when given."""
        slots = np.fromiter(self.slot.values(), dtype=np.int64, count=len(self.slot))
        if namespace is not None:
            slots = slots[[self.namespace[s] == namespace for s in slots]] if slots.size else slots
        return slots

    def victims(self, policy: Policy, n: int, now: int, *, exclude: set[int] = frozenset(),
                namespace: str | None = None) -> list[int]:
        """The n rows the policy evicts first (never pinned ones, nor ids in exclude); fewer when not enough."""
        if n <= 0:
            return []
        slots = self.live_slots(namespace)
        if slots.size == 0:
            return []
        # the same test as policy.is_pinned() and exclude per row, in array operations: this runs on every add
        # that evicts, inside the store's write lock, over every slot of a full tier (20k: ~10 % of a soak
        # worker's time as a Python loop)
        blocked = set(exclude) | policy.pinned_ids
        keep = np.ones(slots.size, dtype=bool)
        if blocked:
            keep &= ~np.isin(self.ids[slots], np.fromiter(blocked, dtype=np.int64, count=len(blocked)))
        if policy.pinned_namespaces:
            keep &= np.fromiter((self.namespace[s] not in policy.pinned_namespaces for s in slots.tolist()),
                                dtype=bool, count=slots.size)
        slots = slots[keep]
        if slots.size == 0:
            return []
        pr = policy.priority(self, slots, now)
        if n < slots.size:
            part = np.argpartition(pr, n - 1)[:n]
            order = part[np.argsort(pr[part], kind="stable")]
        else:
            order = np.argsort(pr, kind="stable")
        return [int(self.ids[s]) for s in slots[order]]
