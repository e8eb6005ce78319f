"""TieredMemory: the coordinator that asks the hot sidecar first, the LanceDB cold tier when it must, and merges."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import secrets
import subprocess
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from .bounds import BoundIndex
from .certificates import HotCertificates, repair
from .embedders import Embedder, resolve_embedder
from .errors import InvalidInput, ReadOnlyStore, SidecarUnavailable, TieredRecallError
from .namespaces import namespace_hash, validate_namespace
from .policies import LFU, HotSet, Policy, resolve_policy
from .scoring import Scoring
from .sidecar import HotTier, sidecar_executable, start_sidecar
from .storage._generations import slot_of

logger = logging.getLogger("tiered_recall")

CONFIG_FILE = "tiered_recall.json"
COLD_FOLDER = "cold"
DEFAULT_HOT_CAPACITY = 100_000
ORPHAN_GRACE_S = 10.0
RECONNECT_BACKOFF_S = 1.0
METADATA_CACHE_ROWS = 200_000
RESYNC_EVERY_S = 2.0  # at most this often, rebuild hot-set tracking and bounds after another process wrote
# ... and at most this share of a process's time: a resync reads every cold row and rebuilds every bound, so
# with other writers at work it costs O(store) every 2 s per process (an 8-process soak: py-spy found 6 of 8
# workers inside it); until the next one, rule 2 is off for this process and searches read the cold tier.
RESYNC_MAX_SHARE = 0.1
# A repair of stale hot rows (another process wrote without this hot tier) reads the cold rows of the namespaces it
# covers; while writes keep coming it cannot certify them, so it is retried at most this often and at most this
# share of the time, like a resync.
REPAIR_EVERY_S = 0.0
REPAIR_MAX_SHARE = 0.1
# How messages name the options of TieredMemory(...); the CLI passes its own flags.
API_OPTION_NAMES = {"device": "device", "hot_capacity": "hot_capacity", "read_only": "read_only"}
RULES = ("complete", "bound", "threshold")
_ROW_OVERHEAD_BYTES = 24  # id, namespace hash, created_at per hot row
_MAX_ID = (1 << 63) - 1
MAX_DIM = 8192  # the sidecar's limit (layout.h TR_MAX_DIM)


def _check_ids(ids: Any) -> np.ndarray:
    """An int or a sequence of ints -> 1-d int64; anything else (str, float, nested, None) is refused."""
    try:
        id_arr = None if isinstance(ids, (str, bytes, dict)) else np.atleast_1d(np.asarray(ids))
    except (TypeError, ValueError):
        id_arr = None
    if id_arr is None or id_arr.ndim != 1 or (id_arr.size and id_arr.dtype.kind not in "iu"):
        raise InvalidInput(f"ids must be an int or a list of ints, got {ids!r:.80}")
    return id_arr.astype(np.int64)


@dataclass(frozen=True)
class Memory:
    """One stored memory as `get` returns it."""

    id: int
    text: str
    namespace: str
    session: str | None
    role: str | None
    created_at: datetime
    metadata: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Hit:
    """One search result; `tier` says which tier served it ("hot" or "cold")."""

    id: int
    text: str
    score: float
    tier: str
    namespace: str
    session: str | None
    role: str | None
    created_at: datetime
    metadata: dict = field(default_factory=dict)


@dataclass(frozen=True)
class SearchReport:
    """What search(..., explain=True) returns: the hits and how the answer was decided.

    rule: "complete" (rule 1: the hot tier holds the whole namespace), "bound" (rule 2: no cold
    row can reach the top k), "threshold" (rule 3: hot k-th score >= confidence), "cold" (the
    cold tier was searched and merged), "no-hot" (no hot tier, or a where filter: cold only), or
    "hybrid" (BM25 fused with the vector ranking, by the cold tier).
    hot_kth: the hot k-th (final) score or None; cold_bound: the best score a cold-only row could
    reach (rule 2), None when not evaluated.
    """

    hits: list
    rule: str
    path: str
    hot_kth: float | None
    cold_bound: float | None
    seconds: float


class _PathStats:
    """Latencies per search path, kept in this process (bounded)."""

    def __init__(self, keep: int = 10_000) -> None:
        self.keep = keep
        self.samples: dict[str, list[float]] = {}
        self.counts: dict[str, int] = {}

    def record(self, path: str, seconds: float) -> None:
        bucket = self.samples.setdefault(path, [])
        bucket.append(seconds)
        if len(bucket) > self.keep:
            del bucket[: len(bucket) - self.keep]
        self.counts[path] = self.counts.get(path, 0) + 1

    def summary(self) -> dict:
        out = {}
        for path, values in self.samples.items():
            arr = np.asarray(values) * 1e6
            out[path] = {"searches": self.counts[path], "p50_us": float(np.percentile(arr, 50)),
                         "p99_us": float(np.percentile(arr, 99))}
        return out


def _to_datetime(us: int) -> datetime:
    return datetime.fromtimestamp(us / 1e6, tz=timezone.utc)


def _timestamps_us(created_at: Any, n: int) -> np.ndarray:
    now = time.time_ns() // 1000
    if created_at is None:
        return np.full(n, now, dtype=np.int64)
    values = created_at if isinstance(created_at, (list, tuple, np.ndarray)) else [created_at] * n
    if len(values) != n:
        raise InvalidInput(f"created_at has {len(values)} values for {n} memories: give one per memory or one for all")
    out = np.empty(n, dtype=np.int64)
    for i, value in enumerate(values):
        if value is None:
            out[i] = now
        elif isinstance(value, datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=timezone.utc)
            out[i] = int(value.timestamp() * 1e6)
        elif isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
            if not np.isfinite(value):
                raise InvalidInput(f"created_at[{i}] is not finite: pass a datetime or epoch seconds")
            out[i] = int(float(value) * 1e6)
        else:
            raise InvalidInput(f"created_at[{i}] is {type(value).__name__}: pass a datetime or epoch seconds")
    return out


def _per_row(value: Any, n: int, what: str, *, kind: type) -> list:
    if value is None or isinstance(value, kind):
        return [value] * n
    if not isinstance(value, (list, tuple)):
        raise InvalidInput(f"{what} must be a {kind.__name__}, None, or a list with one per memory")
    if len(value) != n:
        raise InvalidInput(f"{what} has {len(value)} values for {n} memories: give one per memory or one for all")
    for i, v in enumerate(value):
        if v is not None and not isinstance(v, kind):
            raise InvalidInput(f"{what}[{i}] is {type(v).__name__}, expected {kind.__name__} or None")
    return list(value)


def sidecar_name_of(path: str | os.PathLike) -> str:
    """The segment name of the sidecar every process opening the store at `path` shares."""
    digest = hashlib.blake2b(str(Path(path).expanduser().resolve()).encode(), digest_size=8).hexdigest()
    return f"store-{os.getuid()}-{digest}"


def _gpu_visible() -> bool:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def _cuda_compiled() -> bool:
    try:
        out = subprocess.run([str(sidecar_executable()), "--backends"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError, TieredRecallError):
        return False
    return "cuda" in out.stdout.split()


class TieredMemory:
    """A memory store: a hot tier in a sidecar (GPU or CPU) over a durable LanceDB cold tier.

    TieredMemory(path="./storage", *, dim=None, embedder="wordllama", hot_capacity=None, device="auto",
                 policy="lru", hot_capacity_bytes=None, rules=("complete", "bound"), confidence=None,
                 scoring=None, read_only=None)

    path: folder of the store (created with mode 0700). dim: vector width; taken from the embedder
    or the existing store when None. embedder: "wordllama" (default, offline), "minilm", any
    callable texts -> (n, d) float32, or None to add and search raw vectors only. hot_capacity:
    rows the hot tier keeps (None: the running sidecar's, or 100,000 when this process starts it; a
    value that differs from a running sidecar's is logged and reported in stats()["hot_warnings"]);
    hot_capacity_bytes: the same as a byte budget (vector + 24 bytes a row; overrides hot_capacity). policy: "lru", "lfu", "recency", "namespace" (whole
    namespaces kept hot, for rule 1) or a tiered_recall.policies Policy (pinning included): which
    rows stay hot; evicted rows stay in the cold tier.
    device: "auto" (CUDA when a GPU and the CUDA build are present, else CPU; a hot tier that cannot
    start is logged and the store serves from the cold tier), "cpu", "cuda" (an error when it cannot
    be had), or "none" for no hot tier at all. Other processes opening the same path share the same
    sidecar; every process's writes, with a hot tier or without, keep every search exact
    (docs/skip-rules.md). read_only: True opens an existing store for search only (no hot tier;
    writes raise ReadOnlyStore); None (default) does so by itself, with a log line, when the folder
    cannot be written.
    rules: the skip rules tried in order ("complete", "bound"; both exact); confidence: a float
    enables rule 3 ("threshold"; approximate) on the hot k-th score. scoring: a
    tiered_recall.scoring.Scoring (recency weighting, metadata boosts) for the merged candidates.

    Policy state and rule-2 bounds are kept per process; another process's write to the hot tier
    is detected from the sidecar's counters and makes this process stop using rule 2 until it has
    re-read the hot set and rebuilt its bounds from the cold tier (at most every 2 s).
    """

    def __init__(self, path: str | os.PathLike = "./storage", *, dim: int | None = None,
                 embedder: Any = "wordllama", hot_capacity: int | None = None, device: str = "auto",
                 timeout_s: float = 5.0, orphan_grace_s: float = ORPHAN_GRACE_S,
                 policy: str | Policy | None = "lru", hot_capacity_bytes: int | None = None,
                 rules: Sequence[str] = ("complete", "bound"), confidence: float | None = None,
                 scoring: Scoring | None = None, read_only: bool | None = None,
                 option_names: dict[str, str] | None = None) -> None:
        from .storage import ColdStore  # lancedb is imported here, not at package import

        self._option_names = {**API_OPTION_NAMES, **(option_names or {})}
        if device not in ("auto", "cpu", "cuda", "none"):
            raise InvalidInput(f"{self._opt('device')} must be 'auto', 'cpu', 'cuda' or 'none', got {device!r}")
        if hot_capacity is not None and (isinstance(hot_capacity, bool) or not isinstance(
                hot_capacity, (int, np.integer)) or hot_capacity < 1):
            raise InvalidInput(f"{self._opt('hot_capacity')} must be a positive int (rows), got {hot_capacity!r}")
        if read_only not in (None, True, False):
            raise InvalidInput(f"{self._opt('read_only')} must be True, False or None (decided by whether the "
                               f"folder can be written), got {read_only!r}")
        for what, value in (("timeout_s", timeout_s), ("orphan_grace_s", orphan_grace_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
                    or not np.isfinite(value) or value <= 0:
                raise InvalidInput(f"{what} must be a positive number of seconds, got {value!r}")
        if hot_capacity_bytes is not None and (isinstance(hot_capacity_bytes, bool) or not isinstance(
                hot_capacity_bytes, (int, np.integer)) or hot_capacity_bytes < 1):
            raise InvalidInput(f"hot_capacity_bytes must be a positive int or None, got {hot_capacity_bytes!r}")
        rules = tuple(rules)
        for rule in rules:
            if rule not in ("complete", "bound"):
                raise InvalidInput(f"rules may hold 'complete' and 'bound' (exact rules); got {rule!r}: "
                                   "rule 3 is enabled by confidence=<score>")
        if confidence is not None:
            if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not -1 <= confidence <= 2:
                raise InvalidInput(f"confidence must be a score threshold in [-1, 2] or None, got {confidence!r}")
            rules = rules + ("threshold",)
        if scoring is not None and not isinstance(scoring, Scoring):
            raise InvalidInput("scoring must be a tiered_recall.scoring.Scoring or None")
        self.policy: Policy = resolve_policy(policy)
        self.rules = rules
        self.confidence = None if confidence is None else float(confidence)
        self.scoring = scoring if scoring is not None and scoring.active else None
        self.path = Path(path).expanduser().resolve()
        self.read_only = self._settle_read_only(read_only)
        self._hot_warnings: list[str] = []  # what the user asked of the hot tier and did not get (stats())
        if self.read_only and device in ("cpu", "cuda"):
            raise InvalidInput(f"the store at {self.path} is read-only, and a read-only store has no hot tier: "
                               f"open it with {self._opt('device')}='none' (or 'auto'), or writable")
        self.embedder: Embedder | None = None if embedder is None else resolve_embedder(
            None if embedder == "wordllama" else embedder)
        self.dim = self._settle_config(dim)
        self.device = "none" if self.read_only else device
        if self.read_only and device == "auto":
            logger.info("tiered-recall: the store at %s is read-only: searches are served by the cold tier", self.path)
        if self.device == "cuda":
            self._require_cuda()
        self._requested_capacity = None if hot_capacity is None else int(hot_capacity)
        if hot_capacity_bytes is not None:
            elem = 2 if self._backend() == "cuda" else 4  # the sidecar stores f16 on CUDA, f32 on CPU
            self._requested_capacity = max(1, int(hot_capacity_bytes) // (self.dim * elem + _ROW_OVERHEAD_BYTES))
        self.hot_capacity = self._requested_capacity or DEFAULT_HOT_CAPACITY
        self.timeout_s = float(timeout_s)
        self.orphan_grace_s = float(orphan_grace_s)
        self.cold = ColdStore(self.path / COLD_FOLDER, dim=self.dim, read_only=self.read_only)
        gens = self.cold.generations
        self._certs: HotCertificates | None = None
        if self.device != "none":
            self._certs = HotCertificates(self.path, gens)
        self._gens = gens
        self._epoch = (0, 0)  # the attached sidecar's instance, which the certificates must name
        self._writes_seen = -1  # the store's write count this process's bounds and hot set know of (-1: none)
        self._next_repair = 0.0
        self.sidecar_name = sidecar_name_of(self.path)
        self._lock = threading.RLock()
        self._hot: HotTier | None = None
        self._hot_owner_pid = 0
        self._next_hot_try = 0.0
        self._hot_error: str | None = None
        self._backlog: set[int] = set()  # ids acknowledged while the hot tier was unreachable
        self._write_held = threading.local()  # depth of _write_lock() held by this thread
        self._cache: OrderedDict[int, Memory] = OrderedDict()
        self._stats = _PathStats()
        self._rule_stats = _PathStats()
        self._closed = False
        # hot-set tracking (policy) and rule-2 bounds, valid while the sidecar's counters match ours
        self._hotset: HotSet | None = None
        self._bounds = BoundIndex(self.dim)
        self._expected: tuple | None = None
        self._next_resync = 0.0
        self._tick = 0
        self._moves = {"inserted": 0, "promoted": 0, "evicted": 0, "sidecar_evicted": 0, "resyncs": 0,
                       "bound_rebuilds": 0, "rewarms": 0, "repairs": 0}
        try:
            self._ensure_hot()
            if self.device in ("cpu", "cuda") and self._hot is None:
                raise SidecarUnavailable(f"the hot tier ({self._opt('device')}={self.device!r}) could not start: "
                                         f"{self._hot_error}; open the store with {self._opt('device')}='auto' to go on "
                                         "without it, or 'none'")
        except BaseException:
            self.cold.close()
            if self._certs is not None:
                self._certs.close()
            raise
        if self._hot is None and self.device == "auto":
            self._warn(f"no hot tier: {self._hot_error}; searches are served by the cold tier (exact, slower), and "
                       "the store tries again on later calls")

    def _opt(self, name: str) -> str:
        """How the caller spells option `name` (the API keyword, or the CLI's flag)."""
        return self._option_names.get(name, name)

    def _warn(self, message: str) -> None:
        if message not in self._hot_warnings:
            self._hot_warnings.append(message)
            logger.warning("tiered-recall: %s", message)

    def _settle_read_only(self, read_only: bool | None) -> bool:
        """True/False as asked; None: whether the store folder can be written (made if missing), tried for real, so
        a read-only mount and a folder of another user both count."""
        if read_only:
            if not (self.path / CONFIG_FILE).exists():
                raise InvalidInput(f"no store at {self.path}: a read-only store must exist (open it writable once)")
            return True
        try:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
            probe = self.path / f".write-probe-{os.getpid()}-{threading.get_ident()}"
            probe.touch()
            probe.unlink()
            return False
        except OSError as exc:
            if read_only is None and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM) \
                    and (self.path / CONFIG_FILE).exists():
                logger.info("tiered-recall: %s cannot be written (%s): opened read-only", self.path, exc.strerror)
                return True
            raise InvalidInput(f"cannot write the store folder {self.path}: {exc}"
                               + ("" if read_only is not None else
                                  f"; to search an existing store, open it with {self._opt('read_only')}=True")) from exc

    def _require_cuda(self) -> None:
        """device='cuda' asked explicitly: an error, not a quiet CPU tier, when it cannot be had."""
        if not _cuda_compiled():
            why = "this installation was built without the CUDA backend (no nvcc at install time)"
        elif not _gpu_visible():
            why = "no GPU is visible (nvidia-smi sees none)"
        else:
            return
        raise InvalidInput(f"{self._opt('device')}='cuda' but {why}: use {self._opt('device')}='auto' to fall back "
                           f"to the CPU hot tier, or {self._opt('device')}='cpu'")

    # ---- set-up ------------------------------------------------------------------------------

    def _settle_config(self, dim: int | None) -> int:
        """Reads or writes the store's config so a reopened store keeps its dim and embedder."""
        config_path = self.path / CONFIG_FILE
        embedder_name = self.embedder.name if self.embedder is not None else None
        if dim is not None and (isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not 1 <= dim <= MAX_DIM):
            raise InvalidInput(f"dim must be an int in 1..{MAX_DIM}, got {dim!r}")
        if self.embedder is not None and dim is not None and dim != self.embedder.dim:
            raise InvalidInput(f"dim={dim} but the embedder {embedder_name!r} makes {self.embedder.dim}-d vectors: "
                               "drop dim, or pick an embedder of that width")
        if config_path.exists():
            config = json.loads(config_path.read_text())
            stored_dim = int(config["dim"])
            if dim is not None and dim != stored_dim:
                raise InvalidInput(f"the store at {self.path} holds {stored_dim}-d vectors, not {dim}-d: "
                                   f"open it with dim={stored_dim} or use another path")
            if self.embedder is not None and self.embedder.dim != stored_dim:
                raise InvalidInput(f"the store at {self.path} holds {stored_dim}-d vectors but the embedder "
                                   f"{embedder_name!r} makes {self.embedder.dim}-d ones: open it with the embedder "
                                   f"it was made with ({config.get('embedder')!r})")
            stored_embedder = config.get("embedder")
            if self.embedder is not None and stored_embedder and stored_embedder != embedder_name:
                raise InvalidInput(f"the store at {self.path} was embedded with {stored_embedder!r}, not "
                                   f"{embedder_name!r}: its vectors would not be comparable; open it with "
                                   f"embedder={stored_embedder.split(':')[0]!r} or use another path")
            return stored_dim
        if dim is None:
            if self.embedder is None:
                raise InvalidInput("a store without an embedder needs dim=...: TieredMemory(path, dim=384, embedder=None)")
            dim = self.embedder.dim
        tmp = config_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"dim": int(dim), "embedder": embedder_name, "layout": 1}))
        os.replace(tmp, config_path)
        return int(dim)

    def _backend(self) -> str:
        if self.device != "auto":
            return self.device
        return "cuda" if _cuda_compiled() and _gpu_visible() else "cpu"

    def _ensure_hot(self) -> HotTier | None:
        """Attaches to the store's sidecar, starting (and warming) one when none serves it."""
        if self.device == "none" or self._closed:
            return None
        if self._hot is not None:
            if self._hot.serving():  # a dead sidecar shows up as SidecarUnavailable on the next call
                return self._hot
            self._drop_hot("the sidecar stopped")
        if time.monotonic() < self._next_hot_try:
            return None
        lock_path = self.path / ".sidecar.lock"
        try:
            # the write lock first (the order add() takes them in): warming publishes totals, which
            # must not interleave with another process's commit-then-publish
            with self._write_lock(), open(lock_path, "a+") as lock_file:
                fcntl.flock(lock_file, fcntl.LOCK_EX)
                started = False
                try:
                    hot = HotTier.attach(self.sidecar_name, dim=self.dim, timeout_s=self.timeout_s)
                except SidecarUnavailable:
                    start_sidecar(self.sidecar_name, dim=self.dim, capacity=self.hot_capacity,
                                  backend=self._backend(), exit_when_orphaned_s=self.orphan_grace_s, detach=True)
                    hot = HotTier.attach(self.sidecar_name, dim=self.dim, timeout_s=self.timeout_s)
                    started = True
                self._epoch = hot.instance
                if not started:
                    self._check_joined(hot)
                if started or hot.hot_rows == 0:
                    self._warm(hot)
                elif not self._certs.epoch_matches(self._epoch):
                    # a sidecar no process of this version certified (or the file was removed): check every row
                    repair(hot, self.cold, self._certs, self._epoch, None)
                    self._moves["repairs"] += 1
                self._hotset = HotSet(self.dim, hot.capacity)
                self._resync(hot)
        except (TieredRecallError, OSError) as exc:
            self._hot_error = str(exc)
            self._next_hot_try = time.monotonic() + RECONNECT_BACKOFF_S
            return None
        self._hot = hot
        self._hot_owner_pid = hot.owner_pid
        self._hot_error = None
        if self._backlog:
            try:
                self._flush_backlog(hot)
            except SidecarUnavailable as exc:
                self._drop_hot(str(exc))
                return None
        return hot

    def _check_joined(self, hot: HotTier) -> None:
        """A sidecar another process started serves this store: say where it differs from what was asked."""
        if self._requested_capacity is not None and hot.capacity != self._requested_capacity:
            self._warn(f"{self._opt('hot_capacity')}={self._requested_capacity} was asked, but the store's running "
                       f"sidecar (pid {hot.owner_pid}) holds {hot.capacity} rows; it keeps its size until every "
                       "process has closed the store")
        if self.device in ("cpu", "cuda") and hot.backend != self.device:
            self._warn(f"{self._opt('device')}={self.device!r} was asked, but the store's running sidecar (pid "
                       f"{hot.owner_pid}) serves from the {hot.backend}; it keeps it until every process has closed "
                       "the store")

    def _warm(self, hot: HotTier) -> None:
        """Fills a fresh hot tier and publishes totals: the namespaces the policy keeps whole first
        (Policy.warm_namespaces), then the most recent rows of the cold tier while there is room; then
        certifies it at the write generations read before the cold tier was. Under the write lock: a
        total read here and published after another process's add would be stale."""
        with self._write_lock():
            self._certs.invalidate()
            snap = self._gens.snapshot()
            self._warm_locked(hot)
            self._certs.certify_all(snap, self._epoch)

    def _warm_locked(self, hot: HotTier) -> None:
        counts = self.cold.namespace_counts()
        self.policy.set_sizes(counts, replace=True)
        whole = self.policy.warm_namespaces(self._tick, hot.capacity)
        if whole:
            every = self.cold.recent(max(1, self.cold.count()))  # newest first
            in_whole = np.array([ns in whole for ns in every["namespace"]], dtype=bool)
            pick = np.concatenate([np.flatnonzero(in_whole), np.flatnonzero(~in_whole)])[: hot.capacity]
            pick = np.sort(pick)  # back to newest first
            recent = {"ids": every["ids"][pick], "vectors": every["vectors"][pick],
                      "namespace": [every["namespace"][j] for j in pick],
                      "created_at_us": every["created_at_us"][pick]}
        else:
            recent = self.cold.recent(hot.capacity)
        ids = recent["ids"]
        if len(ids):
            order = np.arange(len(ids))[::-1]  # oldest first, so the newest end most recently used
            hashes = np.array([namespace_hash(ns) for ns in recent["namespace"]], dtype=np.uint64)
            hot.upsert(ids[order], recent["vectors"][order], hashes[order],
                       created_at_us=recent["created_at_us"][order])
        self._publish_totals(hot, self.cold.namespace_counts())  # read again: the newest totals win

    # ---- hot-set tracking and rule-2 bounds --------------------------------------------------

    @staticmethod
    def _signature(hot: HotTier) -> tuple:
        """The sidecar's membership counters: any change this process did not make shows here."""
        h = hot._header
        return (int(h.owner_pid), int(h.upserted_rows), int(h.deleted_rows), int(h.evicted_rows), int(h.hot_rows))

    def _tracking_ok(self, hot: HotTier) -> bool:
        """True while this process's hot set and bounds still describe the hot tier exactly, and no other process
        has written to the cold tier since they were read."""
        if not self._bounds.valid or self._expected is None or self._hotset is None or self._backlog:
            return False
        if self._gens.writes() != self._writes_seen:
            self._bounds.valid = False
            return False
        sig = self._signature(hot)
        if sig[:4] != self._expected or sig[4] != len(self._hotset):
            self._bounds.valid = False
            return False
        return True

    def _invalidate(self) -> None:
        self._bounds.valid = False
        self._expected = None

    def _resync(self, hot: HotTier) -> None:
        """Re-reads which rows the hot tier holds (CONTAINS over every cold id) and rebuilds every bound."""
        started = time.monotonic()
        self._next_resync = started + RESYNC_EVERY_S
        try:
            self._resync_now(hot)
        finally:
            took = time.monotonic() - started
            self._next_resync = started + max(RESYNC_EVERY_S, took / RESYNC_MAX_SHARE)

    def _resync_now(self, hot: HotTier) -> None:
        self._moves["resyncs"] += 1
        self._writes_seen = self._gens.writes()  # before the cold tier is read: a write after it shows as a change
        self._bounds.clear()
        if self._hotset is None or self._hotset.capacity != hot.capacity:
            self._hotset = HotSet(self.dim, hot.capacity)
        else:
            self._hotset.clear()
        before, rows, present, after = self._hot_membership(hot)
        if before == after and int(present.sum()) != after[4]:
            # The hot tier holds rows the cold tier does not (e.g. a promotion that raced with a delete; see
            # _write_lock): start it afresh. Only a mismatch read while the hot tier's counters stood still
            # says so; one read while another process writes (its add lands between our cold read and CONTAINS)
            # or warms (its own clear-and-refill) does not. Taking those for foreign rows cleared and refilled the
            # whole tier, which other processes then read half-filled and cleared again: in the 8-process soak
            # (benchmarks/soak.py, ~12k rows) the sidecar had upserted 3.3M rows for ~30k written after 250k
            # operations, searches fell to the cold tier and the rate from ~650 to ~250 ops/s. Confirmed under
            # the write lock (no add, delete or promotion meanwhile) before the clear.
            with self._write_lock():
                before, rows, present, after = self._hot_membership(hot)
                if before == after and int(present.sum()) != after[4]:
                    self._moves["rewarms"] += 1
                    self._certs.invalidate()
                    hot.clear()
                    self._warm(hot)
                    before, rows, present, after = self._hot_membership(hot)
        ids = rows["ids"]
        namespaces = rows["namespace"]
        created = rows["created_at_us"]
        self._forget_deleted(ids)
        self.policy.set_sizes(dict(Counter(namespaces)), replace=True)
        hot_at = np.flatnonzero(present)
        if hot_at.size > self._hotset.capacity:
            self._invalidate()  # more rows than the tier holds: the read was torn; try again later
            hot_at = hot_at[: self._hotset.capacity]
        self._hotset.fill(ids[hot_at], [namespaces[j] for j in hot_at.tolist()], rows["vectors"][hot_at],
                          created[hot_at], self._tick)
        cold_only: dict[str, list[int]] = {}
        for j in np.flatnonzero(~present).tolist():
            cold_only.setdefault(namespaces[j], []).append(j)
        for ns, idx in cold_only.items():
            sel = np.asarray(idx, dtype=np.int64)
            self._bounds.get(ns).rebuild(ids[sel], rows["vectors"][sel], created[sel])
            self._bounds.where.update((int(i), ns) for i in ids[sel])
        if before == after and after[4] == len(self._hotset):
            self._expected = after[:4]
            self._bounds.valid = True
        else:
            self._invalidate()  # someone wrote meanwhile: try again later
        self._load_pins(hot)

    def _hot_membership(self, hot: HotTier) -> tuple[tuple, dict, np.ndarray, tuple]:
        """(signature before, every cold row, which of them the hot tier holds, signature after): the read is
        a consistent view of the hot tier only when the two signatures are equal."""
        before = self._signature(hot)
        rows = self.cold.recent(max(1, self.cold.count()))
        ids = rows["ids"]
        present = hot.contains(ids) if len(ids) else np.zeros(0, dtype=bool)
        return before, rows, present, self._signature(hot)

    def _rebuild_bound(self, namespace: str) -> None:
        """Tightens one namespace's cones over exactly its cold-only rows (read from the cold tier)."""
        nb = self._bounds.by_namespace.get(namespace)
        if nb is None or self._hotset is None:
            return
        rows = self.cold.recent(max(1, self.cold.count(namespace)), namespace=namespace)
        keep = np.array([int(i) not in self._hotset for i in rows["ids"]], dtype=bool)
        if len(keep):
            self._bounds.reset_ids(namespace, rows["ids"][keep])
            nb.rebuild(rows["ids"][keep], rows["vectors"][keep], rows["created_at_us"][keep])
        else:
            self._bounds.reset_ids(namespace, [])
            nb.rebuild([], np.empty((0, self.dim), np.float32), [])
        self._moves["bound_rebuilds"] += 1

    def _fold_cold(self, namespace: str, ids, vectors, created_us) -> None:
        """Rows that are (now) only in the cold tier join their namespace's bound."""
        if len(ids):
            self._bounds.add(namespace, ids, vectors, created_us)

    def _hot_delete(self, hot: HotTier, ids: list[int]) -> None:
        """Deletes rows from the hot tier (policy victims), folding the tracked ones into the bounds."""
        if not ids:
            return
        tracked = 0
        by_ns: dict[str, tuple[list, list, list]] = {}
        for i in ids:
            got = self._hotset.remove(i) if self._hotset is not None else None
            if got is not None:
                tracked += 1
                ns, vec, created = got
                bucket = by_ns.setdefault(ns, ([], [], []))
                bucket[0].append(i)
                bucket[1].append(vec)
                bucket[2].append(created)
        for ns, (bid, bvec, bcr) in by_ns.items():
            self._fold_cold(ns, bid, np.stack(bvec), bcr)
        deleted = hot.delete(np.asarray(ids, dtype=np.int64))
        if self._expected is not None:
            pid, up, de, ev = self._expected
            self._expected = (pid, up, de + deleted, ev)
        if deleted != tracked:
            self._invalidate()

    def _place(self, hot: HotTier, ids: np.ndarray, vecs: np.ndarray, namespaces: list[str],
               created: np.ndarray, *, promoted: bool = False) -> None:
        """Puts rows into the hot tier under the policy: the policy's victims leave first (into the
        bounds), so the sidecar never evicts by itself; rows that find no room stay cold-only."""
        hs = self._hotset
        if hs is None:
            return
        n = len(ids)
        half_life = self.policy.half_life if isinstance(self.policy, LFU) else None
        place = np.ones(n, dtype=bool)
        cap = self.policy.per_namespace_cap()
        if cap is not None:
            seen: dict[str, int] = {}
            for j in range(n - 1, -1, -1):  # the newest rows of a batch win the window
                ns = namespaces[j]
                seen[ns] = seen.get(ns, 0) + 1
                if seen[ns] > cap:
                    place[j] = False
        if self.policy.admission:  # the policy may keep new rows out rather than displace better ones
            new_by_ns: dict[str, list[int]] = {}
            for j in np.flatnonzero(place):
                if int(ids[j]) not in hs and not self.policy.is_pinned(int(ids[j]), namespaces[j]):
                    new_by_ns.setdefault(namespaces[j], []).append(int(j))
            for ns, js in new_by_ns.items():
                ok = self.policy.admit(hs, ns, len(js), self._tick)
                for j in js[: len(js) - ok]:  # the oldest rows of the batch stay cold
                    place[j] = False
        if place.sum() > hs.capacity:
            place[np.flatnonzero(place)[: int(place.sum()) - hs.capacity]] = False
        batch_ids = {int(i) for i in ids}
        victims: list[int] = []
        if cap is not None:
            new_per_ns: dict[str, int] = {}
            for j in np.flatnonzero(place):
                if int(ids[j]) not in hs:
                    new_per_ns[namespaces[j]] = new_per_ns.get(namespaces[j], 0) + 1
            for ns, m in new_per_ns.items():
                over = hs.per_namespace.get(ns, 0) + m - cap
                victims += hs.victims(self.policy, over, self._tick, exclude=batch_ids, namespace=ns)
        new = sum(1 for j in np.flatnonzero(place) if int(ids[j]) not in hs)
        need = len(hs) - len(victims) + new - hs.capacity
        if need > 0:
            more = hs.victims(self.policy, need + len(victims), self._tick, exclude=batch_ids | set(victims))
            victims += more[:need]
        shortfall = len(hs) - len(victims) + new - hs.capacity
        if shortfall > 0:  # pinned rows fill the tier: the oldest rows of this batch stay cold
            for j in np.flatnonzero(place):
                if shortfall <= 0:
                    break
                if int(ids[j]) not in hs:
                    place[j] = False
                    shortfall -= 1
        self._hot_delete(hot, victims)
        self._moves["evicted"] += len(victims)
        # rows that stay cold-only (including a replaced vector of an id that was cold-only)
        self._bounds.discard(int(i) for i in ids)
        unplaced = np.flatnonzero(~place)
        if unplaced.size:  # an old copy may be hot (placed by any process) while the new one is not: it must go
            self._hot_delete(hot, [int(ids[j]) for j in unplaced])
        for j in unplaced:
            self._fold_cold(namespaces[j], [int(ids[j])], vecs[j:j + 1], [int(created[j])])
        sel = np.flatnonzero(place)
        if sel.size == 0:
            return
        hashes = np.array([namespace_hash(namespaces[j]) for j in sel], dtype=np.uint64)
        evicted = hot.upsert(ids[sel], vecs[sel], hashes, created_at_us=created[sel])
        if self._expected is not None:
            pid, up, de, ev = self._expected
            self._expected = (pid, up + int(sel.size), de, ev + len(evicted))
        for j in sel:
            hs.put(int(ids[j]), namespaces[j], vecs[j], int(created[j]), self._tick, half_life)
        if promoted:
            self._moves["promoted"] += int(sel.size)
        else:
            self._moves["inserted"] += int(sel.size)
        if len(evicted):  # only when another process filled the tier: fold what we know, then resync
            self._moves["sidecar_evicted"] += len(evicted)
            untracked = False
            for i in evicted.tolist():
                got = hs.remove(i)
                if got is None:
                    untracked = True
                    continue
                self._fold_cold(got[0], [i], got[1][None, :], [got[2]])
            if untracked:
                self._invalidate()

    def _load_pins(self, hot: HotTier) -> None:
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
        want = [r for r in want if self._hotset is not None and r["id"] not in self._hotset]
        if want:
            self._place(hot, np.array([r["id"] for r in want], dtype=np.int64), np.stack([r["vector"] for r in want]),
                        [r["namespace"] for r in want], np.array([r["created_at_us"] for r in want], dtype=np.int64),
                        promoted=True)

    def pin(self, *, namespace: str | None = None, ids: Sequence[int] | None = None) -> None:
        """Pins a namespace and/or ids: loaded into the hot tier now and never evicted by the policy."""
        self._check_open()
        if namespace is not None:
            validate_namespace(namespace)
            self.policy.pinned_namespaces.add(namespace)
        if ids is not None:
            self.policy.pinned_ids.update(int(i) for i in np.atleast_1d(np.asarray(ids, dtype=np.int64)))
        with self._lock:
            self._hot_call(self._load_pins)

    def unpin(self, *, namespace: str | None = None, ids: Sequence[int] | None = None) -> None:
        """Lets the policy evict these again."""
        self._check_open()
        if namespace is not None:
            self.policy.pinned_namespaces.discard(namespace)
        if ids is not None:
            for i in np.atleast_1d(np.asarray(ids, dtype=np.int64)):
                self.policy.pinned_ids.discard(int(i))

    def _publish_totals(self, hot: HotTier, counts: dict[str, int]) -> None:
        hot.set_namespace_totals({namespace_hash(ns): n for ns, n in counts.items()})

    def _drop_hot(self, reason: str) -> None:
        if self._hot is not None:
            try:
                self._hot.close()
            except Exception:
                pass
        self._hot = None
        self._hot_error = reason
        self._next_hot_try = 0.0
        self._invalidate()

    def _hot_call(self, fn):
        """Runs fn(hot); on a dead or stuck sidecar, drops it (the next call reconnects) and returns None."""
        hot = self._ensure_hot()
        if hot is None:
            return None
        try:
            return fn(hot)
        except SidecarUnavailable as exc:
            self._drop_hot(str(exc))
            self._next_hot_try = time.monotonic() + RECONNECT_BACKOFF_S
            return None
        except TieredRecallError as exc:  # the hot tier is a cache: its failure never fails a durable write
            self._hot_error = str(exc)
            self._invalidate()  # a half-done placement: trust nothing until the next resync
            return None

    # ---- writes ------------------------------------------------------------------------------

    def _prepare_vectors(self, texts: list[str] | None, vectors: Any, n: int) -> np.ndarray:
        if vectors is None:
            if self.embedder is None:
                raise InvalidInput("this store has no embedder: pass vectors=... (n, dim) float32")
            vectors = self.embedder(texts)
        arr = np.asarray(vectors)
        if arr.ndim == 1:
            arr = arr[None, :]
        if arr.ndim != 2 or arr.shape != (n, self.dim):
            raise InvalidInput(f"vectors must have shape ({n}, {self.dim}); got {arr.shape}")
        if arr.dtype.kind not in "fiu":
            raise InvalidInput(f"vectors must be numeric, got dtype {arr.dtype}")
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if not np.isfinite(arr).all():
            raise InvalidInput("vectors contain NaN or infinite values: clean them (np.nan_to_num) or drop those rows")
        norms = np.linalg.norm(arr, axis=1)
        if (norms == 0).any():
            raise InvalidInput(f"vector {int(np.argmin(norms))} is all zeros: it has no direction to search by")
        return arr / norms[:, None]

    def add(self, texts: str | Sequence[str] | None = None, *, vectors: Any = None, namespace: str = "default",
            ids: Sequence[int] | None = None, session: str | Sequence[str | None] | None = None,
            role: str | Sequence[str | None] | None = None, metadata: dict | Sequence[dict | None] | None = None,
            created_at: Any = None) -> list[int]:
        """Stores memories; durable in the cold tier when it returns, then inserted into the hot tier.

        texts: one string or a list (stored, and embedded unless vectors are given). vectors: (n, dim)
        or (dim,) floats, normalised here. ids: your own int ids (an existing id is replaced), else
        new ones. session / role / metadata / created_at: one for all or one per memory.
        Returns the ids. Nothing is written when any input is invalid.
        """
        self._check_open()
        validate_namespace(namespace)
        if isinstance(texts, str):
            texts = [texts]
        if texts is None:
            if vectors is None:
                raise InvalidInput("add needs texts, vectors, or both")
            n = 1 if np.asarray(vectors).ndim == 1 else len(vectors)
            text_list = [""] * n
        else:
            if not isinstance(texts, (list, tuple)):
                raise InvalidInput(f"texts must be a str or a list of str, got {type(texts).__name__}")
            text_list = list(texts)
            n = len(text_list)
            for i, t in enumerate(text_list):
                if not isinstance(t, str):
                    raise InvalidInput(f"texts[{i}] is {type(t).__name__}, expected str")
                if not t.strip():
                    raise InvalidInput(f"texts[{i}] is empty: give it content or drop it")
                try:
                    t.encode("utf-8")
                except UnicodeEncodeError:
                    raise InvalidInput(f"texts[{i}] is not valid Unicode text (lone surrogates): decode it properly") from None
        if n == 0:
            raise InvalidInput("nothing to add: texts / vectors is empty")
        vecs = self._prepare_vectors(text_list if texts is not None else None, vectors, n)
        if ids is None:
            id_arr = np.array([secrets.randbits(62) + 1 for _ in range(n)], dtype=np.int64)
        else:
            id_arr = np.asarray(ids)
            if id_arr.shape != (n,) or (n and id_arr.dtype.kind not in "iu"):
                raise InvalidInput(f"ids must be {n} integers, got {id_arr.shape} of {id_arr.dtype}")
            if n and (id_arr.min() < 0 or id_arr.max() > _MAX_ID):
                raise InvalidInput("ids must be between 0 and 2**63 - 1")
            id_arr = id_arr.astype(np.int64)
            if len(np.unique(id_arr)) != n:
                raise InvalidInput("ids repeat within one add: give each memory its own id")
        sessions = _per_row(session, n, "session", kind=str)
        roles = _per_row(role, n, "role", kind=str)
        metas = _per_row(metadata, n, "metadata", kind=dict)
        for i, meta in enumerate(metas):
            if meta is not None:
                try:
                    json.dumps(meta)
                except (TypeError, ValueError) as exc:
                    raise InvalidInput(f"metadata[{i}] is not JSON-serialisable ({exc}): keep to str/int/float/bool/list/dict") from None
        created = _timestamps_us(created_at, n)

        def to_hot(hot: HotTier, totals: dict[str, int]) -> bool:
            self.policy.set_sizes(totals)
            self._publish_totals(hot, totals)  # before the rows: a reader sees hot < total, asks cold
            self._place(hot, id_arr, vecs, [namespace] * n, created)
            return True

        self._check_writable()
        with self._lock, self._write_lock():
            bump = self.cold.add(ids=id_arr, vectors=vecs, namespaces=[namespace] * n, texts=text_list,
                                 sessions=sessions, roles=roles, created_at_us=created, metadata=metas)
            self._tick += 1
            for i in range(n):
                self._remember(Memory(int(id_arr[i]), text_list[i], namespace, sessions[i], roles[i],
                                      _to_datetime(int(created[i])), metas[i] or {}))
            # the namespace written into, and those an upsert moved rows out of
            touched = {namespace} | set(bump.namespaces or ()) if bump is not None else {namespace}
            totals = {ns: self.cold.count(ns) for ns in touched}
            done = self._hot_call(lambda hot: to_hot(hot, totals)) is not None
            if not done and self.device != "none":
                self._backlog.update(int(i) for i in id_arr)
                self._bounds.discard(int(i) for i in id_arr)
                self._fold_cold(namespace, id_arr, vecs, created)  # cold-only until the backlog is flushed
            self._after_own_write(bump, hot_side_done=done)
        return [int(i) for i in id_arr]

    def _check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyStore(f"the store at {self.path} is open read-only ({self._opt('read_only')}=True, or its "
                                "folder cannot be written): open it writable to add or delete")

    def _after_own_write(self, bump, *, hot_side_done: bool) -> None:
        """After this process's write (under the write lock): certificates that were current stay current when the
        hot tier got its side of the write in full; the bounds and hot set stay valid when no other process's write
        came between (the write generations say both)."""
        if bump is None:
            return
        if hot_side_done and self._certs is not None and self._hot is not None:
            self._certs.advance(bump, self._epoch)
        if self._writes_seen == bump.writes_before:
            self._writes_seen = bump.writes_before + 1
        else:
            self._invalidate()

    def _write_lock(self, *, wait: bool = True):
        """Serialises commit-then-publish of namespace totals across processes, so the published
        total always belongs to the latest commit. Re-entrant within a thread (add -> reconnect ->
        warm); other threads of this process wait like other processes (flock per open file).
        Yields True once held. wait=False yields False at once when another holder has it: promotions use
        that. A row read from the cold tier and upserted into the hot tier without the lock can land after
        another process's delete took it out of the hot tier and before that delete reached the cold tier,
        leaving the hot tier a row the cold tier no longer has (a resync must then clear and refill the whole
        tier); promotions are an optimisation, so a search skips one rather than wait for a writer."""
        @contextlib.contextmanager
        def held():
            depth = getattr(self._write_held, "depth", 0)
            if depth:
                self._write_held.depth = depth + 1
                try:
                    yield True
                finally:
                    self._write_held.depth = depth
                return
            with open(self.path / ".write.lock", "a+") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    yield False
                    return
                self._write_held.depth = 1
                try:
                    yield True
                finally:
                    self._write_held.depth = 0

        return held()

    def _flush_backlog(self, hot: HotTier) -> None:
        """Inserts rows acknowledged while the hot tier was unreachable (read back from the cold tier)."""
        if not self._backlog:
            return
        backlog, self._backlog = list(self._backlog), set()
        rows = [r for r in self.cold.get(backlog) if r is not None and (self._hotset is None or r["id"] not in self._hotset)]
        self._publish_totals(hot, self.cold.namespace_counts())
        if rows:
            rows.sort(key=lambda r: (r["created_at_us"], r["id"]))
            self._place(hot, np.array([r["id"] for r in rows], dtype=np.int64), np.stack([r["vector"] for r in rows]),
                        [r["namespace"] for r in rows], np.array([r["created_at_us"] for r in rows], dtype=np.int64))

    def delete(self, ids: Sequence[int] | int) -> int:
        """Removes memories from both tiers; returns how many the cold tier held."""
        self._check_open()
        id_arr = _check_ids(ids)
        if id_arr.size == 0:
            return 0
        self._check_writable()
        with self._lock, self._write_lock():
            # the namespaces of the rows, from the cold tier's in-memory mirror: a LanceDB query here
            # would lengthen the section every writing process waits for (benchmarks/soak.py)
            namespaces = set(self.cold.vectors_of(id_arr)["namespace"])
            hot_done = self._hot_call(lambda hot: self._hot_delete(hot, [int(i) for i in id_arr]) or True) is not None
            self._bounds.discard(int(i) for i in id_arr)
            deleted, bump = self.cold.delete_rows(id_arr)
            for i in id_arr:
                self._cache.pop(int(i), None)
                self._backlog.discard(int(i))
            counts = {ns: self.cold.count(ns) for ns in namespaces | set(bump.namespaces or () if bump else ())}
            self.policy.set_sizes(counts)
            published = self._hot_call(lambda hot: self._publish_totals(hot, counts) or True) is not None
            self._after_own_write(bump, hot_side_done=hot_done and published)
        return int(deleted)

    # ---- reads -------------------------------------------------------------------------------

    def _remember(self, memory: Memory) -> None:
        self._cache[memory.id] = memory
        self._cache.move_to_end(memory.id)
        if len(self._cache) > METADATA_CACHE_ROWS:
            self._cache.popitem(last=False)

    def _forget_deleted(self, live_ids: np.ndarray) -> None:
        """Drops cached memories whose rows are gone (deleted by another process; this process's own deletes drop
        theirs at once). Nothing else removes them before the cache is full (METADATA_CACHE_ROWS): in the 8-process
        soak each worker kept every row any search had shown it, half of them deleted since, ~500 B each."""
        if not self._cache:
            return
        cached = np.fromiter(self._cache.keys(), dtype=np.int64, count=len(self._cache))
        for i in cached[~np.isin(cached, live_ids)].tolist():
            del self._cache[i]

    def _memories(self, ids: Iterable[int]) -> dict[int, Memory]:
        ids = [int(i) for i in ids]
        found = {i: self._cache[i] for i in ids if i in self._cache}
        missing = [i for i in ids if i not in found]
        if missing:
            for row in self.cold.get(missing):
                if row is None:
                    continue
                memory = Memory(int(row["id"]), row["text"], row["namespace"], row["session"], row["role"],
                                _to_datetime(int(row["created_at_us"])), row["metadata"] or {})
                self._remember(memory)
                found[memory.id] = memory
        return found

    def get(self, ids: Sequence[int] | int) -> list[Memory | None]:
        """Memories by id, in the order asked (None where absent)."""
        self._check_open()
        id_list = [int(i) for i in _check_ids(ids)]
        found = self._memories(id_list)
        return [found.get(i) for i in id_list]

    def count(self, namespace: str | None = None) -> int:
        self._check_open()
        if namespace is not None:
            validate_namespace(namespace)
        return int(self.cold.count(namespace))

    def _query_vector(self, query: Any) -> np.ndarray:
        if isinstance(query, str):
            if not query.strip():
                raise InvalidInput("the query is empty: search for some text")
            if self.embedder is None:
                raise InvalidInput("this store has no embedder: search with a vector")
            vec = self.embedder([query])[0]
        else:
            vec = np.asarray(query)
            if vec.ndim != 1 or vec.shape[0] != self.dim:
                raise InvalidInput(f"a query vector must have shape ({self.dim},), got {vec.shape}")
            if vec.dtype.kind not in "fiu":
                raise InvalidInput(f"a query vector must be numeric, got dtype {vec.dtype}")
        vec = np.ascontiguousarray(vec, dtype=np.float32)
        if not np.isfinite(vec).all():
            raise InvalidInput("the query vector contains NaN or infinite values")
        norm = float(np.linalg.norm(vec))
        if norm == 0.0:
            raise InvalidInput("the query vector is all zeros")
        return vec / norm

    def _hot_is_complete(self, hot: HotTier, namespace: str | None) -> bool:
        """Rule 1: the hot tier holds every memory of the namespace (every process sees the same counts)."""
        if namespace is None:
            return hot.hot_rows == self.cold.count() and not self._backlog
        hot_rows, total_rows = hot.namespace_rows(namespace_hash(namespace))
        return hot_rows == total_rows and not self._backlog

    def search(self, query: str | np.ndarray, *, k: int = 10, namespace: str | None = None,
               where: str | None = None, hybrid: bool = False, explain: bool = False) -> list[Hit] | SearchReport:
        """The k best memories by cosine similarity (plus the store's Scoring, if any), best first
        (ties by id); each says its tier.

        query: text (embedded) or a (dim,) vector. namespace: only this namespace. where: a SQL
        filter over session / role / created_at / metadata, evaluated by the cold tier.
        The cold tier is skipped by the store's rules, in order: "complete" (the hot tier holds
        every memory of the namespace), "bound" (no cold-only row can reach the top k), and
        "threshold" (hot k-th score >= confidence; approximate). explain=True returns a
        SearchReport (hits, the rule that decided, scores behind it) instead of the hits.
        hybrid=True (text queries only): BM25 over the memory texts fused with the vector ranking
        (reciprocal-rank fusion) by the cold tier, which holds the text index; hits come in fused
        order with their cosine scores, tier "cold", rule "hybrid"; the store's Scoring is not applied.
        """
        self._check_open()
        if hybrid and not isinstance(query, str):
            raise InvalidInput("hybrid=True needs a text query (BM25 ranks texts): pass the query text")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= 256:
            raise InvalidInput(f"k must be an int in 1..256, got {k!r}")
        if namespace is not None:
            validate_namespace(namespace)
        if where is not None and (not isinstance(where, str) or not where.strip()):
            raise InvalidInput("where must be a non-empty SQL filter string, e.g. \"role = 'user'\"")
        t0 = time.perf_counter()
        k = int(k)
        q = self._query_vector(query)
        scoring = self.scoring
        fetch = k if scoring is None else min(256, k * scoring.candidates)
        now_us = time.time_ns() // 1000
        hot_kth: float | None = None
        cold_bound: float | None = None
        if hybrid:
            with self._lock:
                ids, scores = self.cold.search(q, k=k, namespace=namespace, where=where, text=query)
                found = self._memories(int(i) for i in ids)
            hits = [Hit(m.id, m.text, float(sc), "cold", m.namespace, m.session, m.role, m.created_at, m.metadata)
                    for i, sc in zip(ids, scores) if (m := found.get(int(i))) is not None]
            seconds = time.perf_counter() - t0
            self._stats.record("cold", seconds)
            self._rule_stats.record("hybrid", seconds)
            return SearchReport(hits, "hybrid", "cold", None, None, seconds) if explain else hits
        with self._lock:
            self._tick += 1
            if namespace is not None:
                self.policy.observe(namespace, self._tick)
            hot = self._ensure_hot()
            hot_ids: np.ndarray = np.empty(0, dtype=np.int64)
            hot_scores: np.ndarray = np.empty(0, dtype=np.float32)
            rule = "no-hot"
            stale = False
            if hot is not None and where is None:
                try:
                    ns_hash = None if namespace is None else namespace_hash(namespace)
                    # The certificate is read before the hot answer and checked again after it and its counts:
                    # a write that began in between (any process's) sends this search to the cold tier.
                    token = self._certs.check(None if ns_hash is None else slot_of(ns_hash), self._epoch)
                    res = hot.search(q, k=min(fetch, hot.max_k), namespace_hash=ns_hash)
                    hot_ids, hot_scores = res.ids[0, : res.hits], res.scores[0, : res.hits]
                    rule = "cold"
                    if token is not None and "complete" in self.rules and self._hot_is_complete(hot, namespace):
                        rule = "complete"
                    elif "bound" in self.rules or "threshold" in self.rules:
                        hot_kth, unfetched = self._hot_kth(hot_ids, hot_scores, k, min(fetch, hot.max_k), now_us)
                        if "bound" in self.rules and token is not None and self._tracking_ok(hot) \
                                and self._counts_agree(hot, namespace):
                            cold_bound = self._cold_bound(q, namespace, now_us)
                            margin = 1e-5 if hot.dtype == "f32" else 2e-3
                            ceiling = max(cold_bound, unfetched)
                            if ceiling == -np.inf or (hot_kth is not None and hot_kth > ceiling + margin):
                                rule = "bound"
                        if rule == "cold" and "threshold" in self.rules and hot_kth is not None \
                                and hot_kth >= self.confidence:
                            rule = "threshold"
                    stale = token is None or not self._certs.still(token)
                    if stale and rule != "cold":  # even the approximate rule: stale rows may be gone or moved
                        rule = "cold"
                except SidecarUnavailable as exc:
                    self._drop_hot(str(exc))
                    hot, rule = None, "no-hot"
            if rule in ("complete", "bound", "threshold"):
                path = "hot"
                merged = [(float(s), int(i), "hot") for i, s in zip(hot_ids, hot_scores)]
            else:
                path = "hot+cold" if rule == "cold" else "cold"
                cold_ids, cold_scores = self.cold.search(q, k=fetch, namespace=namespace, where=where)
                best: dict[int, tuple[float, str]] = {int(i): (float(s), "cold") for i, s in zip(cold_ids, cold_scores)}
                if not stale:  # certified hot rows are copies of cold ones; uncertified ones may be gone or old
                    for i, s in zip(hot_ids, hot_scores):
                        best[int(i)] = (float(s), "hot")  # the hot copy wins
                merged = [(s, i, tier) for i, (s, tier) in best.items()]
            found = self._memories(i for _, i, _ in merged)
            if scoring is not None:
                merged = [(scoring.score(s, found[i], now_us), i, tier) for s, i, tier in merged if i in found]
            merged.sort(key=lambda t: (-t[0], t[1]))
            merged = merged[:k]
            if self._hotset is not None:
                half_life = self.policy.half_life if isinstance(self.policy, LFU) else None
                self._hotset.use((i for _, i, tier in merged if tier == "hot"), self._tick, half_life)
            if path == "hot+cold" and hot is not None:
                if stale:
                    self._repair(namespace)
                if namespace is not None and self.policy.whole_namespace(namespace, self._tick, hot.capacity):
                    self._promote_namespace(namespace)
                elif self.policy.promote:
                    self._promote([i for _, i, tier in merged if tier == "cold"])
                self._tighten(namespace)
        hits = []
        for score, i, tier in merged:
            m = found.get(i)
            if m is None:  # deleted by another process between the two reads
                continue
            hits.append(Hit(m.id, m.text, score, tier, m.namespace, m.session, m.role, m.created_at, m.metadata))
        seconds = time.perf_counter() - t0
        self._stats.record(path, seconds)
        self._rule_stats.record(rule, seconds)
        if explain:
            return SearchReport(hits, rule, path, hot_kth, cold_bound, seconds)
        return hits

    def _hot_kth(self, hot_ids: np.ndarray, hot_scores: np.ndarray, k: int, fetched: int,
                 now_us: int) -> tuple[float | None, float]:
        """(k-th best final score among the hot candidates or None when fewer than k, the most a hot
        row that was not fetched could score: -inf when every hot row of the scope was fetched)."""
        full = len(hot_ids) >= fetched
        if self.scoring is None:
            kth = float(hot_scores[k - 1]) if len(hot_ids) >= k else None
            return kth, -np.inf  # unfetched hot rows score below the k-th raw score
        found = self._memories(int(i) for i in hot_ids)
        finals = sorted((self.scoring.score(float(s), found[int(i)], now_us) for i, s in zip(hot_ids, hot_scores)
                         if int(i) in found), reverse=True)
        kth = finals[k - 1] if len(finals) >= k else None
        unfetched = float(hot_scores[-1]) + self.scoring.max_bonus(None, now_us) if full else -np.inf
        return kth, unfetched

    def _cold_bound(self, q: np.ndarray, namespace: str | None, now_us: int) -> float:
        if self.scoring is None:
            return self._bounds.bound(q, namespace)
        sc = self.scoring
        bound = self._bounds.bound(q, namespace, lambda newest: sc.recency_bonus(newest, now_us))
        return bound + sc.max_boost

    def _counts_agree(self, hot: HotTier, namespace: str | None) -> bool:
        """Rule 2 needs every row that is not hot to be covered: hot rows + cold-only rows we cover
        must equal the published total (catches another process's add in flight or a cold-only delete)."""
        if namespace is None:
            return int(self._signature(hot)[4]) + self._bounds.cold_only_count() == self.cold.count()
        hot_rows, total_rows = hot.namespace_rows(namespace_hash(namespace))
        return total_rows > 0 and hot_rows + self._bounds.cold_only_count(namespace) == total_rows

    def _tighten(self, namespace: str | None) -> None:
        """On the cold path (the disk was read anyway): resync after another process wrote, or
        rebuild a namespace's cones once they cover many rows that left the cold tier."""
        hot = self._hot
        if hot is None or "bound" not in self.rules:
            return
        try:
            if not self._tracking_ok(hot):
                if time.monotonic() >= self._next_resync:
                    self._resync(hot)
                return
            if namespace is not None:
                nb = self._bounds.by_namespace.get(namespace)
                if nb is not None and nb.loose:
                    self._rebuild_bound(namespace)
        except SidecarUnavailable as exc:
            self._drop_hot(str(exc))
        except TieredRecallError as exc:
            self._hot_error = str(exc)
            self._invalidate()

    def _repair(self, namespace: str | None) -> None:
        """On the cold path of a search that found its slot stale (another process wrote to the cold tier without
        this hot tier, or a write's hot side failed): brings the hot rows of the slot's namespaces (all of them, for
        a search over every namespace) back in line with the cold tier and certifies them (certificates.repair).
        Skipped while a writer holds the lock, like a promotion, and paced like a resync."""
        hot = self._hot
        if hot is None or time.monotonic() < self._next_repair:
            return
        slot = None if namespace is None else slot_of(namespace_hash(namespace))
        with self._write_lock(wait=False) as got:
            if not got or self._certs.check(slot, self._epoch) is not None:
                return  # a writer is at work, or another process repaired it meanwhile
            started = time.monotonic()
            try:
                repair(hot, self.cold, self._certs, self._epoch, slot)
            except SidecarUnavailable as exc:
                self._drop_hot(str(exc))
            except TieredRecallError as exc:
                self._hot_error = str(exc)
            finally:
                self._moves["repairs"] += 1
                self._invalidate()  # the repair moved rows under this process's hot set: resync before rule 2
                took = time.monotonic() - started
                self._next_repair = started + max(REPAIR_EVERY_S, took / REPAIR_MAX_SHARE)

    def _promote(self, ids: list[int]) -> None:
        """Cold hits move into the hot tier (the policy makes room)."""
        if not ids:
            return
        with self._write_lock(wait=False) as got:
            if not got:
                return  # a writer is at work: promote on a later cold hit rather than wait (see _write_lock)
            rows = self.cold.vectors_of(ids)
            if len(rows["ids"]):
                self._hot_call(lambda hot: self._place(hot, rows["ids"], rows["vectors"], rows["namespace"],
                                                        rows["created_at_us"], promoted=True))

    def _promote_namespace(self, namespace: str) -> None:
        """Loads every row of a namespace the policy keeps whole into the hot tier (when it fits)."""
        with self._write_lock(wait=False) as got:
            if got:
                self._promote_namespace_locked(namespace)

    def _promote_namespace_locked(self, namespace: str) -> None:
        hs = self._hotset
        total = self.cold.count(namespace)
        if hs is None or total == 0 or total > hs.capacity or hs.per_namespace.get(namespace, 0) >= total:
            return
        rows = self.cold.recent(total, namespace=namespace)
        keep = np.array([int(i) not in hs for i in rows["ids"]], dtype=bool)
        if not keep.any():
            return
        ids, vecs, created = rows["ids"][keep], rows["vectors"][keep], rows["created_at_us"][keep]
        order = np.lexsort((ids, created))  # oldest first: a batch's newest rows win any shortfall
        self._hot_call(lambda hot: self._place(hot, ids[order], vecs[order], [namespace] * len(order),
                                                created[order], promoted=True))

    def stats(self) -> dict:
        """Rows per tier, how often the hot tier answered alone, and latency per search path."""
        self._check_open()
        paths = self._stats.summary()
        searches = sum(v["searches"] for v in paths.values())
        hot_only = paths.get("hot", {}).get("searches", 0)
        hot = self._ensure_hot()
        return {
            "path": str(self.path),
            "dim": self.dim,
            "embedder": self.embedder.name if self.embedder is not None else None,
            "cold_rows": int(self.cold.count()),
            "hot_rows": hot.hot_rows if hot is not None else 0,
            "hot_capacity": int(hot.capacity) if hot is not None else 0,
            "hot_backend": hot.backend if hot is not None else None,
            "hot_error": self._hot_error if hot is None else None,
            "hot_warnings": list(self._hot_warnings),
            "read_only": self.read_only,
            "hot_certified": (hot is not None and self._certs.check(None, self._epoch) is not None),
            "namespaces": self.cold.namespace_counts(),
            "searches": searches,
            "hot_hit_rate": (hot_only / searches) if searches else None,
            "latency": paths,
            "rules": self._rule_stats.summary(),
            "rows_moved": dict(self._moves),
            "cached_memories": len(self._cache),  # texts and metadata of rows searches returned (METADATA_CACHE_ROWS)
            "policy": self.policy.describe(),
            "bounds": self._bounds.stats(),
            "sidecar": hot.stats() if hot is not None else None,
        }

    # ---- life cycle --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidInput("this TieredMemory is closed: open the store again")

    def close(self) -> None:
        """Detaches from the sidecar (it exits by itself once no process uses it) and closes the cold tier."""
        if self._closed:
            return
        if self._backlog:  # rows acknowledged while the sidecar was down: hand them over before leaving
            with self._lock:
                self._next_hot_try = 0.0
                self._hot_call(self._flush_backlog)
        self._closed = True
        if self._hot is not None:
            self._hot.close()
            self._hot = None
        self.cold.close()
        if self._certs is not None:
            self._certs.close()

    def __enter__(self) -> "TieredMemory":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TieredMemory(path={str(self.path)!r}, dim={self.dim})"
