"""Searches of a cold store: by vector (mirror, FAISS IVF, flat scan or LanceDB), where filters, BM25, hybrid RRF."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable, TypeVar

import numpy as np

from ..errors import InvalidInput, StorageError, TieredRecallError
from ._ann import IvfAnn, flat_search
from ._bm25 import rrf_fuse
from ._mirror import positions_bitmap, top_k_with_ties
from ._schema import VECTOR_COLUMN, filter_sql, vectors_from_arrow

if TYPE_CHECKING:
    from ._follower import Follower
    from ._index import FaissIndex
    from ._reads import RowReads
    from ._tables import LanceTables

T = TypeVar("T")
Hits = tuple[np.ndarray, np.ndarray]

# Rows fetched per ANN candidate list before exact re-ranking (LanceDB refine_factor).
_ANN_REFINE_FACTOR = 10
_ANN_NPROBES = 20
# A filtered search over at most this many rows is answered exactly (a gather of their vectors) instead of by FAISS.
_EXACT_SUBSET_MAX = 4096
# Candidates asked of FAISS beyond k and the excluded ids: dead rows among them still leave k after re-scoring.
_SPARE_CANDIDATES = 8
_RRF_DEPTH = 100  # rows taken from each ranking before reciprocal-rank fusion
# Weight of the BM25 ranking against the vector ranking in reciprocal-rank fusion (benchmarks/locomo_recall.py
# --bm25-weight varies it: short chat turns favour keywords).
HYBRID_BM25_WEIGHT = 1.0


def looks_like_bad_filter(exc: BaseException) -> bool:
    """True when LanceDB's error reads like a rejected where filter (parse, schema or column errors), so the caller
    gets InvalidInput instead of StorageError."""
    text = str(exc).lower()
    return any(word in text for word in ("sql", "parse", "no field", "not found in schema", "schema error",
                                         "invalid user input", "column", "expected", "unsupported"))


# LanceDB's wording around the reason a filter was refused: prefixes it repeats, the statement it built, where in its
# own sources the error arose.
_LANCE_PREFIX = re.compile(r"^(?:(?:Invalid input|Invalid user input|invalid SQL predicate|Schema error|"
                           r"Error during planning)[,:]\s*)+")
_PARSER_REASON = re.compile(r"\((?:sql parser error|LanceError\(\w+\)): (.*)\)\s*$", re.S)
_RUST_SOURCE = re.compile(r",?\s*/\S+\.rs:\d+:\d+")
_POSITION = re.compile(r"\b(?:at )+Line: 1, Column: (\d+)")
FILTER_COLUMNS = "id, namespace, session, role, text, created_at, metadata"


def filter_problem(where: str, exc: BaseException) -> str:
    """Why LanceDB refused a where filter, in a few words: its reason without the statement it built around the
    filter or its source paths, and a position as a column of the filter itself ("... at column 8")."""
    text = " ".join(str(exc).split())
    text = text.replace(f"Error resolving filter expression {where}: ", "")
    match = _PARSER_REASON.search(text)
    if match:
        text = match.group(1)
    text = _RUST_SOURCE.sub("", text)
    text = _POSITION.sub(r"at column \1", text).replace("found: EOF", "found: the end of the filter")
    while True:
        shorter = _LANCE_PREFIX.sub("", text).strip()
        if shorter == text:
            return text
        text = shorter


class Searcher:
    """Answers searches under the store's lock, with the view in step (ColdStore's read path): from the mirror and
    the FAISS index while the mirror is loaded, from LanceDB past the mirror's budget or with index="lancedb";
    LanceDB evaluates where filters. Holds no state of its own."""

    def __init__(self, follower: "Follower", index: "FaissIndex", tables: "LanceTables", reads: "RowReads", *,
                 dim: int, mode: str) -> None:
        self._follower = follower
        self._index = index
        self._tables = tables
        self._reads = reads
        self._dim = dim
        self._mode = mode

    # ---- which reads need the table ------------------------------------------------------------
    def table_serves(self, where: str | None, text: str | None) -> bool:
        """Whether LanceDB serves (part of) this search, so rows still in the log go into the table first. A BM25
        index is built from the table and the log's newest operations (no flush needed), except through a lagging
        handle, which may not see another process's flush yet."""
        return (where is not None or self._follower.mirror is None or self._mode == "lancedb"
                or (text is not None and self._follower.bm25 is None and self._tables.lagging_reads))

    def text_table_serves(self, where: str | None) -> bool:
        """Whether LanceDB serves (part of) this keyword search, so rows still in the log go into the table first: a
        where filter, or a BM25 index still to be built through a lagging handle."""
        return where is not None or (self._follower.bm25 is None and self._tables.lagging_reads)

    def exact_scan_rows(self, namespace: str | None) -> int | None:
        """The rows a vector search of the scope (a namespace, or every one; no where filter, no text) reads when it
        scans the mirror exactly, or None when it would not (no mirror, LanceDB serves, or FAISS picks the
        candidates): what such a search costs, read without the lock (a hint, the search itself is exact)."""
        m = self._follower.mirror
        if m is None or self._mode == "lancedb":
            return None
        ann = self._index.ann if self._mode == "auto" else None
        if namespace is None:
            return m.live_rows if ann is None else None
        rows = m.namespace_live(namespace)
        return rows if ann is None or rows <= _EXACT_SUBSET_MAX else None

    # ---- searches ------------------------------------------------------------------------------
    def search_locked(self, query: np.ndarray, k: int, namespace: str | None, where: str | None,
                      excluded: np.ndarray | None, text: str | None) -> Hits:
        """ColdStore.search under the lock: hybrid (BM25 fused with the vector ranking) when text is not blank, else the
        vector search alone. Returns (ids int64, scores float32)."""
        if text is not None and text.strip():
            return self._hybrid_locked(query, text, k, namespace, where, excluded)
        return self._vector_locked(query, k, namespace, where, excluded)

    def text_search_locked(self, text: str, k: int, namespace: str | None, where: str | None,
                           excluded: np.ndarray | None) -> Hits:
        """ColdStore.text_search under the lock: BM25 alone, over the rows the where filter matches when given."""
        only = None if where is None else self.matching_ids(namespace, where)
        return self._follower.bm25_locked().search(text, k, namespace=namespace, only_ids=only, exclude_ids=excluded)

    def _vector_locked(self, query: np.ndarray, k: int, namespace: str | None, where: str | None,
                       excluded: np.ndarray | None) -> Hits:
        m = self._follower.mirror
        if m is None or self._mode == "lancedb":
            return self._search_lancedb(query, k, namespace, where, excluded)
        ann = self._index.ann if self._mode == "auto" else None
        if where is not None:
            positions = m.positions(self.matching_ids(namespace, where))
            if namespace is not None:
                positions = np.intersect1d(positions, m.namespace_positions(namespace))
            if ann is None or positions.shape[0] <= _EXACT_SUBSET_MAX:
                return m.search_positions(query, positions, k, excluded)
            return self._ann_search(ann, query, k, excluded, positions.shape[0],
                                    positions_bitmap(positions, m.n), lambda: positions)
        if ann is None:
            if namespace is None and self._index.exact_by_choice():
                return self._flat_search(query, k, excluded)
            return m.search(query, k, namespace=namespace, exclude_ids=excluded)
        if namespace is None:
            return self._ann_search(ann, query, k, excluded, m.live_rows, None, m.live_positions)
        allowed = m.namespace_live(namespace)
        if allowed <= _EXACT_SUBSET_MAX:
            return m.search_positions(query, m.namespace_positions(namespace), k, excluded)
        bitmap = None if allowed == m.live_rows else m.namespace_bitmap(namespace)
        return self._ann_search(ann, query, k, excluded, allowed, bitmap, lambda: m.namespace_positions(namespace))

    def _ann_search(self, ann: IvfAnn, query: np.ndarray, k: int, excluded: np.ndarray | None, allowed: int,
                    bitmap: np.ndarray | None, positions: Callable[[], np.ndarray]) -> Hits:
        """FAISS candidates (the filter applied inside the search, probes scaled up by its selectivity), re-scored
        exactly from the mirror; falls back to exact search when the index yields fewer than k rows."""
        m = self._follower.mirror
        n_excluded = 0 if excluded is None else int(excluded.size)
        nprobe = ann.nprobe
        if bitmap is not None:
            nprobe = min(ann.nlist, int(np.ceil(ann.nprobe * m.live_rows / max(allowed, 1))))
        labels = ann.search(query, k + _SPARE_CANDIDATES + n_excluded, nprobe=nprobe, bitmap=bitmap)
        labels = labels[labels < m.n]
        labels = labels[m.alive_at(labels)]
        ids, scores = m.search_positions(query, labels, k, excluded)
        if ids.shape[0] < k and allowed - n_excluded > ids.shape[0]:
            return m.search_positions(query, positions(), k, excluded)
        return ids, scores

    def _flat_search(self, query: np.ndarray, k: int, excluded: np.ndarray | None) -> Hits:
        """Exact search past faiss_min_rows when IVF lost (see _ann.choose_method): a FAISS flat scan of the mirror
        on one thread (no BLAS threads fighting over the cores), candidates re-scored and tie-ordered like every
        other path; the numpy scan answers when dead or excluded rows leave fewer than k candidates."""
        m = self._follower.mirror
        n_excluded = 0 if excluded is None else int(excluded.size)
        labels = flat_search(m.all_vectors(), query, k + _SPARE_CANDIDATES + n_excluded)
        labels = labels[m.alive_at(labels)]
        ids, scores = m.search_positions(query, labels, k, excluded)
        if ids.shape[0] < k and m.live_rows - n_excluded > ids.shape[0]:
            return m.search(query, k, exclude_ids=excluded)
        return ids, scores

    def _hybrid_locked(self, query: np.ndarray, text: str, k: int, namespace: str | None, where: str | None,
                       excluded: np.ndarray | None) -> Hits:
        depth = max(_RRF_DEPTH, k)
        vec_ids, vec_scores = self._vector_locked(query, depth, namespace, where, excluded)
        only = None if where is None else self.matching_ids(namespace, where)
        bm_ids, _ = self._follower.bm25_locked().search(text, depth, namespace=namespace, only_ids=only,
                                                         exclude_ids=excluded)
        ids, _ = rrf_fuse([vec_ids, bm_ids], k, weights=(1.0, HYBRID_BM25_WEIGHT))
        known = dict(zip(vec_ids.tolist(), vec_scores.tolist()))
        missing = np.array([i for i in ids.tolist() if i not in known], np.int64)
        if missing.size:
            m = self._follower.mirror
            if m is not None:
                exact = m.vectors_at(m.positions_or_minus1(missing)) @ query
            else:
                rows = self._reads.rows_locked(missing)
                exact = np.array([float(rows[i]["vector"] @ query) for i in missing.tolist()], np.float32)
            known.update(zip(missing.tolist(), exact.tolist()))
        return ids, np.array([known[i] for i in ids.tolist()], np.float32)

    # ---- LanceDB -------------------------------------------------------------------------------
    def _run_filtered(self, what: str, fn: Callable[[], T], where: str | None) -> T:
        try:
            return fn()
        except TieredRecallError:
            raise
        except Exception as exc:
            if where is not None and looks_like_bad_filter(exc):
                # The search's own statement wraps the filter (a namespace, parentheses): the filter alone gives
                # LanceDB's reason with positions in the caller's own text.
                alone = self._check_filter_alone(where) or exc
                raise InvalidInput(f"the where filter {where!r} is not valid LanceDB SQL over the columns "
                                   f"{FILTER_COLUMNS}: {filter_problem(where, alone)}") from None
            raise StorageError(f"cold tier: failed to {what} at {self._tables.path}: "
                               f"{type(exc).__name__}: {exc}") from exc

    def _check_filter_alone(self, where: str) -> BaseException | None:
        """LanceDB's error for the filter by itself, or None when it takes it alone."""
        try:
            self._tables.table.search().where(where).select(["id"]).limit(1).to_arrow()
        except Exception as exc:  # any refusal is the filter's: only its reason is read
            return exc
        return None

    def matching_ids(self, namespace: str | None, where: str) -> np.ndarray:
        """The ids of the rows of the scope (namespace, or all when None) that a where filter matches, evaluated by
        LanceDB."""
        sql = filter_sql(namespace, where)
        data = self._run_filtered("evaluate a where filter", lambda: self._tables.table.search().where(sql)
                                  .select(["id"]).limit(None).to_arrow(), where)
        return np.asarray(data.column("id").to_numpy(), dtype=np.int64)

    def _search_lancedb(self, query: np.ndarray, k: int, namespace: str | None, where: str | None,
                        excluded: np.ndarray | None) -> Hits:
        sql = filter_sql(namespace, where, excluded)
        indexed = self._tables.vector_index_type() is not None

        def run():
            # Fetch a few extra rows so ties at the k-th score can still be ordered by id after exact re-scoring.
            builder = (self._tables.table.search(query, vector_column_name=VECTOR_COLUMN).distance_type("dot")
                       .select(["id", VECTOR_COLUMN]).limit(k + 16))
            if indexed:
                builder = builder.nprobes(_ANN_NPROBES).refine_factor(_ANN_REFINE_FACTOR)
            else:
                builder = builder.bypass_vector_index()
            if sql is not None:
                builder = builder.where(sql, prefilter=True)
            return builder.to_arrow()
        data = self._run_filtered("search", run, where)
        ids = np.asarray(data.column("id").to_numpy(), dtype=np.int64)
        vectors = vectors_from_arrow(data.column(VECTOR_COLUMN), self._dim)
        # Exact scores from the stored vectors: an ANN index only proposes candidates.
        return top_k_with_ties(vectors @ query, ids, k)
