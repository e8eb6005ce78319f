"""A LangGraph store (BaseStore) over tiered-recall: put / get / search / list_namespaces with semantic search, filters
and time to live, served by the hot tier where it can (pip install "tiered-recall[langgraph]")."""
from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

try:
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        IndexConfig,
        Item,
        ListNamespacesOp,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
        TTLConfig,
        ensure_embeddings,
        validate_op_namespace,
    )
    from langgraph.store.base.embed import get_text_at_path, tokenize_path
except ImportError as error:  # pragma: no cover - the message is the point
    raise ImportError('tiered_recall.integrations.langgraph needs LangGraph: pip install "tiered-recall[langgraph]"'
                      ) from error

from ..coordinator import TieredMemory
from ..errors import InvalidInput
from ..namespaces import namespace_labels, namespace_name

ITEMS_FOLDER = "items"  # one memory per item: its value, key and times (never searched by vector)
VECTORS_FOLDER = "vectors"  # one memory per indexed text of an item, searched by the hot tier
_NO_INDEX_DIM = 1  # the items store keeps no meaningful vector: one component, always 1
_UNIT = np.ones(_NO_INDEX_DIM, dtype=np.float32)
_MAX_K = 256  # TieredMemory's deepest search


def _memory_id(*parts: str) -> int:
    """A stable id in 1 .. 2**62 for an item (namespace, key) or one of its indexed texts (namespace, key, path)."""
    digest = hashlib.blake2b("\x00".join(parts).encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 2) + 1


def _to_datetime(us: int) -> datetime:
    return datetime.fromtimestamp(us / 1e6, tz=timezone.utc)


class TieredRecallStore(BaseStore):
    """A LangGraph BaseStore whose items live in a tiered-recall store folder.

    TieredRecallStore(path=None, *, index=None, ttl=None, device="auto", hot_capacity=None, items=None, vectors=None)

    path: the folder (made if missing); None: the user's own store's folder beside it ("langgraph").
    index: LangGraph's IndexConfig ({"dims": 384, "embed": embeddings or a function, "fields": ["$"] or JSON
    paths such as "messages[*].content"}) for semantic search; without it search filters and lists only.
    ttl: LangGraph's TTLConfig (default_ttl and the ttl of put in minutes, refresh_on_read, sweep_interval_minutes).
    device / hot_capacity: the hot tier of the indexed texts, as TieredMemory takes them.
    items / vectors: open stores to keep the items (of dim 1) and the indexed texts (of the index's dims) in instead
    of path's two folders: TieredMemory, or anything with its methods such as a ClusterMemory (docs/cluster.md);
    their owner closes them.

    Each item is one memory of the items store (namespace, key, value, times) and each indexed text of it one
    memory of the vectors store, in the item's namespace; a search embeds the query once, searches the vectors
    store (exact, hot tier first) under the namespace prefix and keeps each item's best text, as LangGraph's
    InMemoryStore does. Filters are LangGraph's ($eq, $ne, $gt, $gte, $lt, $lte, nested objects, lists),
    evaluated on the items' values, with the search going deeper until enough items pass.
    """

    supports_ttl = True

    def __init__(self, path: str | Path | None = None, *, index: IndexConfig | None = None,
                 ttl: TTLConfig | None = None, device: str = "auto", hot_capacity: int | None = None,
                 items: Any = None, vectors: Any = None) -> None:
        if path is None:
            from ..coordinator.store_folder import default_store_path

            path = Path(default_store_path()).parent / "langgraph"
        self.path = Path(path).expanduser()
        self.ttl_config = ttl
        sweep_s = 60.0 * float((ttl or {}).get("sweep_interval_minutes") or 1.0)
        self.index_config = dict(index) if index else None
        self.embeddings = None
        self._fields: list[tuple[str, Any]] = []
        if self.index_config:
            if "dims" not in self.index_config or "embed" not in self.index_config:
                raise InvalidInput('index needs "dims" (the embedding width) and "embed" (an Embeddings or a '
                                   'function of texts), e.g. index={"dims": 384, "embed": embeddings}')
            self.embeddings = ensure_embeddings(self.index_config["embed"])
            self._fields = [(p, tokenize_path(p) if p != "$" else p) for p in (self.index_config.get("fields") or ["$"])]
        if items is not None:  # stores opened by the caller (a cluster's, say): checked, and left to it to close
            if getattr(items, "dim", None) != _NO_INDEX_DIM:
                raise InvalidInput(f"items must be a store of dim {_NO_INDEX_DIM} (it keeps no meaningful vector)")
            if (vectors is not None) != bool(self.index_config) or (
                    vectors is not None and getattr(vectors, "dim", None) != int(self.index_config["dims"])):
                raise InvalidInput('vectors goes with index: a store of the index\'s "dims"')
            self._items, self._vectors, self._owns_stores = items, vectors, False
            return
        self._owns_stores = True
        self._items = TieredMemory(self.path / ITEMS_FOLDER, dim=_NO_INDEX_DIM, embedder=None, device="none",
                                   ttl_sweep_s=sweep_s)
        self._vectors = None
        if self.index_config:
            self._vectors = TieredMemory(self.path / VECTORS_FOLDER, dim=int(self.index_config["dims"]),
                                         embedder=None, device=device, hot_capacity=hot_capacity, ttl_sweep_s=sweep_s)

    # ---- BaseStore -----------------------------------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Runs the operations in order: reads see the store as it was before this batch's puts, which are applied
        after them, the last put of a (namespace, key) winning (as LangGraph's stores do)."""
        ops = list(ops)
        for op in ops:
            validate_op_namespace(op)
        results: list[Result] = []
        puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        queries = dict.fromkeys(op.query for op in ops if isinstance(op, SearchOp) and op.query and self.embeddings)
        query_vectors = {q: self.embeddings.embed_query(q) for q in queries}  # each distinct query embedded once
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._get(op))
            elif isinstance(op, SearchOp):
                results.append(self._search(op, query_vectors.get(op.query)))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list_namespaces(op))
            elif isinstance(op, PutOp):
                puts[(tuple(op.namespace), op.key)] = op
                results.append(None)
            else:
                raise InvalidInput(f"unknown LangGraph operation {type(op).__name__}")
        if puts:
            self._apply_puts(list(puts.values()))
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """batch() in a worker thread, so the event loop is not blocked while the store works."""
        return await asyncio.to_thread(self.batch, list(ops))

    def close(self) -> None:
        """Closes both stores (their sidecar exits once no process uses it); stores passed in are left open."""
        if not self._owns_stores:
            return
        self._items.close()
        if self._vectors is not None:
            self._vectors.close()

    def __enter__(self) -> "TieredRecallStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- operations ----------------------------------------------------------------------------
    def _item_id(self, namespace: tuple[str, ...], key: str) -> int:
        return _memory_id(namespace_name(namespace), key)

    def _get(self, op: GetOp) -> Item | None:
        record = self._items.get([self._item_id(op.namespace, op.key)])[0]
        if record is None:
            return None
        if op.refresh_ttl and record.ttl_s is not None:
            self._refresh([record])
        return self._item_of(record)

    def _item_of(self, record, score: float | None = None, *, searched: bool = False) -> Item:
        meta = record.metadata
        fields = dict(namespace=namespace_labels(record.namespace), key=meta["key"], value=meta["value"],
                      created_at=record.created_at, updated_at=_to_datetime(int(meta["updated_at_us"])))
        return SearchItem(score=score, **fields) if searched else Item(**fields)

    def _refresh(self, records: list) -> None:
        """Starts the time to live of these items, and of their indexed texts, again from now."""
        self._items.get([r.id for r in records], refresh_ttl=True)
        vector_ids = [i for r in records for i in r.metadata.get("vector_ids", [])]
        if vector_ids and self._vectors is not None:
            self._vectors.get(vector_ids, refresh_ttl=True)

    def _apply_puts(self, puts: list[PutOp]) -> None:
        now_us = time.time_ns() // 1000
        existing = self._items.get([self._item_id(op.namespace, op.key) for op in puts])
        for op, old in zip(puts, existing):
            name = namespace_name(op.namespace)
            old_vectors = set(old.metadata.get("vector_ids", [])) if old is not None else set()
            if op.value is None:
                if self._vectors is not None and old_vectors:
                    self._vectors.delete(sorted(old_vectors))
                if old is not None:
                    self._items.delete([old.id])
                continue
            ttl_s = None if op.ttl is None else float(op.ttl) * 60.0
            texts = self._texts_to_index(op)
            vector_ids = [_memory_id(name, op.key, path) for path, _ in texts]
            stale = old_vectors - set(vector_ids)
            created = old.created_at if old is not None else _to_datetime(now_us)
            if self._vectors is not None:
                if stale:
                    self._vectors.delete(sorted(stale))
                if texts:
                    vectors = np.asarray(self.embeddings.embed_documents([t for _, t in texts]), dtype=np.float32)
                    # Each text carries the item's value, so a search builds its items from the hits alone.
                    self._vectors.add([t for _, t in texts], vectors=vectors, namespace=name, ids=vector_ids,
                                      metadata=[{"key": op.key, "path": p, "value": dict(op.value),
                                                 "updated_at_us": now_us} for p, _ in texts],
                                      created_at=created, ttl=ttl_s)
            self._items.add([op.key], vectors=_UNIT, namespace=name, ids=[self._item_id(op.namespace, op.key)],
                            metadata={"key": op.key, "value": dict(op.value), "updated_at_us": now_us,
                                      "vector_ids": vector_ids},
                            created_at=created, ttl=ttl_s)

    def _texts_to_index(self, op: PutOp) -> list[tuple[str, str]]:
        """(path, text) of every text of the value that is embedded, named as InMemoryStore names them."""
        if self._vectors is None or op.index is False:
            return []
        paths = self._fields if op.index is None else [(p, tokenize_path(p)) for p in op.index]
        out = []
        for path, field in paths:
            texts = get_text_at_path(op.value, field)
            if len(texts) > 1:
                out.extend((f"{path}.{i}", text) for i, text in enumerate(texts))
            elif texts:
                out.append((path, texts[0]))
        seen: dict[str, str] = {}
        for path, text in out:
            seen.setdefault(path, text)
        return list(seen.items())

    def _records_under(self, prefix: tuple[str, ...]) -> list:
        """Every item under the namespace prefix, oldest first (ties by id)."""
        if prefix:
            names = [namespace_name(ns) for ns in self._items.list_namespaces(prefix=prefix, limit=1 << 62)]
        else:
            names = [namespace_name(ns) for ns in self._items.list_namespaces(limit=1 << 62)]
        records = [r for name in names for r in self._items.memories(name)]
        records.sort(key=lambda r: (r.created_at, r.id))
        return records

    def _search(self, op: SearchOp, query_vector) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        wanted = op.offset + op.limit
        if query_vector is None or self._vectors is None:
            records = [r for r in self._records_under(prefix) if _passes(r.metadata["value"], op.filter)]
            kept = [(None, r) for r in records[op.offset:wanted]]
        else:
            kept = self._best_items(np.asarray(query_vector, dtype=np.float32), prefix, op.filter, wanted)
            kept = kept[op.offset:wanted]
            if len(kept) < op.limit:
                # InMemoryStore's corner case: items with nothing indexed fill the rest, unscored.
                scoreless = [r for r in self._records_under(prefix)
                             if not r.metadata.get("vector_ids") and _passes(r.metadata["value"], op.filter)]
                kept += [(None, r) for r in scoreless[:op.limit - len(kept)]]
        if op.refresh_ttl:
            expiring = [r.id for _, r in kept if r.ttl_s is not None]
            if expiring:
                self._refresh([r for r in self._items.get(expiring) if r is not None])
        return [self._item_of(r, score, searched=True) for score, r in kept]

    def _best_items(self, q: np.ndarray, prefix: tuple[str, ...], filter: dict | None, wanted: int) -> list:
        """The `wanted` best items under prefix that pass the filter, each scored by its best indexed text: (score,
        record), best first. Searches the indexed texts deeper until enough items pass or every text was seen."""
        q = q / max(float(np.linalg.norm(q)), 1e-30)
        k = min(_MAX_K, max(wanted, 1))
        while True:
            scope = {"namespace_prefix": prefix} if prefix else {}
            hits = self._vectors.search(q, k=k, **scope)
            exhausted = len(hits) < k
            if not exhausted and k >= _MAX_K:
                return self._best_items_by_scan(q, prefix, filter, wanted)
            best: dict[int, tuple[float, _HitItem]] = {}
            for h in hits:  # best first: an item's first hit is its best text
                item_id = _memory_id(h.namespace, h.metadata["key"])
                if item_id not in best:
                    best[item_id] = (h.score, _HitItem(item_id, h))
            passed = [(score, r) for score, r in best.values() if _passes(r.metadata["value"], filter)]
            if exhausted or len(passed) >= wanted:
                passed.sort(key=lambda sr: (-sr[0], sr[1].created_at, sr[1].id))
                return passed
            k = min(_MAX_K, 2 * k)

    def _best_items_by_scan(self, q: np.ndarray, prefix: tuple[str, ...], filter: dict | None, wanted: int) -> list:
        """The same answer as _best_items, from every indexed text under prefix scored here (when more texts than
        the deepest search would have to be read)."""
        records = [r for r in self._records_under(prefix) if r.metadata.get("vector_ids")
                   and _passes(r.metadata["value"], filter)]
        scored = []
        for r in records:
            vectors = [v for v in self._vectors.vectors(r.metadata["vector_ids"]) if v is not None]
            if vectors:
                scored.append((float(np.max(np.stack(vectors) @ q)), r))
        scored.sort(key=lambda sr: (-sr[0], sr[1].created_at, sr[1].id))
        return scored[:wanted]

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        prefix = suffix = None
        for condition in op.match_conditions or ():
            if condition.match_type == "prefix":
                prefix = tuple(condition.path)
            elif condition.match_type == "suffix":
                suffix = tuple(condition.path)
            else:
                raise InvalidInput(f"unknown namespace match type {condition.match_type!r}: use 'prefix' or 'suffix'")
        return self._items.list_namespaces(prefix=prefix or None, suffix=suffix or None, max_depth=op.max_depth,
                                           limit=op.limit, offset=op.offset)


class _HitItem:
    """An item as its best indexed text's hit carries it (value, key, times): what _item_of reads of a record."""

    __slots__ = ("id", "namespace", "metadata", "created_at", "ttl_s")

    def __init__(self, item_id: int, hit) -> None:
        self.id, self.namespace, self.metadata = item_id, hit.namespace, hit.metadata
        self.created_at, self.ttl_s = hit.created_at, hit.ttl_s


def _passes(value: dict, filter: dict | None) -> bool:
    """Whether an item's value passes a LangGraph filter."""
    return not filter or all(_matches(value.get(key), wanted) for key, wanted in filter.items())


def _matches(value: Any, wanted: Any) -> bool:
    if isinstance(wanted, dict):
        if any(k.startswith("$") for k in wanted):
            return all(_operator(value, op, operand) for op, operand in wanted.items())
        return isinstance(value, dict) and all(_matches(value.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, (list, tuple)):
        return isinstance(value, (list, tuple)) and len(value) == len(wanted) and all(
            _matches(v, w) for v, w in zip(value, wanted))
    return value == wanted


def _operator(value: Any, op: str, operand: Any) -> bool:
    if op == "$eq":
        return value == operand
    if op == "$ne":
        return value != operand
    comparisons = {"$gt": float.__gt__, "$gte": float.__ge__, "$lt": float.__lt__, "$lte": float.__le__}
    if op not in comparisons:
        raise InvalidInput(f"unknown filter operator {op!r}: use $eq, $ne, $gt, $gte, $lt or $lte")
    return comparisons[op](float(value), float(operand))


__all__ = ["TieredRecallStore"]

