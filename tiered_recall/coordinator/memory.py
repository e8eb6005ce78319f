"""TieredMemory: the public API of a store, a facade that asks the hot sidecar first, the LanceDB cold tier when it
must, and merges (the parts: link.py, placement.py, rules.py, validate.py, records.py, store_folder.py)."""
from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ..embedders import E5Embedder, Embedder, resolve_embedder, spec_of_stored_name
from ..errors import InvalidInput, ReadOnlyStore, SidecarUnavailable, TieredRecallError
from ..namespaces import namespace_hash, select_namespaces, under_prefix
from ..policies import Policy, resolve_policy
from ..scoring import Scoring
from . import rules as R
from . import validate as check
from .link import HotLink, backend_for, publish_totals, require_cuda
from .placement import Placement
from .expiry import DEFAULT_SWEEP_S, ExpirySweeper, refreshed, sweep_expired
from .metrics import MetricsRecorder, StoreMetrics, span, tracing
from .records import EXPIRES_KEY, TTL_KEY, Hit, Memory, MemoryCache, PathStats, SearchReport, hit_of, make_memory, memory_of
from .presets import PRESET_EMBEDDER, PRESET_OF_EMBEDDER_NAME, Preset, resolve_preset
from .stages import Candidate, Stages, fuse, rerank
from .store_folder import COLD_FOLDER, default_store_path, settle_config, settle_read_only, stored_embedder_name
from .write_lock import StoreWriteLock

DEFAULT_HOT_CAPACITY = 100_000
ORPHAN_GRACE_S = 10.0
_ROW_OVERHEAD_BYTES = 24  # id, namespace hash, created_at per hot row
# How messages name the options of TieredMemory(...); the CLI passes its own flags.
API_OPTION_NAMES = {"device": "device", "hot_capacity": "hot_capacity", "read_only": "read_only"}
# A prefix search over at most this many namespaces searches each (hot tier and skip rules included) and merges the
# answers; over more it is one cold-tier search filtered to the namespaces (docs/frameworks.md gives the figures).
PREFIX_FANOUT_MAX = 64
# A CPU sidecar with no spare core (HotTier.no_spare_core): a scope whose exact scan of this process's mirror reads at
# most this many elements (rows x dim; 1 MiB of float32, about 0.1 ms of numpy) is answered from the mirror, since the
# round trip then costs a wait for a core and its context switches. Larger scopes still go to the sidecar.
OWN_COPY_SCAN_MAX_ELEMENTS = 1 << 18
# A sidecar polls for a while after each answer (its --idle-spin-us, 2 ms by default), betting that the next search
# follows at once. Beside E5, whose query takes milliseconds on the same cores (onnxruntime) or the same GPU (torch:
# the persistent kernel holds every SM while it polls), most of that polling only delays the next query's embedding;
# a sidecar started for an E5 store polls long enough for searches by vector that follow each other, then sleeps.
SIDECAR_SPIN_BESIDE_E5_US = 250


def _within(names: list[str], where: str | None) -> str:
    """A cold-tier filter to these namespaces (at least one), and to `where` when given."""
    listed = "namespace IN (" + ", ".join(R.sql_string(n) for n in names) + ")"
    return listed if where is None else f"({where}) AND {listed}"


@dataclass
class _HotAnswer:
    """The hot side of one search: its candidates, the rule that decided, whether they may be trusted, and whether
    the hot tier was asked at all."""

    ids: np.ndarray
    scores: np.ndarray
    rule: str
    trusted: bool
    hot_kth: float | None = None
    cold_bound: float | None = None
    asked: bool = True


class TieredMemory:
    """A memory store: a hot tier in a sidecar (GPU or CPU) over a durable LanceDB cold tier.

    TieredMemory(path=None, *, preset=None, dim=None, embedder=<the preset's>, hot_capacity=None, device="auto",
                 policy="lru", hot_capacity_bytes=None, rules=("complete", "bound"), confidence=None, scoring=None,
                 read_only=None)

    path: folder of the store (created with mode 0700); None: the user's own store (default_store_path()).
    preset: "quality" (the default: E5 embeddings, BM25 fusion, neighbouring turns) or "fast" (WordLlama, the same
    stages), a tiered_recall.Preset, or None (a store's recorded embedder picks its preset, else "quality");
    docs/recall.md gives their recall and latency. dim: vector width; taken from the embedder or the existing store
    when None. embedder: the preset's by default (for an existing store, the one it was made with), or "e5",
    "wordllama", "minilm", an Embedder (embed_queries / embed_passages), any callable texts -> (n, d) float32, or
    None to add and search raw vectors only.
    hot_capacity: rows the hot tier keeps (None: the running sidecar's, or 100,000 when this process starts it; a
    value that differs from a running sidecar's is logged and reported in stats()["hot_warnings"]);
    hot_capacity_bytes: the same as a byte budget (vector + 24 bytes a row; overrides hot_capacity). policy: "lru",
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
                 ttl_sweep_s: float = DEFAULT_SWEEP_S, option_names: dict[str, str] | None = None,
                 cold_options: dict[str, Any] | None = None) -> None:
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
        self.rules, self.confidence = check.rules_and_confidence(rules, confidence)
        if scoring is not None and not isinstance(scoring, Scoring):
            raise InvalidInput("scoring must be a tiered_recall.scoring.Scoring or None")
        self.policy: Policy = resolve_policy(policy)
        self.scoring = scoring if scoring is not None and scoring.active else None
        self.path = Path(path if path is not None else default_store_path()).expanduser().resolve()
        self.read_only = settle_read_only(self.path, read_only, self._opt)
        if self.read_only and device in ("cpu", "cuda"):
            raise InvalidInput(f"the store at {self.path} is read-only, and a read-only store has no hot tier: "
                               f"open it with {self._opt('device')}='none' (or 'auto'), or writable")
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
            elem = 2 if backend_for(self.device) == "cuda" else 4  # the sidecar keeps f16 on CUDA, f32 on CPU
            requested = max(1, hot_bytes // (self.dim * elem + _ROW_OVERHEAD_BYTES))
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
                             cache=self._cache, moves=self._moves, option=self._opt,
                             idle_spin_us=SIDECAR_SPIN_BESIDE_E5_US if isinstance(self.embedder, E5Embedder) else None)
        self.sidecar_name = self._link.sidecar_name
        self._stats, self._rule_stats = PathStats(), PathStats()
        self._closed = False
        self._attach_at_open(device)
        self._expiry = ExpirySweeper(lambda candidates: sweep_expired(self, candidates), ttl_sweep_s)
        if not self.read_only:
            self._expiry.start()
        self._metrics = MetricsRecorder(self.path, self._gauges, writable=not self.read_only)
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
                raise SidecarUnavailable(f"the hot tier ({self._opt('device')}={self.device!r}) could not start: "
                                         f"{self._link.error}; open the store with {self._opt('device')}='auto' to "
                                         "go on without it, or 'none'")
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
        # A logged add takes the store's write lock only for the hot side (group commit, hot_writes.py); one that
        # bypasses the log holds it throughout, so its hot side keeps its place in the log's order.
        direct = not self.cold.writes_logged(rows=n)
        with self._lock, (self._write_lock.held() if direct else contextlib.nullcontext()):
            bump = self.cold.add(ids=id_arr, vectors=vecs, namespaces=[namespace] * n, texts=text_list,
                                 sessions=sessions, roles=roles, created_at_us=created, metadata=metas,
                                 new_ids=ids is None)
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
        return [int(i) for i in id_arr]

    def delete(self, ids: Sequence[int] | int) -> int:
        """Removes memories from both tiers; returns how many the cold tier held."""
        self._check_open()
        id_arr = check.ids(ids)
        if id_arr.size == 0:
            return 0
        self._check_writable()
        # Every delete's record carries its bump (a logged one, or the note of one that bypassed the log), so its
        # hot side is applied from the log like an add's (hot_writes.py).
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

    def _check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyStore(f"the store at {self.path} is open read-only ({self._opt('read_only')}=True, or its "
                                "folder cannot be written): open it writable to add or delete")

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
        is not applied. stages (text queries): None runs the preset's retrieval stages (BM25 fusion, neighbouring
        turns, temporal cues; docs/recall.md) over an exact pool of candidates, False the vector search alone, a
        Stages those stages; a staged hit's score is the stages' score (best 1), not a cosine. refresh_ttl=True
        starts the time to live of every hit that has one again from now.
        """
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

    def _search_live(self, query: Any, k: int, namespace: str | None, prefix: str | None, where: str | None,
                     hybrid: bool, refresh_ttl: bool, stages: Stages | None = None
                     ) -> tuple[list[Hit], R.Answer, float]:
        """The k best live memories (expired ones stepped over by searching deeper), the answer that decided them,
        and the seconds it took; recorded in the store's metrics."""
        t0 = time.perf_counter()
        q = self._query_vector(query)
        text = query if hybrid else None
        fetch = k
        while True:
            if stages is not None:
                answer = self._search_staged(q, query, fetch, namespace, prefix, where, stages)
            elif prefix is None and text is None:
                answer = self._search_one(q, fetch, namespace, where)
            else:
                answer = self._search_scope(q, text, fetch, namespace, prefix, where)
            now_us = time.time_ns() // 1000
            expired = [h.id for h in answer.hits if h.expires_at is not None and
                       h.expires_at.timestamp() * 1e6 <= now_us]
            if not expired:
                break
            self._expiry.found(expired)
            if len(answer.hits) < fetch:  # every live memory of the scope is in this answer
                break
            if fetch >= check.MAX_K:  # as deep as a search goes: delete them now, then search again
                if self.read_only:
                    break
                self._expiry.run_once()
                fetch = k
                continue
            fetch = min(check.MAX_K, max(2 * fetch, k + 2 * len(expired)))
        if expired:
            gone = set(expired)
            hits = [h for h in answer.hits if h.id not in gone][:k]
        else:
            hits = answer.hits[:k]
        if refresh_ttl and any(h.ttl_s is not None for h in hits):
            fresh = refreshed(self, [m for m in self.get([h.id for h in hits if h.ttl_s is not None])
                                     if m is not None])
            hits = [hit_of(fresh[h.id], h.score, h.tier) if h.id in fresh else h for h in hits]
        seconds = time.perf_counter() - t0
        self._stats.record(answer.path, seconds)
        self._rule_stats.record(answer.rule, seconds)
        self._metrics.observe_search(answer.path, answer.rule, seconds)
        return hits, answer, seconds

    def _search_scope(self, q: np.ndarray, text: str | None, k: int, namespace: str | None, prefix: str | None,
                      where: str | None) -> R.Answer:
        """One search of a namespace, of every namespace under a prefix, or of the whole store."""
        if prefix is None:
            return self._search_hybrid(q, text, k, namespace, where) if text is not None else \
                self._search_one(q, k, namespace, where)
        names = self._names_under(prefix)
        if not names:
            return R.Answer([], "cold", "cold", None, None)
        if text is None and where is None and len(names) <= PREFIX_FANOUT_MAX:
            # Each namespace's answer is exact, so the best k of their union are the scope's best k.
            return R.union_of_answers([self._search_one(q, k, name, None) for name in names], k)
        scoped = _within(names, where)
        return self._search_hybrid(q, text, k, None, scoped) if text is not None else \
            self._search_one(q, k, None, scoped)

    def _names_under(self, prefix: str) -> list[str]:
        """The store's namespaces under a prefix, sorted."""
        return sorted(n for n in self.cold.namespace_counts() if under_prefix(n, prefix))

    def _search_staged(self, q: np.ndarray, text: str, k: int, namespace: str | None, prefix: str | None,
                       where: str | None, stages: Stages) -> R.Answer:
        """The retrieval stages over an exact pool: the tiered vector search's best `pool` (the skip rules hold for
        it), fused with the cold tier's BM25 ranking when the stages ask, then re-ranked (coordinator/stages.py). The
        placement policy is told of the hits returned, not of the whole pool."""
        depth = max(stages.pool, k)
        ranking_depth = max(stages.depth, depth) if stages.bm25_weight else depth  # fused this deep, then pooled
        if prefix is None:
            ranked, memories, answer, path = self._ranked_one(q, ranking_depth, namespace, where, use=False)
            vector = [(i, score, tier) for score, i, tier in ranked if i in memories]
            rule, hot_kth, cold_bound = answer.rule, answer.hot_kth, answer.cold_bound
        else:
            scoped_answer = self._search_scope(q, None, ranking_depth, namespace, prefix, where)
            memories = {hit.id: hit for hit in scoped_answer.hits}
            vector = [(hit.id, hit.score, hit.tier) for hit in scoped_answer.hits]
            rule, path = scoped_answer.rule, scoped_answer.path
            hot_kth, cold_bound = scoped_answer.hot_kth, scoped_answer.cold_bound
        tier_of = {i: tier for i, _, tier in vector}
        if stages.bm25_weight:
            names = None if prefix is None else self._names_under(prefix)
            keyword_ids = [] if names == [] else self.cold.text_search(
                text, k=ranking_depth, namespace=namespace, where=where if names is None else _within(names, where)
            )[0].tolist()
            fused = fuse([i for i, _, _ in vector], keyword_ids, stages.bm25_weight)
            pooled = sorted(fused.items(), key=lambda item: (-item[1], item[0]))[:depth]
            missing = [i for i, _ in pooled if i not in memories]
            if missing:  # ranked by BM25 alone; the vector pool's expired memories are the caller's to step over
                with self._lock:
                    found = self._cache.lookup(missing)
                now_us = time.time_ns() // 1000
                memories.update((i, m) for i, m in found.items() if not m.expired(now_us))
        else:
            pooled = [(i, score) for i, score, _ in vector[:depth]]
        candidates = [Candidate(i, score, (m := memories[i]).text, m.session, m.metadata)
                      for i, score in pooled if i in memories]
        chosen = rerank(candidates, text, k, stages)
        with self._lock:
            self._placement.use(c.id for c, _ in chosen if tier_of.get(c.id) == "hot")
        hits = [hit_of(memories[c.id], score, tier_of.get(c.id, "cold")) for c, score in chosen]
        return R.Answer(hits, rule, path, hot_kth, cold_bound)

    def _search_one(self, q: np.ndarray, k: int, namespace: str | None, where: str | None) -> R.Answer:
        """The tiered search of one scope (a namespace, or all): the hot tier, the skip rules, the cold tier when
        no rule proves the hot answer exact, the merge and the ranking."""
        ranked, found, answer, path = self._ranked_one(q, k, namespace, where, use=True)
        hits = [hit_of(m, score, tier) for score, i, tier in ranked if (m := found.get(i)) is not None]
        return R.Answer(hits, answer.rule, path, answer.hot_kth, answer.cold_bound)

    def _ranked_one(self, q: np.ndarray, k: int, namespace: str | None, where: str | None, *,
                    use: bool) -> tuple[list, dict[int, Memory], "_HotAnswer", str]:
        """_search_one's work: the ranked (score, id, tier) triples, the memories by id, the hot answer and the path.
        use=False leaves the placement policy untold (a caller that keeps only some of them tells it itself)."""
        scoring = self.scoring
        fetch = k if scoring is None else min(check.MAX_K, k * scoring.candidates)
        now_us = time.time_ns() // 1000
        with self._lock:
            placement = self._placement
            placement.tick += 1
            if namespace is not None:
                self.policy.observe(namespace, placement.tick)
            hot = self._link.ensure()
            if hot is not None:
                hot.note_work()
            answer = self._hot_answer(hot, q, k, fetch, namespace, now_us) if hot is not None and where is None \
                else _HotAnswer(np.empty(0, np.int64), np.empty(0, np.float32), "no-hot", False)
            hot = self._link.hot
            cold = None if answer.rule in ("complete", "bound", "threshold") else \
                self.cold.search(q, k=fetch, namespace=namespace, where=where)
            candidates = R.merge(answer.ids, answer.scores, None if cold is None else cold[0],
                                 None if cold is None else cold[1], trust_hot=answer.trusted)
            found = self._cache.lookup(i for _, i, _ in candidates)
            ranked = R.rank(candidates, found, scoring, now_us, k)
            if use:
                placement.use(i for _, i, tier in ranked if tier == "hot")
            path = "hot" if cold is None else ("hot+cold" if answer.rule == "cold" and answer.asked else "cold")
            if answer.rule == "cold" and hot is not None:  # not after "no-spare-core": nothing was missed
                self._after_cold_path(hot, namespace, ranked, answer.trusted)
        return ranked, found, answer, path

    def _query_vector(self, query: Any) -> np.ndarray:
        if isinstance(query, str):
            text = check.query_text(query, self.embedder is not None)
            return check.embedded_rows(self.embedder.embed_queries([text]), 1, self.dim)[0]
        return check.unit_query(query, self.dim)

    def _search_hybrid(self, q: np.ndarray, text: str, k: int, namespace: str | None,
                       where: str | None) -> R.Answer:
        with self._lock:
            ids, scores = self.cold.search(q, k=k, namespace=namespace, where=where, text=text)
            found = self._cache.lookup(int(i) for i in ids)
        hits = [hit_of(m, float(sc), "cold") for i, sc in zip(ids, scores) if (m := found.get(int(i))) is not None]
        return R.Answer(hits, "hybrid", "cold", None, None)

    def _hot_answer(self, hot, q: np.ndarray, k: int, fetch: int, namespace: str | None, now_us: int) -> _HotAnswer:
        """The hot tier's candidates and the rule they answer by. The certificate is read before the hot answer and
        checked again after it and its counts: a write that began in between (any process's) makes it "cold"."""
        link, placement = self._link, self._placement
        if self._own_copy_cheaper(hot, namespace):
            return _HotAnswer(np.empty(0, np.int64), np.empty(0, np.float32), "no-spare-core", True, asked=False)
        try:
            if not self._hot_may_answer(hot, namespace):
                # No rule could skip the cold tier, which is then searched alone: its answer is exact over every
                # memory, so hot candidates would add nothing but a round trip, and a catch-up nothing this
                # search can use (rule 1's counts are published as records are applied: a record waiting to be
                # applied leaves them equal, so such a scope still catches up).
                return _HotAnswer(np.empty(0, np.int64), np.empty(0, np.float32), "cold", True, asked=False)
            ns_hash = None if namespace is None else namespace_hash(namespace)
            token = link.token(ns_hash)
            if token is None:
                token = link.catch_up(ns_hash)
                if link.hot is not hot:  # the catch-up found the sidecar gone (and closed this handle)
                    return _HotAnswer(np.empty(0, np.int64), np.empty(0, np.float32), "no-hot", False)
                if token is None:  # uncertified hot rows are never merged (rules.merge): no need to ask for them
                    return _HotAnswer(np.empty(0, np.int64), np.empty(0, np.float32), "cold", False)
            fetched = min(fetch, hot.max_k)
            res = hot.search(q, k=fetched, namespace_hash=ns_hash)
            ids, scores = res.ids[0, : res.hits], res.scores[0, : res.hits]
            complete = token is not None and "complete" in self.rules and self._hot_is_complete(hot, namespace)
            kth, unfetched, bound = None, -np.inf, None
            if not complete and ("bound" in self.rules or "threshold" in self.rules):
                finals = self._finals(ids, scores, now_us)
                max_bonus = 0.0 if self.scoring is None else self.scoring.max_bonus(None, now_us)
                kth, unfetched = R.hot_kth(scores, k, fetched, finals, max_bonus)
                if "bound" in self.rules and token is not None and self._bounds_usable(hot, namespace):
                    bound = placement.cold_bound(q, namespace, self.scoring, now_us)
            certified = token is not None and link.still(token)
            evidence = R.Evidence(certified, complete, bound is not None, kth, bound, unfetched, hot.dtype == "f16")
            return _HotAnswer(ids, scores, R.decide(self.rules, self.confidence, evidence), certified, kth, bound)
        except SidecarUnavailable as exc:
            link.drop(str(exc))
            return _HotAnswer(np.empty(0, np.int64), np.empty(0, np.float32), "no-hot", False)

    def _finals(self, ids: np.ndarray, scores: np.ndarray, now_us: int) -> list[float] | None:
        """The hot candidates' final scores under the store's Scoring, best first (None without one)."""
        if self.scoring is None:
            return None
        found = self._cache.lookup(int(i) for i in ids)
        return sorted((self.scoring.score(float(s), found[int(i)], now_us) for i, s in zip(ids, scores)
                       if int(i) in found), reverse=True)

    def _own_copy_cheaper(self, hot, namespace: str | None) -> bool:
        """A CPU sidecar with no core to spare (HotTier.no_spare_core), and a scope the cold tier answers by an exact
        scan of this process's mirror of at most OWN_COPY_SCAN_MAX_ELEMENTS: the mirror answers (rule
        "no-spare-core", path "cold"), exact like every cold answer, and the sidecar is not asked. Its round trip
        would take a core from a client (the sidecar's scan) and cost the caller a wait for one; the scan here costs
        less. Nothing was missed, so nothing is promoted."""
        if not self._sidecar_takes_a_core(hot):
            return False
        rows = self.cold.exact_scan_rows(namespace)
        return rows is not None and rows * self.dim <= OWN_COPY_SCAN_MAX_ELEMENTS

    @staticmethod
    def _sidecar_takes_a_core(hot) -> bool:
        """A CPU sidecar with no core to spare (HotTier.no_spare_core): whatever it is asked to do (a scan, a
        promotion's rows) takes a core from a client, and its caller waits for a core to run again."""
        return hot.backend == "cpu" and hot.no_spare_core

    def _hot_may_answer(self, hot, namespace: str | None) -> bool:
        """Whether some rule could answer the scope from the hot tier, judged before asking it: the threshold rule
        (it needs the hot scores), counts that say the hot tier holds the whole scope, or bounds that cover its
        cold-only rows. Each is checked again, with the certificate, after the hot answer."""
        if "threshold" in self.rules and self.confidence is not None:
            return True
        if "complete" in self.rules and self._hot_is_complete(hot, namespace, as_followed=True):
            return True
        return "bound" in self.rules and self._bounds_usable(hot, namespace)

    def _hot_is_complete(self, hot, namespace: str | None, *, as_followed: bool = False) -> bool:
        """Rule 1: the hot tier holds every memory of the namespace (every process sees the same counts).
        as_followed: over every namespace, compare with the rows as this process last followed them instead of
        reading the log for an exact count (a hint for _hot_may_answer; True when no count is at hand)."""
        if self._link.backlog:
            return False
        if namespace is None:
            total = self.cold.count_followed() if as_followed else self.cold.count()
            return total is None or hot.hot_rows == total
        hot_rows, total_rows = hot.namespace_rows(namespace_hash(namespace))
        return hot_rows == total_rows

    def _bounds_usable(self, hot, namespace: str | None) -> bool:
        placement = self._placement
        return placement.tracking_ok(hot, self.cold.generations.writes(), bool(self._link.backlog)) \
            and placement.counts_agree(hot, namespace)

    def _after_cold_path(self, hot, namespace: str | None, ranked: list, trusted: bool) -> None:
        """The disk was read anyway: repair a stale slot, promote per policy, and tighten or resync the bounds."""
        link, placement = self._link, self._placement
        if not trusted:
            link.repair(namespace)
        # What is already hot is not promoted again: an uncertified hot answer makes every hit "cold", and taking the
        # write lock to re-place rows the hot tier holds only makes the writers queue behind the search.
        whole = namespace is not None and self.policy.whole_namespace(namespace, placement.tick, hot.capacity)
        if whole:
            wanted = placement.namespace_to_load(namespace)
        else:
            cold_hits = placement.not_hot([i for _, i, tier in ranked if tier == "cold"]) if self.policy.promote else []
            wanted = bool(cold_hits)
        # No promotion into a sidecar whose work takes a core from a client: it would hold the store's write lock,
        # which the writers whose hot side is due queue behind, across that round trip, for rows that the searches
        # of such a machine mostly take from their own copy (_own_copy_cheaper). Cold hits promote again once a core
        # is spare. The repair above may have dropped (and closed) the handle the search used: ask the link's.
        current = link.hot
        if wanted and current is not None and self._sidecar_takes_a_core(current):
            self._moves["promotions_skipped"] += 1
        elif wanted:
            with self._write_lock.held(wait=False) as got:  # a writer is at work: promote on a later cold hit
                if got and whole:
                    link.call(lambda h: placement.promote_namespace(h, namespace))
                elif got:
                    link.call(lambda h: placement.promote(h, cold_hits))
        if "bound" not in self.rules or link.hot is None:
            return
        try:
            writes = self.cold.generations.writes()
            if not placement.tracking_ok(link.hot, writes, bool(link.backlog)):
                if placement.resync_due(writes):
                    placement.resync(link.hot, write_lock=self._write_lock, rewarm=link.rewarm, cache=self._cache)
            elif namespace is not None:
                nb = placement.bounds.by_namespace.get(namespace)
                if nb is not None and nb.loose:
                    placement.rebuild_bound(namespace)
        except SidecarUnavailable as exc:
            link.drop(str(exc))
        except TieredRecallError as exc:
            link.error = str(exc)
            placement.invalidate()

    # ---- reports and life cycle --------------------------------------------------------------
    def stats(self) -> dict:
        """Rows per tier, how often the hot tier answered alone, latency per search path, and what the hot tier
        could not give (hot_error, hot_warnings)."""
        self._check_open()
        paths = self._stats.summary()
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
            "rules": self._rule_stats.summary(),
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
