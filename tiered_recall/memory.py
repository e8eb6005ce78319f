"""TieredMemory: the coordinator that asks the hot sidecar first, the LanceDB cold tier when it must, and merges."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import subprocess
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from .embedders import Embedder, resolve_embedder
from .errors import InvalidInput, SidecarUnavailable, TieredRecallError
from .namespaces import namespace_hash, validate_namespace
from .sidecar import HotTier, sidecar_executable, start_sidecar

CONFIG_FILE = "tiered_recall.json"
COLD_FOLDER = "cold"
DEFAULT_HOT_CAPACITY = 100_000
ORPHAN_GRACE_S = 10.0
RECONNECT_BACKOFF_S = 1.0
METADATA_CACHE_ROWS = 200_000
_MAX_ID = (1 << 63) - 1


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

    TieredMemory(path="./storage", *, dim=None, embedder="wordllama", hot_capacity=100_000, device="auto")

    path: folder of the store (created with mode 0700). dim: vector width; taken from the embedder
    or the existing store when None. embedder: "wordllama" (default, offline), "minilm", any
    callable texts -> (n, d) float32, or None to add and search raw vectors only. hot_capacity:
    rows the hot tier keeps (least recently used rows are evicted to the cold tier only).
    device: "auto" (CUDA when a GPU and the CUDA build are present, else CPU), "cpu", "cuda", or
    "none" for no hot tier at all. Other processes opening the same path share the same sidecar.
    """

    def __init__(self, path: str | os.PathLike = "./storage", *, dim: int | None = None,
                 embedder: Any = "wordllama", hot_capacity: int = DEFAULT_HOT_CAPACITY, device: str = "auto",
                 timeout_s: float = 5.0, orphan_grace_s: float = ORPHAN_GRACE_S) -> None:
        from .storage import ColdStore  # lancedb is imported here, not at package import

        if device not in ("auto", "cpu", "cuda", "none"):
            raise InvalidInput(f"device must be 'auto', 'cpu', 'cuda' or 'none', got {device!r}")
        if isinstance(hot_capacity, bool) or not isinstance(hot_capacity, (int, np.integer)) or hot_capacity < 1:
            raise InvalidInput(f"hot_capacity must be a positive int (rows), got {hot_capacity!r}")
        self.path = Path(path).expanduser().resolve()
        try:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise InvalidInput(f"cannot create the store folder {self.path}: {exc}") from exc
        self.embedder: Embedder | None = None if embedder is None else resolve_embedder(
            None if embedder == "wordllama" else embedder)
        self.dim = self._settle_config(dim)
        self.hot_capacity = int(hot_capacity)
        self.device = device
        self.timeout_s = float(timeout_s)
        self.orphan_grace_s = float(orphan_grace_s)
        self.cold = ColdStore(self.path / COLD_FOLDER, dim=self.dim)
        digest = hashlib.blake2b(str(self.path).encode(), digest_size=8).hexdigest()
        self.sidecar_name = f"store-{os.getuid()}-{digest}"
        self._lock = threading.RLock()
        self._hot: HotTier | None = None
        self._hot_owner_pid = 0
        self._next_hot_try = 0.0
        self._hot_error: str | None = None
        self._backlog: set[int] = set()  # ids acknowledged while the hot tier was unreachable
        self._cache: OrderedDict[int, Memory] = OrderedDict()
        self._stats = _PathStats()
        self._closed = False
        self._ensure_hot()

    # ---- set-up ------------------------------------------------------------------------------

    def _settle_config(self, dim: int | None) -> int:
        """Reads or writes the store's config so a reopened store keeps its dim and embedder."""
        config_path = self.path / CONFIG_FILE
        embedder_name = self.embedder.name if self.embedder is not None else None
        if dim is not None and (isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1):
            raise InvalidInput(f"dim must be a positive int, got {dim!r}")
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
            if self._hot.alive():
                return self._hot
            self._drop_hot("the sidecar stopped")
        if time.monotonic() < self._next_hot_try:
            return None
        lock_path = self.path / ".sidecar.lock"
        try:
            with open(lock_path, "a+") as lock_file:
                fcntl.flock(lock_file, fcntl.LOCK_EX)
                started = False
                try:
                    hot = HotTier.attach(self.sidecar_name, dim=self.dim, timeout_s=self.timeout_s)
                except SidecarUnavailable:
                    start_sidecar(self.sidecar_name, dim=self.dim, capacity=self.hot_capacity,
                                  backend=self._backend(), exit_when_orphaned_s=self.orphan_grace_s, detach=True)
                    hot = HotTier.attach(self.sidecar_name, dim=self.dim, timeout_s=self.timeout_s)
                    started = True
                if started or hot.stats()["hot_rows"] == 0:
                    self._warm(hot)
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

    def _warm(self, hot: HotTier) -> None:
        """Fills a fresh hot tier with the most recent rows of the cold tier and publishes totals."""
        recent = self.cold.recent(hot.capacity)
        ids = recent["ids"]
        if len(ids):
            order = np.arange(len(ids))[::-1]  # oldest first, so the newest end most recently used
            hashes = np.array([namespace_hash(ns) for ns in recent["namespace"]], dtype=np.uint64)
            hot.upsert(ids[order], recent["vectors"][order], hashes[order],
                       created_at_us=recent["created_at_us"][order])
        self._publish_totals(hot, self.cold.namespace_counts())

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
        h = namespace_hash(namespace)

        def to_hot(hot: HotTier, total: int) -> bool:
            hot.set_namespace_totals({h: total})  # before the rows: a reader sees hot < total, asks cold
            keep = slice(max(0, n - hot.capacity), n)  # a batch larger than the tier: its newest rows
            hot.upsert(id_arr[keep], vecs[keep], h, created_at_us=created[keep])
            return True

        with self._lock, self._write_lock():
            self.cold.add(ids=id_arr, vectors=vecs, namespaces=[namespace] * n, texts=text_list, sessions=sessions,
                          roles=roles, created_at_us=created, metadata=metas)
            for i in range(n):
                self._remember(Memory(int(id_arr[i]), text_list[i], namespace, sessions[i], roles[i],
                                      _to_datetime(int(created[i])), metas[i] or {}))
            total = self.cold.count(namespace)
            if self._hot_call(lambda hot: to_hot(hot, total)) is None and self.device != "none":
                self._backlog.update(int(i) for i in id_arr)
        return [int(i) for i in id_arr]

    def _write_lock(self):
        """Serialises commit-then-publish of namespace totals across processes, so the published
        total always belongs to the latest commit."""
        import contextlib

        @contextlib.contextmanager
        def held():
            with open(self.path / ".write.lock", "a+") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                yield

        return held()

    def _flush_backlog(self, hot: HotTier) -> None:
        """Inserts rows acknowledged while the hot tier was unreachable (read back from the cold tier)."""
        if not self._backlog:
            return
        backlog, self._backlog = list(self._backlog), set()
        rows = [r for r in self.cold.get(backlog) if r is not None]
        if rows:
            hot.upsert([r["id"] for r in rows], np.stack([r["vector"] for r in rows]),
                       [namespace_hash(r["namespace"]) for r in rows],
                       created_at_us=[r["created_at_us"] for r in rows])
        self._publish_totals(hot, self.cold.namespace_counts())

    def delete(self, ids: Sequence[int] | int) -> int:
        """Removes memories from both tiers; returns how many the cold tier held."""
        self._check_open()
        id_arr = np.atleast_1d(np.asarray(ids))
        if id_arr.ndim != 1 or (id_arr.size and id_arr.dtype.kind not in "iu"):
            raise InvalidInput("ids must be an int or a list of ints")
        id_arr = id_arr.astype(np.int64)
        if id_arr.size == 0:
            return 0
        with self._lock, self._write_lock():
            namespaces = {r["namespace"] for r in self.cold.get(id_arr) if r is not None}
            self._hot_call(lambda hot: hot.delete(id_arr))
            deleted = self.cold.delete(id_arr)
            for i in id_arr:
                self._cache.pop(int(i), None)
                self._backlog.discard(int(i))
            counts = {ns: self.cold.count(ns) for ns in namespaces}
            self._hot_call(lambda hot: self._publish_totals(hot, counts))
        return int(deleted)

    # ---- reads -------------------------------------------------------------------------------

    def _remember(self, memory: Memory) -> None:
        self._cache[memory.id] = memory
        self._cache.move_to_end(memory.id)
        if len(self._cache) > METADATA_CACHE_ROWS:
            self._cache.popitem(last=False)

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
        id_list = [int(i) for i in np.atleast_1d(np.asarray(ids, dtype=np.int64))]
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
            return hot.stats()["hot_rows"] == self.cold.count() and not self._backlog
        hot_rows, total_rows = hot.namespace_rows(namespace_hash(namespace))
        return hot_rows == total_rows and not self._backlog

    def search(self, query: str | np.ndarray, *, k: int = 10, namespace: str | None = None,
               where: str | None = None) -> list[Hit]:
        """The k best memories by cosine similarity, best first (ties by id); each says its tier.

        query: text (embedded) or a (dim,) vector. namespace: only this namespace. where: a SQL
        filter over session / role / created_at / metadata, evaluated by the cold tier.
        The cold tier is skipped when the hot tier holds every memory of the namespace asked.
        """
        self._check_open()
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= 256:
            raise InvalidInput(f"k must be an int in 1..256, got {k!r}")
        if namespace is not None:
            validate_namespace(namespace)
        if where is not None and (not isinstance(where, str) or not where.strip()):
            raise InvalidInput("where must be a non-empty SQL filter string, e.g. \"role = 'user'\"")
        t0 = time.perf_counter()
        q = self._query_vector(query)
        with self._lock:
            hot = self._ensure_hot()
            hot_ids: np.ndarray = np.empty(0, dtype=np.int64)
            hot_scores: np.ndarray = np.empty(0, dtype=np.float32)
            complete = False
            if hot is not None and where is None:
                try:
                    res = hot.search(q, k=int(k), namespace_hash=None if namespace is None else namespace_hash(namespace))
                    hot_ids, hot_scores = res.ids[0, : res.hits], res.scores[0, : res.hits]
                    complete = self._hot_is_complete(hot, namespace)
                except SidecarUnavailable as exc:
                    self._drop_hot(str(exc))
            if complete:
                path = "hot"
                merged = [(float(s), int(i), "hot") for i, s in zip(hot_ids, hot_scores)]
            else:
                path = "hot+cold" if hot is not None and where is None else "cold"
                cold_ids, cold_scores = self.cold.search(q, k=int(k), namespace=namespace, where=where)
                best: dict[int, tuple[float, str]] = {int(i): (float(s), "cold") for i, s in zip(cold_ids, cold_scores)}
                for i, s in zip(hot_ids, hot_scores):
                    best[int(i)] = (float(s), "hot")  # the hot copy wins
                merged = [(s, i, tier) for i, (s, tier) in best.items()]
            merged.sort(key=lambda t: (-t[0], t[1]))
            merged = merged[: int(k)]
            found = self._memories(i for _, i, _ in merged)
            if path != "hot" and hot is not None:
                self._promote([i for _, i, tier in merged if tier == "cold"])
        hits = []
        for score, i, tier in merged:
            m = found.get(i)
            if m is None:  # deleted by another process between the two reads
                continue
            hits.append(Hit(m.id, m.text, score, tier, m.namespace, m.session, m.role, m.created_at, m.metadata))
        self._stats.record(path, time.perf_counter() - t0)
        return hits

    def _promote(self, ids: list[int]) -> None:
        """Cold hits move into the hot tier (most recently used now)."""
        if not ids:
            return
        rows = [r for r in self.cold.get(ids) if r is not None]
        if rows:
            self._hot_call(lambda hot: hot.upsert([r["id"] for r in rows], np.stack([r["vector"] for r in rows]),
                                                  [namespace_hash(r["namespace"]) for r in rows],
                                                  created_at_us=[r["created_at_us"] for r in rows]))

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
            "hot_rows": int(hot.stats()["hot_rows"]) if hot is not None else 0,
            "hot_capacity": int(hot.capacity) if hot is not None else 0,
            "hot_backend": hot.backend if hot is not None else None,
            "hot_error": self._hot_error if hot is None else None,
            "namespaces": self.cold.namespace_counts(),
            "searches": searches,
            "hot_hit_rate": (hot_only / searches) if searches else None,
            "latency": paths,
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
        self._closed = True
        if self._hot is not None:
            self._hot.close()
            self._hot = None
        self.cold.close()

    def __enter__(self) -> "TieredMemory":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TieredMemory(path={str(self.path)!r}, dim={self.dim})"
