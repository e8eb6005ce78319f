"""The coordinator's link to the store's sidecar: attach or start it, warm it, certify it, repair it after writes
that left it behind, hand it what was written while it was away, and report what could not be had."""
from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import time
from collections import Counter
from pathlib import Path

import numpy as np

from ..errors import InvalidInput, SidecarUnavailable, TieredRecallError
from ..namespaces import namespace_hash
from ..spelling import option_set
from ..hot import HotTier, sidecar_args, sidecar_executable, start_sidecar
from ..sync import HotCertificates, LoggedWrites, StoreWriteLock, exclusive, repair, slot_of
from .placement import Placement, publish_totals

logger = logging.getLogger("tiered_recall")

RECONNECT_BACKOFF_S = 1.0
# A repair of stale hot rows reads the cold rows of the namespaces it covers; while writes keep coming it cannot
# certify them, so it takes at most this share of the process's time, like a resync.
REPAIR_MAX_SHARE = 0.1
SIDECAR_LOCK_FILE = ".sidecar.lock"
# How long a logged write looks for its hot-tier side to be applied by another holder of the store's write lock, or
# for the lock to be free, before it leaves that side to others or queues for the lock.
PUBLISH_WAIT_S = 0.002
# It leaves its side to the lock's holder, the next writer or the next search of its slots (which stay stale until
# then) while at most this many bytes of the log wait to be applied: a search that applies them is held up for a
# few records, not a burst's worth. Past that it queues.
DEFERRED_LOG_BYTES = 64 * 1024
# How long a search whose scope waits for logged writes looks for the lock's holder to apply them (or for the lock)
# before it reads the cold tier instead: the cold path costs more than this, in time and in the promotions after it.
CATCH_UP_WAIT_S = 0.002
# How often both look meanwhile.
HOLDER_POLL_S = 0.0002
# A text search keeps the sidecar polling while it embeds its query only on a machine of at least this many cores:
# on 2 cores the polling sidecar competed with the embedder and the application (p99 up, p50 no better), while on a
# GPU machine a sleeping CUDA sidecar also stops its persistent kernel, which the search then waits to start again.
EXPECT_MIN_CORES = 4
_CORES = os.cpu_count() or 1


def sidecar_name_of(path: str | os.PathLike) -> str:
    """The segment name of the sidecar every process opening the store at `path` shares."""
    digest = hashlib.blake2b(str(Path(path).expanduser().resolve()).encode(), digest_size=8).hexdigest()
    return f"store-{os.getuid()}-{digest}"


def gpu_visible() -> bool:
    """True when nvidia-smi lists a GPU."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def cuda_compiled() -> bool:
    """True when the installed sidecar was built with the CUDA backend (it says so with --backends)."""
    try:
        out = subprocess.run([str(sidecar_executable()), "--backends"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError, TieredRecallError):
        return False
    return "cuda" in out.stdout.split()


def require_cuda(option: str) -> None:
    """device='cuda' asked explicitly: an error, not a quiet CPU tier, when it cannot be had."""
    if not cuda_compiled():
        why = "this installation was built without the CUDA backend (no nvcc at install time)"
    elif not gpu_visible():
        why = "no GPU is visible (nvidia-smi sees none)"
    else:
        return
    raise InvalidInput(f"{option_set(option, 'cuda')} but {why}: use {option_set(option, 'auto')} to fall back to "
                       f"the CPU hot tier, or {option_set(option, 'cpu')}")


def serve_command(name: str, **options) -> list[str]:
    """The command line of a sidecar run in the foreground under its own name (tiered-recall serve)."""
    return sidecar_args(name, verbose=True, **options)


def backend_for(device: str) -> str:
    """The sidecar backend for a device: "auto" is "cuda" when it was built and a GPU is visible, else "cpu";
    any other device is its own backend."""
    if device != "auto":
        return device
    return "cuda" if cuda_compiled() and gpu_visible() else "cpu"


class HotLink:
    """One process's attachment to the store's sidecar, and the certificates that say what of it to trust.

    `ensure()` returns the attached HotTier, or None while there is none (device "none", or it could not be
    reached: then retried at most every RECONNECT_BACKOFF_S). `call(fn)` runs fn(hot) and absorbs a dead or
    refusing sidecar: the hot tier is a cache, its failure never fails a durable write.
    """

    def __init__(self, path: Path, *, dim: int, device: str, capacity: int, requested_capacity: int | None,
                 timeout_s: float, orphan_grace_s: float, cold, placement: Placement, write_lock: StoreWriteLock,
                 cache, moves: Counter, option, idle_spin_us: int | None = None, codes: str | None = None) -> None:
        self.path, self.dim, self.device = path, dim, device
        self.codes = codes  # for a sidecar this process starts ("int8", "off"); None: the sidecar's default
        self.idle_spin_us = idle_spin_us  # for a sidecar this process starts; None: the sidecar's default
        self.capacity, self.requested_capacity = capacity, requested_capacity
        self.timeout_s, self.orphan_grace_s = timeout_s, orphan_grace_s
        self.cold, self.placement, self.write_lock, self.cache, self.moves = cold, placement, write_lock, cache, moves
        self.option = option  # how the caller spells an option (API keyword or CLI flag)
        self.sidecar_name = sidecar_name_of(path)
        self.certs = HotCertificates(path, cold.generations) if device != "none" else None
        self.logged = LoggedWrites(cold, placement, self.certs) if self.certs is not None else None
        self.hot: HotTier | None = None
        self.epoch = (0, 0)  # the attached sidecar's instance, which the certificates must name
        self.error: str | None = None
        self.start_failed: str | None = None  # why the last start of a sidecar failed (not a sidecar lost in a race)
        self.warnings: list[str] = []  # what was asked of the hot tier and not had (stats()["hot_warnings"])
        self.backlog: set[int] = set()  # ids acknowledged while the hot tier was unreachable
        self.closed = False
        self._next_try = 0.0
        self._next_repair = 0.0
        self._left_until = None  # the end of the last record whose hot side this process left to others
        self._fruitless_catch_up: tuple | None = None  # _write_state() after a catch-up that left its scope stale

    def warn(self, message: str) -> None:
        """Logs a warning and keeps it for stats()["hot_warnings"], once per message."""
        if message not in self.warnings:
            self.warnings.append(message)
            logger.warning("tiered-recall: %s", message)

    # ---- attach ----
    def ensure(self) -> HotTier | None:
        """Attaches to the store's sidecar, starting (and warming) one when none serves it."""
        if self.device == "none" or self.closed:
            return None
        if self.hot is not None:
            if self.hot.serving():  # a dead sidecar shows up as SidecarUnavailable on the next call
                return self.hot
            self.drop("the sidecar stopped")
        if time.monotonic() < self._next_try:
            return None
        try:
            hot = self._attach()
        except (TieredRecallError, OSError) as exc:
            self.error = str(exc)
            self._next_try = time.monotonic() + RECONNECT_BACKOFF_S
            return None
        self.hot, self.error = hot, None
        if self.backlog:
            try:
                self.flush_backlog(hot)
            except SidecarUnavailable as exc:
                self.drop(str(exc))
                return None
        return hot

    def _attach(self) -> HotTier:
        # the write lock first (the order add() takes them in): warming publishes totals, which must not
        # interleave with another process's commit-then-publish
        with self.write_lock.held(), exclusive(self.path / SIDECAR_LOCK_FILE):
            started = False
            try:
                hot = HotTier.attach(self.sidecar_name, dim=self.dim, timeout_s=self.timeout_s)
            except SidecarUnavailable:
                try:
                    start_sidecar(self.sidecar_name, dim=self.dim, capacity=self.capacity,
                                  backend=backend_for(self.device), exit_when_orphaned_s=self.orphan_grace_s,
                                  idle_spin_us=self.idle_spin_us, codes=self.codes, detach=True)
                except SidecarUnavailable as exc:
                    self.start_failed = str(exc)
                    raise
                self.start_failed = None
                hot = HotTier.attach(self.sidecar_name, dim=self.dim, timeout_s=self.timeout_s)
                started = True
            self.epoch = hot.instance
            if not started:
                self._check_joined(hot)
            if started or hot.hot_rows == 0:
                self.warm(hot)
            elif not self.certs.epoch_matches(self.epoch):
                # a sidecar no process of this version certified (or the file was removed): check every row
                repair(hot, self.cold, self.certs, self.epoch, None)
                self.moves["repairs"] += 1
            self.placement.resync(hot, write_lock=self.write_lock, rewarm=self.rewarm, cache=self.cache)
        return hot

    def _check_joined(self, hot: HotTier) -> None:
        """A sidecar another process started serves this store: say where it differs from what was asked."""
        if self.requested_capacity is not None and hot.capacity != self.requested_capacity:
            self.warn(f"{option_set(self.option('hot_capacity'), self.requested_capacity)} was asked, but the store's running "
                      f"sidecar (pid {hot.owner_pid}) holds {hot.capacity} rows; it keeps its size until every "
                      "process has closed the store")
        if self.codes is not None and hot.codes != self.codes:
            self.warn(f"{self.option('codes')}={self.codes!r} was asked, but the store's running sidecar (pid "
                      f"{hot.owner_pid}) keeps codes {hot.codes!r}; it keeps them until every process has closed the "
                      "store")
        if self.device in ("cpu", "cuda") and hot.backend != self.device:
            self.warn(f"{option_set(self.option('device'), self.device)} was asked, but the store's running sidecar (pid "
                      f"{hot.owner_pid}) serves from the {hot.backend}; it keeps it until every process has closed "
                      "the store")

    def retry_soon(self) -> None:
        """The next ensure() tries to attach at once, not after the reconnect backoff."""
        self._next_try = 0.0

    def expect(self, seconds: float) -> None:
        """A search request follows within `seconds` (its query is being embedded): the sidecar, if one is
        attached and the machine has EXPECT_MIN_CORES, stays awake for it (HotTier.expect). A sidecar found gone is
        left to the search to find."""
        hot = self.hot
        if hot is not None and _CORES >= EXPECT_MIN_CORES:
            try:
                hot.expect(seconds)
            except SidecarUnavailable:
                pass

    def drop(self, reason: str) -> None:
        """Detaches from the sidecar, keeping `reason` as the error; the placement's tracking is no longer trusted,
        and the next ensure() tries to attach again."""
        if self.hot is not None:
            try:
                self.hot.close()
            except Exception:
                pass
        self.hot = None
        self.error = reason
        self._next_try = 0.0
        self.placement.invalidate()

    def call(self, fn):
        """Runs fn(hot); on a dead or stuck sidecar, drops it (the next call reconnects) and returns None."""
        hot = self.ensure()
        if hot is None:
            return None
        try:
            return fn(hot)
        except SidecarUnavailable as exc:
            self.drop(str(exc))
            self._next_try = time.monotonic() + RECONNECT_BACKOFF_S
            return None
        except TieredRecallError as exc:  # the hot tier is a cache: its failure never fails a durable write
            self.error = str(exc)
            self.placement.invalidate()  # a half-done placement: trust nothing until the next resync
            return None

    # ---- fill and certify ----
    def warm(self, hot: HotTier) -> None:
        """Fills a fresh hot tier and publishes totals: the namespaces the policy keeps whole first
        (Policy.warm_namespaces), then the most recent rows of the cold tier while there is room; then certifies
        it at the write generations read (with the log's position) before the cold tier was; what was logged since
        is applied by the next holder of the lock (sync/group_commit.py). Under the write lock: a total read here
        and published after another process's add would be stale."""
        with self.write_lock.held():
            self.certs.invalidate()
            position, snap = self.cold.log_snapshot()
            self._fill(hot)
            if self.certs.certify_all(snap, self.epoch, consistent=position is not None):
                # what was logged while the fill read is applied by the next holder of the lock, in order
                self.certs.set_applied(position)

    def rewarm(self, hot: HotTier) -> None:
        """Clears a hot tier that holds rows the cold tier does not, and fills it again."""
        self.certs.invalidate()
        hot.clear()
        self.warm(hot)

    def _fill(self, hot: HotTier) -> None:
        policy, cold = self.placement.policy, self.cold
        policy.set_sizes(cold.namespace_counts(), replace=True)
        whole = policy.warm_namespaces(self.placement.tick, hot.capacity)
        if whole:
            every = cold.recent(max(1, cold.count()))  # newest first
            in_whole = np.array([ns in whole for ns in every["namespace"]], dtype=bool)
            pick = np.concatenate([np.flatnonzero(in_whole), np.flatnonzero(~in_whole)])[: hot.capacity]
            pick = np.sort(pick)  # back to newest first
            recent = {"ids": every["ids"][pick], "vectors": every["vectors"][pick],
                      "namespace": [every["namespace"][j] for j in pick],
                      "created_at_us": every["created_at_us"][pick]}
        else:
            recent = cold.recent(hot.capacity)
        ids = recent["ids"]
        if len(ids):
            order = np.arange(len(ids))[::-1]  # oldest first, so the newest end most recently used
            hashes = np.array([namespace_hash(ns) for ns in recent["namespace"]], dtype=np.uint64)
            hot.upsert(ids[order], recent["vectors"][order], hashes[order],
                       created_at_us=recent["created_at_us"][order])
        publish_totals(hot, cold.namespace_counts())  # read again: the newest totals win

    # ---- what a search may trust ----
    def token(self, ns_hash: int | None):
        """The certificate of the scope (a namespace's slot, or every namespace), read before the hot answer."""
        return self.certs.check(None if ns_hash is None else slot_of(ns_hash), self.epoch)

    def still(self, token) -> bool:
        """True while no write began since `token` was taken (read after the hot answer and its counts)."""
        return self.certs.still(token)

    def certified(self) -> bool:
        """True when a sidecar is attached and certified for the whole store (a search over every namespace)."""
        return self.hot is not None and self.certs.check(None, self.epoch) is not None

    def repair(self, namespace: str | None) -> None:
        """On the cold path of a search that found its slot stale (another process wrote to the cold tier without
        this hot tier, or a write's hot side failed): brings the hot rows of the slot's namespaces (all of them, for
        a search over every namespace) back in line with the cold tier and certifies them (certificates.repair).
        Skipped while a writer holds the lock, like a promotion, and while the slot is stale only for writes in
        flight (_stale_only_in_flight); paced to REPAIR_MAX_SHARE of the time."""
        hot = self.hot
        if hot is None or time.monotonic() < self._next_repair:
            return
        slot = None if namespace is None else slot_of(namespace_hash(namespace))
        with self.write_lock.held(wait=False) as got:
            if not got or self._stale_only_in_flight(slot):
                return  # a writer is at work, or the slot waits only for writes that their writers apply
            started = time.monotonic()
            try:
                repair(hot, self.cold, self.certs, self.epoch, slot)
            except SidecarUnavailable as exc:
                self.drop(str(exc))
            except TieredRecallError as exc:
                self.error = str(exc)
            finally:
                self.moves["repairs"] += 1
                self.placement.invalidate()  # the repair moved rows under this process's hot set: resync first
                self._next_repair = started + (time.monotonic() - started) / REPAIR_MAX_SHARE

    def _stale_only_in_flight(self, slot: int | None) -> bool:
        """Under the write lock, before a repair: applies what was logged, and tells whether the slot (None: every
        namespace) is current, or stale only for writes still in flight: logged after the ones just applied, or
        bumped after a snapshot of the counters taken with the log's end (their records were not yet in the log).
        Their writers apply them; a repair would read the whole scope under the lock for nothing."""
        if self.certs.check(slot, self.epoch) is not None:
            return True
        if self.logged is None:
            return False
        if self.call(lambda h: self.logged.apply(h, self.epoch)) is None:
            return True  # the sidecar is gone: nothing to repair
        if self.logged.more_logged() or self.certs.check(slot, self.epoch) is not None:
            return True
        _, snap = self.cold.log_snapshot()  # every bump it counts has its record in the log
        if snap is None or self.call(lambda h: self.logged.apply(h, self.epoch)) is None:
            return snap is not None
        return self.certs.current_at(slot, snap, self.epoch)

    # ---- the hot side of writes (group commit: sync/group_commit.py) ----
    def publish(self, bump, own_side=None) -> bool:
        """After a write to the cold tier: gives the hot tier its side of it and of every write logged before it
        (any process's), or leaves it to others. False only when the hot tier could not be reached (the caller
        keeps its rows for later).

        A logged write applies the log when the store's write lock is free. While another process holds it, this
        looks for PUBLISH_WAIT_S whether that holder (or a later one) applied its record, or let the lock go; then,
        while little is waiting to be applied (DEFERRED_LOG_BYTES), it returns and leaves its record to the lock's
        holder, the next writer or the next search of its slots, and otherwise it queues for the lock (the holder
        may be a repair or a promotion, which applies nothing). Its slots stay stale until its record is applied,
        so nothing is answered without it meanwhile. On a crowded machine (HotTier.crowded) it leaves its record at
        once, lock free or not, while little is waiting, and with much waiting applies the log only if the lock is
        free, else leaves its record to the holder (which applies the records that arrive while it applies) or the
        next writer: each block there (a nap, the lock, the sidecar's reply) costs a wait for a core, and writers that
        queue behind one holder each pay one. A write that bypassed the log holds the lock already (it keeps its
        place in the log's order), and own_side(hot) does its side where its note is reached."""
        if self.hot is not None:
            self.hot.note_work()  # a write counts as work on the store, whether or not it asks the sidecar
        if bump is None:
            return True  # nothing was written
        if self.logged is None:
            return False
        if bump.record_end is not None:
            crowded = self._crowded()
            deadline = time.monotonic() + (0.0 if crowded else PUBLISH_WAIT_S)
            while not self.logged.covers(bump.record_end):
                late = time.monotonic() >= deadline
                leave = late and self.logged.waiting_bytes(bump.record_end) <= DEFERRED_LOG_BYTES
                if leave and crowded:
                    return self._leave_to_others(bump)
                # late, with much waiting: queue for the lock (crowded: only take it when free); late, with little:
                # one more look, then leave it
                with self.write_lock.held(wait=late and not leave and not crowded) as got:
                    if got:
                        return self.logged.covers(bump.record_end) or \
                            self.call(lambda hot: self.logged.apply_with_latecomers(hot, self.epoch)) is not None
                if leave or crowded:
                    return self._leave_to_others(bump)
                time.sleep(HOLDER_POLL_S)
            return True
        if bump.note_at is not None and own_side is not None:
            with self.write_lock.held():
                done = self.call(lambda hot: self.logged.apply(hot, self.epoch, own_note=bump.note_at,
                                                               own_side=lambda: own_side(hot)))
                return bool(done)
        return False  # no record carries it: its rows reach the hot tier through the backlog

    def _leave_to_others(self, bump) -> bool:
        """Leaves a logged write's hot side to the lock's holder, the next writer or the next search of its slots
        (publish); its slots stay stale until then."""
        self.logged.left_to_others += 1
        self._left_until = max(self._left_until or tuple(bump.record_end), tuple(bump.record_end))
        return True

    def _crowded(self) -> bool:
        """More client processes at work than cores (HotTier.crowded): every block (a nap, a lock, the sidecar's
        reply) then costs a wait for a core, milliseconds, so a write leaves its hot side to the searches at once."""
        hot = self.hot
        return hot is not None and hot.crowded

    def catch_up(self, ns_hash: int | None):
        """On a search whose scope is stale: applies the writes logged but not yet applied, and reads the
        certificate again (a token, or None). While another process holds the store's write lock, a search of one
        namespace looks for CATCH_UP_WAIT_S whether the holder made its scope current, or let the lock go. Skipped,
        at the cost of two loads, while nothing was written or applied since a catch-up that left the scope stale
        (it needs a repair): the searches of such a slot then take no lock."""
        if self.logged is None or self.hot is None:
            return None
        if self._fruitless_catch_up == self._write_state():
            return None
        # A search over every namespace waits for no holder: with writers at work somewhere, another write is
        # nearly always in flight once the holder is done.
        deadline = time.monotonic() + (CATCH_UP_WAIT_S if ns_hash is not None else 0.0)
        while True:
            with self.write_lock.held(wait=False) as got:
                if got:
                    if self.call(lambda hot: self.logged.apply_with_latecomers(hot, self.epoch)) is None:
                        return None
                    break
            token = self.token(ns_hash)  # the holder may have applied what the scope waited for
            if token is not None or time.monotonic() >= deadline:
                return token
            time.sleep(HOLDER_POLL_S)
        token = self.token(ns_hash)
        if token is None:
            self._fruitless_catch_up = self._write_state()
        return token

    def _write_state(self) -> tuple:
        """The store's count of writes and the position applied to the hot tier: a catch-up can only help once one
        of them moved."""
        return self.cold.generations.writes(), self.certs.applied()

    def note_own_write(self, bump) -> None:
        """The placement's tracking stays valid when no other process's write came between."""
        if bump is not None:
            self.placement.note_own_write(bump)

    def flush_backlog(self, hot: HotTier) -> None:
        """Inserts rows acknowledged while the hot tier was unreachable (read back from the cold tier)."""
        if not self.backlog:
            return
        with self.write_lock.held():  # like a promotion: exact copies, in order with every write's hot side
            self._flush_backlog_locked(hot)

    def _flush_backlog_locked(self, hot: HotTier) -> None:
        backlog, self.backlog = list(self.backlog), set()
        hs = self.placement.hotset
        rows = [r for r in self.cold.get(backlog) if r is not None and (hs is None or r["id"] not in hs)]
        publish_totals(hot, self.cold.namespace_counts())
        if rows:
            rows.sort(key=lambda r: (r["created_at_us"], r["id"]))
            self.placement.place(hot, np.array([r["id"] for r in rows], dtype=np.int64),
                                 np.stack([r["vector"] for r in rows]), [r["namespace"] for r in rows],
                                 np.array([r["created_at_us"] for r in rows], dtype=np.int64))

    def close(self) -> None:
        """Hands the backlog over, applies the writes it left to others if nobody has yet, then detaches (the
        sidecar exits by itself once no process uses it)."""
        if self.backlog:
            self._next_try = 0.0
            self.call(self.flush_backlog)
        if self._left_until is not None and self.hot is not None and not self.logged.covers(self._left_until):
            with self.write_lock.held():  # a writer that leaves takes its writes' hot side along
                self.call(lambda hot: self.logged.apply(hot, self.epoch))
        self.closed = True
        if self.hot is not None:
            self.hot.close()
            self.hot = None
        if self.logged is not None:
            self.logged.close()
        if self.certs is not None:
            self.certs.close()
