"""TieredMemory: the public API of a store, a facade over its parts: the checks of every argument (validate.py),
the folder (store_folder.py), the cold tier, the link to the sidecar (link.py), the placement policy (placement.py),
the search path (search.py, decided by planner.py), the memory cache (records.py) and the expiry sweep (expiry.py)."""
from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ..embedders import E5Embedder, Embedder, resolve_embedder, spec_of_stored_name
from ..errors import InvalidInput, ReadOnlyStore, SidecarUnavailable
from ..hot import code_bytes_a_row
from ..namespaces import namespace_hash, select_namespaces
from ..policies import Policy, resolve_policy
from ..scoring import Scoring
from ..spelling import option_set
from ..sync import Rows, StoreWriteLock, encode_metadata
from . import validate as check
from .expiry import DEFAULT_SWEEP_S, ExpirySweeper, refreshed, sweep_expired
from .link import HotLink, backend_for, require_cuda
from .metrics import MetricsRecorder, StoreMetrics, span, tracing
from .placement import Placement, publish_totals
from .presets import PRESET_EMBEDDER, PRESET_OF_EMBEDDER_NAME, Preset, resolve_preset
from .records import EXPIRES_KEY, TTL_KEY, Hit, Memory, MemoryCache, SearchReport, make_memory, memory_of
from .search import TieredSearch, query_vector
from .stages import Stages, prime_texts
from .store_folder import COLD_FOLDER, default_store_path, settle_config, settle_read_only, stored_embedder_name

DEFAULT_HOT_CAPACITY = 100_000
ORPHAN_GRACE_S = 10.0
_ROW_OVERHEAD_BYTES = 24  # id, namespace hash, created_at per hot row
# How messages name the options of TieredMemory(...); the CLI passes its own flags.
API_OPTION_NAMES = {"device": "device", "hot_capacity": "hot_capacity", "read_only": "read_only"}
# A sidecar polls for a while after each answer (its --idle-spin-us, 2 ms by default), betting that the next search
# follows at once. Beside E5, whose query takes milliseconds on the same cores (onnxruntime) or the same GPU (torch:
# the persistent kernel holds every SM while it polls), most of that polling only delays the next query's embedding;
# a sidecar started for an E5 store polls long enough for searches by vector that follow each other, then sleeps.
SIDECAR_SPIN_BESIDE_E5_US = 250
# A store of at most this many memories builds its BM25 index in the background at open, for the first text search:
# the build holds the cold tier's lock (every search waits for it), a few hundred milliseconds at this size.
TEXT_INDEX_WARM_MAX_ROWS = 50_000
# A text search asks the sidecar to stay awake this many of its recent query embeddings, plus the margin: long enough
# for most, and the sidecar polls on no longer than that after the search.
EXPECT_EMBEDDING_FACTOR = 1.5
EXPECT_MARGIN_S = 0.0002
CHECKED_NAMES_KEPT = 4096  # namespace names a store remembers as checked (a search checks a new one once)


class TieredMemory:
    """A memory store: a hot tier in a sidecar (GPU or CPU) over a durable LanceDB cold tier.

    TieredMemory(path=None, *, preset=None, dim=None, embedder=<the preset's>, hot_capacity=None, device="auto",
                 policy="lru", hot_capacity_bytes=None, rules=("complete", "bound"), confidence=None, scoring=None,
                 read_only=None)

    path: folder of the store (created with mode 0700); None: the user's own store (default_store_path()).
    preset: "quality" (the default: E5 embeddings, keyword match, neighbouring turns) or "fast" (WordLlama, the same
    stages), a tiered_recall.Preset, or None (a store's recorded embedder picks its preset, else "quality");
    docs/recall.md gives their recall and latency. dim: vector width; taken from the embedder or the existing store
    when None. embedder: the preset's by default (for an existing store, the one it was made with), or "e5",
    "wordllama", "minilm", an Embedder (embed_queries / embed_passages), any callable texts -> (n, d) float32, or
    None to add and search raw vectors only.
    hot_capacity: rows the hot tier keeps (None: the running sidecar's, or 100,000 when this process starts it; a
    value that differs from a running sidecar's is logged and reported in stats()["hot_warnings"]);
    hot_capacity_bytes: the same as a byte budget (a row's vector, 24 bytes and, unless codes="off", its 8-bit codes;
    overrides hot_capacity). codes: "int8" (each hot row also kept as 8-bit codes that a search scans first, re-scoring
    from the rows only what can reach the top k: exact, faster on large tiers, docs/tuning.md), "off", or None (the
    sidecar's default, int8) for a sidecar this process starts. policy: "lru",
    "lfu", "recency", "namespace" (whole namespaces kept hot, for rule 1) or a tiered_recall.policies Policy
    (pinning included): which rows stay hot; evicted rows stay in the cold tier.
    device: "auto" (CUDA when a GPU and the CUDA build are present, else CPU; a hot tier that cannot start is
    logged and the store serves from the cold tier), "cpu", "cuda" (an error when it cannot be had), or "none"
    for no hot tier at all. Other processes opening the same path share the same sidecar; every process's
    writes, with a hot tier or without, keep every search exact (docs/skip-rules.md). read_only: True opens an
    existing store for search only (no hot tier; writes raise ReadOnlyStore); None (default) does so by itself,
    with a log line, when the folder cannot be written.
    rules: the skip rules tried in order ("complete", "bound"; both exact); confidence: a float enables rule 3
    ("threshold"; approximate) on the hot k-th score. scoring: a tiered_recall.scoring.Scoring (recency weighting,
    metadata boosts) for the merged candidates. ttl_sweep_s: how often expired memories (add(..., ttl=...)) are
    deleted in the background; a search never returns one whatever the sweep has done. cold_options: where the cold
    tier's LanceDB table lives when not in the folder (table_uri="s3://bucket/prefix", storage_options={...}: what
    LanceDB takes for that store) and how often its log is flushed there (wal_flush_s, wal_flush_rows); the log,
    mirror and hot tier stay in the folder (a cluster's shard: docs/cluster.md).
    """

    def __init__(self, path: str | os.PathLike | None = None, *, preset: str | Preset | None = None,
                 dim: int | None = None, embedder: Any = PRESET_EMBEDDER, hot_capacity: int | None = None,
                 device: str = "auto",
                 timeout_s: float = 5.0, orphan_grace_s: float = ORPHAN_GRACE_S,
                 policy: str | Policy | None = "lru", hot_capacity_bytes: int | None = None,
                 rules: Sequence[str] = ("complete", "bound"), confidence: float | None = None,
                 scoring: Scoring | None = None, read_only: bool | None = None,
                 ttl_sweep_s: float = DEFAULT_SWEEP_S, codes: str | None = None,
                 option_names: dict[str, str] | None = None, cold_options: dict[str, Any] | None = None) -> None:
        from ..storage import ColdStore  # lancedb is imported here, not at package import

        self._option_names = {**API_OPTION_NAMES, **(option_names or {})}
        if device not in check.DEVICES:
            raise InvalidInput(f"{self._opt('device')} must be 'auto', 'cpu', 'cuda' or 'none', got {device!r}")
        requested = check.positive_int(hot_capacity, self._opt("hot_capacity"), optional=True)
        hot_bytes = check.positive_int(hot_capacity_bytes, "hot_capacity_bytes", optional=True)
        if read_only not in (None, True, False):
            raise InvalidInput(f"{self._opt('read_only')} must be True, False or None (decided by whether the "
                               f"folder can be written), got {read_only!r}")
        timeout_s, orphan_grace_s = check.seconds(timeout_s, "timeout_s"), check.seconds(orphan_grace_s,
                                                                                        "orphan_grace_s")
        ttl_sweep_s = check.seconds(ttl_sweep_s, "ttl_sweep_s")
        if codes not in (None, "int8", "off"):
            raise InvalidInput(f"{self._opt('codes')} must be 'int8' (8-bit codes beside the hot rows, scanned first; "
                               f"exact answers), 'off' or None (the sidecar's default), got {codes!r}")
        self.rules, self.confidence = check.rules_and_confidence(rules, confidence)
        if scoring is not None and not isinstance(scoring, Scoring):
            raise InvalidInput("scoring must be a tiered_recall.scoring.Scoring or None")
        self.policy: Policy = resolve_policy(policy)
        self.scoring = scoring if scoring is not None and scoring.active else None
        self.path = Path(path if path is not None else default_store_path()).expanduser().resolve()
        self.read_only = settle_read_only(self.path, read_only, self._opt)
        if self.read_only and device in ("cpu", "cuda"):
            raise InvalidInput(f"the store at {self.path} is read-only, and a read-only store has no hot tier: "
                               f"open it with {option_set(self._opt('device'), 'none')} (or auto), or writable")
        stored = stored_embedder_name(self.path)
        stored_spec = spec_of_stored_name(stored) if stored else None
        self.preset = resolve_preset(preset if preset is not None or stored is None else
                                     PRESET_OF_EMBEDDER_NAME.get(stored))
        if embedder is PRESET_EMBEDDER:
            embedder = stored_spec or self.preset.embedder
        self.embedder: Embedder | None = None if embedder is None else resolve_embedder(embedder)
        self.dim = settle_config(self.path, check.dim(dim), self.embedder, read_only=self.read_only)
        self.device = "none" if self.read_only else device
        if self.device == "cuda":
            require_cuda(self._opt("device"))
        if hot_bytes is not None:
            backend = backend_for(self.device)
            elem = 2 if backend == "cuda" else 4  # the sidecar keeps f16 on CUDA, f32 on CPU
            row = self.dim * elem + _ROW_OVERHEAD_BYTES + (0 if codes == "off" else code_bytes_a_row(self.dim, backend))
            requested = max(1, hot_bytes // row)
        self.hot_capacity = requested or DEFAULT_HOT_CAPACITY
        self.cold = ColdStore(self.path / COLD_FOLDER, dim=self.dim, read_only=self.read_only,
                              **check.cold_options(cold_options))
        self._lock = threading.RLock()
        self._write_lock = StoreWriteLock(self.path)
        self._moves = Counter({k: 0 for k in ("inserted", "promoted", "evicted", "sidecar_evicted", "resyncs",
                                              "bound_rebuilds", "rewarms", "repairs", "promotions_skipped")})
        self._cache = MemoryCache(self.cold)
        self._placement = Placement(self.dim, self.policy, self.cold, self._moves)
        self._link = HotLink(self.path, dim=self.dim, device=self.device, capacity=self.hot_capacity,
                             requested_capacity=requested, timeout_s=timeout_s, orphan_grace_s=orphan_grace_s,
                             cold=self.cold, placement=self._placement, write_lock=self._write_lock,
                             cache=self._cache, moves=self._moves, option=self._opt, codes=codes,
                             idle_spin_us=SIDECAR_SPIN_BESIDE_E5_US if isinstance(self.embedder, E5Embedder) else None)
        self.sidecar_name = self._link.sidecar_name
        self._closed = False
        self._checked_names: dict[str, str] = {}
        self._embedding_s = 0.0  # a query's embedding time, a moving average (how long the sidecar should wait)
        self._attach_at_open(device)
        self._expiry = ExpirySweeper(lambda candidates: sweep_expired(self, candidates), ttl_sweep_s)
        if not self.read_only:
            self._expiry.start()
        self._metrics = MetricsRecorder(self.path, self._gauges, writable=not self.read_only)
        self._search = TieredSearch(self, rules=self.rules, confidence=self.confidence, scoring=self.scoring,
                                    policy=self.policy, cold=self.cold, link=self._link, placement=self._placement,
                                    cache=self._cache, lock=self._lock, write_lock=self._write_lock,
                                    moves=self._moves, expiry=self._expiry, metrics=self._metrics,
                                    refresh=lambda memories: refreshed(self, memories))
        # Other processes' rows, read once in the background: a search that returns them then reads no disk.
        self._closing = False
        self._warmer = threading.Thread(target=self._warm_cache, name="tiered-recall-warm", daemon=True)
        self._warmer.start()

    def _attach_at_open(self, device: str) -> None:
        """The hot tier at open: an error where it was asked for by name and its sidecar fails to start, else a
        warning (a sidecar lost to another process's race or a kill is not that: the store reconnects later)."""
        try:
            self._link.ensure()
            if self.device in ("cpu", "cuda") and self._link.hot is None and self._link.start_failed:
                self._link.retry_soon()  # once more: a start can also fail when another process kills the new sidecar
                time.sleep(0.5)
                self._link.ensure()
            if self.device in ("cpu", "cuda") and self._link.hot is None and self._link.start_failed:
                raise SidecarUnavailable(f"the hot tier ({option_set(self._opt('device'), self.device)}) could not "
                                         f"start: {self._link.error}; open the store with "
                                         f"{option_set(self._opt('device'), 'auto')} to go on without it, or none")
        except BaseException:
            self._link.close()
            self.cold.close()
            raise
        if self._link.hot is None and self.device != "none":
            self._link.warn(f"no hot tier: {self._link.error}; searches are served by the cold tier (exact, "
                            "slower), and the store tries again on later calls")
        if self.read_only and device == "auto":
            import logging

            logging.getLogger("tiered_recall").info(
                "tiered-recall: the store at %s is read-only: searches are served by the cold tier", self.path)

    def _opt(self, name: str) -> str:
        """How the caller spells option `name` (the API keyword, or the CLI's flag)."""
        return self._option_names.get(name, name)

    # ---- writes ------------------------------------------------------------------------------
    def add(self, texts: str | Sequence[str] | None = None, *, vectors: Any = None, namespace: str = "default",
            ids: Sequence[int] | None = None, session: str | Sequence[str | None] | None = None,
            role: str | Sequence[str | None] | None = None, metadata: dict | Sequence[dict | None] | None = None,
            created_at: Any = None, ttl: float | None = None, expires_at: Any = None) -> list[int]:
        """Stores memories; durable in the cold tier when it returns, and found by every search from then on. The
        hot tier gets them before it returns, or, while another process holds the store's write lock, from that
        process, the next search that needs them, or this process when it closes the store.

        texts: one string or a list (stored, and embedded unless vectors are given). vectors: (n, dim) or (dim,)
        floats, normalised here. namespace: a name, or a tuple of labels ("users", "alice"): a hierarchical
        namespace that search(namespace_prefix=...) and list_namespaces see by its labels. ids: your own int ids
        (an existing id is replaced: an upsert), else new ones. session / role / metadata / created_at: one for
        all or one per memory. ttl: seconds until the memories expire (never returned after, deleted by the
        sweep), None for never. expires_at (with ttl; one for all or one per memory): when they expire instead of
        now + ttl, e.g. memories copied from another store keeping their own. Returns the ids. Nothing is written
        when any input is invalid.
        """
        self._check_open()
        started = time.perf_counter()
        namespace = check.namespace(namespace)
        ttl = check.ttl(ttl)
        text_list, n, has_texts = check.texts(texts, vectors)
        if n == 0:
            raise InvalidInput("nothing to add: texts / vectors is empty")
        if vectors is None:
            if self.embedder is None:
                raise InvalidInput("this store has no embedder: pass vectors=... (n, dim) float32")
            vecs = check.embedded_rows(self.embedder.embed_passages(text_list), n, self.dim)
        else:
            vecs = check.unit_rows(vectors, n, self.dim)
        id_arr = check.new_ids(ids, n, lambda: secrets.randbits(62) + 1)
        sessions = check.per_row(session, n, "session", kind=str)
        roles = check.per_row(role, n, "role", kind=str)
        metas = check.metadata(metadata, n)
        for meta in metas:
            if meta and (EXPIRES_KEY in meta or TTL_KEY in meta):
                raise InvalidInput(f"metadata keys {EXPIRES_KEY!r} and {TTL_KEY!r} hold a memory's expiry: use "
                                   "add(..., ttl=seconds) and another key for your own data")
        created = check.timestamps_us(created_at, n)
        if expires_at is not None and ttl is None:
            raise InvalidInput("expires_at goes with ttl (the time to live a refresh starts again): pass both")
        if ttl is not None:
            expires = [time.time_ns() // 1000 + int(ttl * 1e6)] * n if expires_at is None else \
                check.timestamps_us(expires_at, n, "expires_at").tolist()
            metas = [{**(meta or {}), EXPIRES_KEY: int(e), TTL_KEY: ttl} for meta, e in zip(metas, expires)]
        self._check_writable()
        # Every value was checked above, once: the cold tier takes the rows as they are (ColdStore.add_rows).
        rows = Rows(id_arr, vecs, created, [namespace] * n, sessions, roles, text_list,
                    [encode_metadata(meta) for meta in metas])
        # A logged add takes the store's write lock only for the hot side (group commit, sync/group_commit.py); one that
        # bypasses the log holds it throughout, so its hot side keeps its place in the log's order.
        direct = not self.cold.writes_logged(rows=n)
        with self._lock, (self._write_lock.held() if direct else contextlib.nullcontext()):
            bump = self.cold.add_rows(rows, new_ids=ids is None)
            self._placement.tick += 1
            for i in range(n):
                self._cache.remember(make_memory(int(id_arr[i]), text_list[i], namespace, sessions[i], roles[i],
                                                 int(created[i]), metas[i] or {}))

            def own_side(hot) -> None:
                # the namespace written into, and those an upsert moved rows out of
                touched = {namespace} | set(bump.namespaces or ())
                totals = self.cold.counts(touched)
                self.policy.set_sizes(totals)
                publish_totals(hot, totals)  # before the rows: a reader sees hot < total, asks cold
                self._placement.place(hot, id_arr, vecs, [namespace] * n, created)
                self._link.certs.advance(bump, self._link.epoch)

            done = self._link.publish(bump, own_side)
            if not done and self.device != "none":
                self._link.backlog.update(int(i) for i in id_arr)
                self._placement.bounds.discard(int(i) for i in id_arr)
                self._placement.fold_cold(namespace, id_arr, vecs, created)  # cold-only until the backlog goes
            self._link.note_own_write(bump)
        self._metrics.observe_add(n, time.perf_counter() - started)
        if self.embedder is not None and self.preset.stages.reranks:
            prime_texts(text_list)  # after the locks: a text search then never reads a text this process added
        return [int(i) for i in id_arr]

    def delete(self, ids: Sequence[int] | int) -> int:
        """Removes memories from both tiers; returns how many the cold tier held."""
        self._check_open()
        id_arr = check.ids(ids)
        if id_arr.size == 0:
            return 0
        self._check_writable()
        # Every delete's record carries its bump (a logged one, or the note of one that bypassed the log), so its
        # hot side is applied from the log like an add's (sync/group_commit.py).
        direct = not self.cold.writes_logged(delete=True)
        with self._lock, (self._write_lock.held() if direct else contextlib.nullcontext()):
            listed = [int(i) for i in id_arr]
            deleted, bump = self.cold.delete_rows(id_arr)
            self._placement.bounds.discard(listed)
            self._cache.drop(listed)
            self._link.backlog.difference_update(listed)
            self._link.publish(bump)
            self._link.note_own_write(bump)
        return int(deleted)

    @contextlib.contextmanager
    def exclusive_writes(self) -> Iterator[None]:
        """Holds every writer of the store off for the with block (this process's other threads and other
        processes: the store's write lock and the log's locks) while this thread's own adds and deletes go through:
        for a read-then-write that must not interleave with other writers, such as the expiry sweep's."""
        self._check_open()
        with self._lock, self._write_lock.held(), self.cold.writes_paused():
            yield

    @property
    def closed(self) -> bool:
        """True once close() was called."""
        return self._closed

    def _check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyStore(f"the store at {self.path} is open read-only "
                                f"({option_set(self._opt('read_only'), True)}, or its folder cannot be written): open "
                                "it writable to add or delete")

    def pin(self, *, namespace: str | None = None, ids: Sequence[int] | None = None) -> None:
        """Pins a namespace and/or ids: loaded into the hot tier now and never evicted by the policy."""
        self._check_open()
        if namespace is not None:
            namespace = check.namespace(namespace)
            self.policy.pinned_namespaces.add(namespace)
        if ids is not None:
            self.policy.pinned_ids.update(int(i) for i in check.ids(ids))
        with self._lock:
            self._link.call(self._placement.load_pins)

    def unpin(self, *, namespace: str | None = None, ids: Sequence[int] | None = None) -> None:
        """Lets the policy evict these again."""
        self._check_open()
        if namespace is not None:
            self.policy.pinned_namespaces.discard(check.namespace(namespace))
        if ids is not None:
            for i in check.ids(ids):
                self.policy.pinned_ids.discard(int(i))

    # ---- reads -------------------------------------------------------------------------------
    def get(self, ids: Sequence[int] | int, *, refresh_ttl: bool = False) -> list[Memory | None]:
        """Memories by id, in the order asked (None where absent or expired). refresh_ttl=True starts the time to
        live of each memory returned that has one again from now (a write)."""
        self._check_open()
        id_list = [int(i) for i in check.ids(ids)]
        self.cold.follow()  # other processes' replacements reach the cache first
        found = self._cache.lookup(id_list)
        now_us = time.time_ns() // 1000
        expired = [i for i, m in found.items() if m.expired(now_us)]
        if expired:
            self._expiry.found(expired)
            for i in expired:
                del found[i]
        if refresh_ttl:
            found.update(refreshed(self, [m for m in found.values() if m.ttl_s is not None]))
        return [found.get(i) for i in id_list]

    def vectors(self, ids: Sequence[int] | int) -> list[np.ndarray | None]:
        """The stored (unit-length, float32) vectors of memories by id, in the order asked (None where absent): what
        a caller re-ranking hits needs, e.g. maximal marginal relevance."""
        self._check_open()
        id_arr = check.ids(ids)
        if id_arr.size == 0:
            return []
        with self._lock:
            rows = self.cold.vectors_of(id_arr)
        by_id = {int(i): rows["vectors"][j].copy() for j, i in enumerate(rows["ids"])}
        return [by_id.get(int(i)) for i in id_arr]

    def count(self, namespace: str | tuple[str, ...] | None = None) -> int:
        """Memories in the store (of one namespace)."""
        self._check_open()
        return int(self.cold.count(check.optional_namespace(namespace)))

    def namespaces(self) -> dict[str, dict[str, int]]:
        """Every namespace, by name, with its memories and how many of them the hot tier holds now:
        {name: {"memories": n, "hot": h}}."""
        self._check_open()
        hot = self._link.ensure()
        out = {}
        for ns, n in sorted(self.cold.namespace_counts().items()):
            out[ns] = {"memories": int(n), "hot": int(hot.namespace_rows(namespace_hash(ns))[0]) if hot else 0}
        return out

    def list_namespaces(self, *, prefix: Sequence[str] | None = None, suffix: Sequence[str] | None = None,
                        max_depth: int | None = None, limit: int = 100, offset: int = 0) -> list[tuple[str, ...]]:
        """The namespaces holding memories, as tuples of labels, sorted; prefix / suffix: only those whose first /
        last labels are these ("*" matches any label); max_depth: each cut to its first max_depth labels (the cut
        ones listed once); then offset and limit."""
        self._check_open()
        prefix = check.labels_pattern(prefix, "prefix")
        suffix = check.labels_pattern(suffix, "suffix")
        max_depth = check.positive_int(max_depth, "max_depth", optional=True)
        limit = check.positive_int(limit, "limit")
        offset = check.non_negative_int(offset, "offset")
        listed = select_namespaces(self.cold.namespace_counts(), prefix=prefix, suffix=suffix, max_depth=max_depth)
        return listed[offset:offset + limit]

    def memories(self, namespace: str | tuple[str, ...] | None = None, *, batch: int = 1000) -> Iterator[Memory]:
        """Every memory (of one namespace) that has not expired, oldest first, ties by id; read from the cold tier
        in batches (what `tiered-recall export` writes)."""
        self._check_open()
        namespace = check.optional_namespace(namespace)
        batch = check.positive_int(batch, "batch")
        total = self.cold.count(namespace)
        if total == 0:
            return
        rows = self.cold.recent(total, namespace=namespace)
        ids = rows["ids"][np.lexsort((rows["ids"], rows["created_at_us"]))]
        for lo in range(0, ids.shape[0], batch):
            now_us = time.time_ns() // 1000
            for row in self.cold.get(ids[lo:lo + batch]):
                if row is not None:  # deleted by another process meanwhile
                    memory = memory_of(row)
                    if not memory.expired(now_us):
                        yield memory

    def search(self, query: str | np.ndarray, *, k: int = 10, namespace: str | tuple[str, ...] | None = None,
               namespace_prefix: str | Sequence[str] | None = None, where: str | None = None,
               hybrid: bool = False, stages: Stages | bool | None = None, explain: bool = False,
               refresh_ttl: bool = False) -> list[Hit] | SearchReport:
        """The k best memories by cosine similarity (plus the store's Scoring, if any), best first (ties by id);
        each says its tier. Expired memories are never returned.

        query: text (embedded) or a (dim,) vector. namespace: only this namespace (a name or a tuple of labels).
        namespace_prefix: every namespace under these labels (("users",) takes ("users", "alice") and ("users",
        "bob", "notes")), exact through both tiers. where: a SQL filter over id / session / role / created_at /
        metadata (the metadata's JSON text: "metadata LIKE '%chat%'"), evaluated by the cold tier. The cold tier is skipped by the store's rules, in order: "complete"
        (the hot tier holds every memory of the namespace), "bound" (no cold-only row can reach the top k), and
        "threshold" (hot k-th score >= confidence; approximate). explain=True returns a SearchReport (hits, the
        rule that decided, scores behind it) instead of the hits. hybrid=True (text queries only): BM25 over the
        memory texts fused with the vector ranking (reciprocal-rank fusion) by the cold tier, which holds the text
        index; hits come in fused order with their cosine scores, tier "cold", rule "hybrid"; the store's Scoring
        is not applied. stages (text queries): None runs the preset's retrieval stages (keyword match, neighbouring
        turns, temporal cues; docs/recall.md) over an exact pool of candidates, False the vector search alone, a
        Stages those stages; a staged hit's score is the stages' score (best 1), not a cosine. refresh_ttl=True
        starts the time to live of every hit that has one again from now.
        """
        if type(query) is np.ndarray and type(k) is int and type(namespace) is str and namespace_prefix is None \
                and where is None and not hybrid and stages is None and not explain and not refresh_ttl \
                and not self._closed and k >= 1 and not tracing():
            hits = self._search.hot_alone(query, k, self._stored_name(namespace))
            if hits is not None:
                return hits
        self._check_open()
        if hybrid and not isinstance(query, str):
            raise InvalidInput("hybrid=True needs a text query (BM25 ranks texts): pass the query text")
        if stages is not None and not isinstance(stages, (bool, Stages)):
            raise InvalidInput(f"stages must be None (the preset's), False (vector only) or a Stages, got "
                               f"{type(stages).__name__}")
        if isinstance(stages, Stages) and not isinstance(query, str):
            raise InvalidInput("stages=Stages(...) needs a text query (the stages read texts): pass the query text")
        chosen = (self.preset.stages if stages is None or stages is True else stages or None) \
            if isinstance(query, str) and not hybrid else None
        if chosen is not None and not (chosen.bm25_weight or chosen.reranks):
            chosen = None
        k = check.k(k)
        if namespace is not None and namespace_prefix is not None:
            raise InvalidInput("pass namespace=... (one namespace) or namespace_prefix=... (every namespace under "
                               "it), not both")
        namespace = None if namespace is None else check.namespace(namespace)
        prefix = None if namespace_prefix is None else check.namespace(namespace_prefix)
        where = None if where is None else check.where(where)
        if not tracing():  # the usual case: no span to make, nothing to enter
            hits, answer, seconds = self._search_live(query, k, namespace, prefix, where, hybrid, refresh_ttl, chosen)
        else:
            with span("tiered_recall.search", k=k, namespace=namespace or prefix or "", hybrid=hybrid) as traced:
                hits, answer, seconds = self._search_live(query, k, namespace, prefix, where, hybrid, refresh_ttl,
                                                          chosen)
                if traced is not None:
                    traced.set_attribute("rule", answer.rule)
                    traced.set_attribute("path", answer.path)
                    traced.set_attribute("hits", len(hits))
        if explain:
            return SearchReport(hits, answer.rule, answer.path, answer.hot_kth, answer.cold_bound, seconds, chosen)
        return hits

    def _stored_name(self, namespace: str) -> str:
        """A namespace given as a str, checked (InvalidInput as search() raises it) and remembered: a search path
        that checks it once per name."""
        name = self._checked_names.get(namespace)
        if name is None:
            name = check.namespace(namespace)
            if len(self._checked_names) >= CHECKED_NAMES_KEPT:
                self._checked_names.clear()
            self._checked_names[namespace] = name
        return name

    def _search_live(self, query: Any, k: int, namespace: str | None, prefix: str | None, where: str | None,
                     hybrid: bool, refresh_ttl: bool, stages: Stages | None):
        """The query embedded (or checked), then the search path (search.py) over its scope."""
        started = time.perf_counter()
        embedding = isinstance(query, str) and self.embedder is not None
        if embedding:  # the sidecar would fall asleep while the query is embedded, and the search pay its wake-up
            self._link.expect(EXPECT_EMBEDDING_FACTOR * self._embedding_s + EXPECT_MARGIN_S)
        q = query_vector(query, self.embedder, self.dim)
        if embedding:
            self._embedding_s += 0.2 * (time.perf_counter() - started - self._embedding_s)
        return self._search.live(q, query if isinstance(query, str) else None, k, namespace, prefix, where, hybrid,
                                 refresh_ttl, stages, started)

    # ---- reports and life cycle --------------------------------------------------------------
    def stats(self) -> dict:
        """Rows per tier, how often the hot tier answered alone, latency per search path, and what the hot tier
        could not give (hot_error, hot_warnings)."""
        self._check_open()
        paths = self._search.paths.summary()
        searches = sum(v["searches"] for v in paths.values())
        hot_only = paths.get("hot", {}).get("searches", 0)
        hot = self._link.ensure()
        return {
            "path": str(self.path), "dim": self.dim,
            "embedder": self.embedder.name if self.embedder is not None else None,
            "cold_rows": int(self.cold.count()),
            "hot_rows": hot.hot_rows if hot is not None else 0,
            "hot_capacity": int(hot.capacity) if hot is not None else 0,
            "hot_backend": hot.backend if hot is not None else None,
            "hot_error": self._link.error if hot is None else None,
            "hot_warnings": list(self._link.warnings),
            "hot_certified": self._link.certified(),
            "read_only": self.read_only,
            "namespaces": self.cold.namespace_counts(),
            "searches": searches,
            "hot_hit_rate": (hot_only / searches) if searches else None,
            "latency": paths,
            "rules": self._search.rule_seconds.summary(),
            "rows_moved": dict(self._moves),
            # the hot side of logged writes this process applied for every process (group commit)
            "hot_writes": self._link.logged.figures() if self._link.logged is not None else None,
            "expiry": self._expiry.stats(),
            "store_metrics": StoreMetrics(self.path).summary(),  # every process of the store, added up
            "cached_memories": len(self._cache),  # texts and metadata of rows searches returned
            "policy": self.policy.describe(),
            "bounds": self._placement.bounds.stats(),
            "sidecar": hot.stats() if hot is not None else None,
        }

    def _warm_cache(self) -> None:
        import logging

        try:
            self._cache.warm(stop=lambda: self._closing)
            if self.embedder is not None and self.preset.stages.bm25_weight and not self._closing \
                    and self.cold.count() <= TEXT_INDEX_WARM_MAX_ROWS:
                self.cold.warm_text_index()  # the preset's stages read it at the first text search
        except Exception as error:  # the store closed under it, or a read failed: searches fill the cache instead
            if not self._closing:
                logging.getLogger("tiered_recall").debug("tiered-recall: warming the memory cache stopped: %s", error)

    def _gauges(self) -> dict:
        """What the shared metrics report as gauges (read by the metrics thread about once a second)."""
        hot = self._link.hot
        return {"hot_rows": int(hot.hot_rows) if hot is not None else 0, "cold_rows": int(self.cold.count()),
                "log_backlog_bytes": self.cold.log_backlog_bytes(), "sidecar_rewarms": int(self._moves["rewarms"])}

    def _closed_warm_wait(self) -> None:
        """Lets the cache warming finish its batch before the cold tier closes (it stops at the next one)."""
        self._closing = True
        self._warmer.join(timeout=30)

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidInput("this TieredMemory is closed: open the store again")

    def close(self) -> None:
        """Detaches from the sidecar (it exits by itself once no process uses it) and closes the cold tier."""
        if self._closed:
            return
        self._expiry.stop()
        self._metrics.close()
        self._closed_warm_wait()
        with self._lock:
            self._link.close()
        self._closed = True
        self._write_lock.close()
        self.cold.close()

    def __enter__(self) -> "TieredMemory":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TieredMemory(path={str(self.path)!r}, dim={self.dim})"
