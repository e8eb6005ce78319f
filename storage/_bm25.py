"""Incremental BM25 over memory texts (for hybrid search), and reciprocal-rank fusion of rankings.

An inverted index of growable numpy posting arrays: single-row adds and deletes cost a few dictionary
updates, document frequencies stay exact, deleted rows never score, and dead postings are dropped once
they are half of the index. A term no live row holds any more leaves the vocabulary at once and its id is
reused: texts that carry one-off tokens (numbers, timestamps, names) would otherwise grow the vocabulary
with every memory ever added, deleted or not. Scores follow Okapi BM25 with a lower length normalisation
(b=0.4) than usual, which suits short conversational turns. Terms are tiered_recall.text_terms's, which the
retrieval stages' keyword match reads too.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..text_terms import tokenize

_NO_SLOTS = np.empty(0, np.int64)  # shared by every free term and every dead slot's term list (never written)
_NO_TF = np.empty(0, np.float32)


class Bm25Index:
    """BM25 over (id, namespace, text) rows; upsert by id."""

    def __init__(self, *, k1: float = 1.2, b: float = 0.4):
        self.k1, self.b = float(k1), float(b)
        self._vocab: dict[str, int] = {}
        self._post_slots: list[np.ndarray] = []
        self._post_tf: list[np.ndarray] = []
        self._post_used: list[int] = []
        self._df = np.zeros(1024, np.int64)
        self._n = 0
        self._ids = np.empty(1024, np.int64)
        self._ns = np.empty(1024, np.int32)
        self._len = np.empty(1024, np.float32)
        self._alive = np.zeros(1024, bool)
        self._tokens: list[str | None] = []  # per term id (None: free, in _free_terms)
        self._free_terms: list[int] = []
        self._terms: list[np.ndarray] = []  # unique term ids per slot (for exact df on delete; dead slots: none)
        self._slot: dict[int, int] = {}
        self._ns_code: dict[str, int] = {}
        self._live_len = 0.0

    @property
    def live_rows(self) -> int:
        """Rows indexed now."""
        return len(self._slot)

    def stats(self) -> dict:
        """Live rows, slots (live rows plus deleted ones not yet compacted away) and terms in the vocabulary."""
        return {"live_rows": self.live_rows, "slots": self._n, "terms": len(self._vocab),
                "term_ids": len(self._tokens)}

    def _grow(self, need: int) -> None:
        cap = self._ids.shape[0]
        if need <= cap:
            return
        new_cap = max(need, 2 * cap)
        for name in ("_ids", "_ns", "_len", "_alive"):
            old = getattr(self, name)
            new = np.zeros(new_cap, old.dtype)
            new[: self._n] = old[: self._n]
            setattr(self, name, new)

    def _term(self, token: str) -> int:
        tid = self._vocab.get(token)
        if tid is not None:
            return tid
        if self._free_terms:
            tid = self._free_terms.pop()
            self._tokens[tid] = token
        else:
            tid = len(self._tokens)
            self._tokens.append(token)
            self._post_slots.append(_NO_SLOTS)
            self._post_tf.append(_NO_TF)
            self._post_used.append(0)
            if tid >= self._df.shape[0]:
                df = np.zeros(2 * self._df.shape[0], np.int64)
                df[: self._df.shape[0]] = self._df
                self._df = df
        self._vocab[token] = tid
        return tid

    def _free_dead_terms(self, terms: np.ndarray) -> None:
        """Terms among these that no live row holds any more (df 0) leave the vocabulary; their ids are reused.
        Their postings name dead slots only, so they go too."""
        for tid in terms[self._df[terms] == 0].tolist():
            del self._vocab[self._tokens[tid]]
            self._tokens[tid] = None
            self._post_slots[tid] = _NO_SLOTS
            self._post_tf[tid] = _NO_TF
            self._post_used[tid] = 0
            self._free_terms.append(tid)

    def upsert(self, ids: Sequence[int], namespaces: Sequence[str], texts: Sequence[str]) -> None:
        """Indexes rows by id (n each of ids, namespaces, texts); an id indexed already is replaced."""
        ids = [int(i) for i in ids]
        self.remove(ids)
        self._grow(self._n + len(ids))
        for row_id, ns, text in zip(ids, namespaces, texts):
            slot = self._n
            self._n += 1
            tokens = tokenize(text)
            counts: dict[int, int] = {}
            for tok in tokens:
                tid = self._term(tok)
                counts[tid] = counts.get(tid, 0) + 1
            for tid, tf in counts.items():
                used = self._post_used[tid]
                if used == self._post_slots[tid].shape[0]:
                    extra = max(4, used)
                    self._post_slots[tid] = np.concatenate([self._post_slots[tid], np.empty(extra, np.int64)])
                    self._post_tf[tid] = np.concatenate([self._post_tf[tid], np.empty(extra, np.float32)])
                self._post_slots[tid][used] = slot
                self._post_tf[tid][used] = tf
                self._post_used[tid] = used + 1
            terms = np.fromiter(counts.keys(), np.int64, count=len(counts))
            self._df[terms] += 1
            self._terms.append(terms)
            self._ids[slot] = row_id
            code = self._ns_code.setdefault(ns, len(self._ns_code))
            self._ns[slot] = code
            self._len[slot] = len(tokens)
            self._alive[slot] = True
            self._slot[row_id] = slot
            self._live_len += len(tokens)

    def remove(self, ids: Sequence[int]) -> None:
        """Drops the rows of ids (ids not indexed are ignored); compacts once over half the slots are dead."""
        removed = 0
        for row_id in ids:
            slot = self._slot.pop(int(row_id), None)
            if slot is None:
                continue
            self._alive[slot] = False
            terms = self._terms[slot]
            self._terms[slot] = _NO_SLOTS
            self._df[terms] -= 1
            self._free_dead_terms(terms)
            self._live_len -= float(self._len[slot])
            removed += 1
        if removed and self._n > 1024 and self.live_rows < self._n // 2:
            self._compact()

    def _compact(self) -> None:
        keep = np.flatnonzero(self._alive[: self._n])
        new_of_old = np.full(self._n, -1, np.int64)
        new_of_old[keep] = np.arange(keep.shape[0])
        for tid in range(len(self._post_slots)):
            used = self._post_used[tid]
            if used == 0:
                continue
            slots = self._post_slots[tid][:used]
            live = self._alive[slots]
            self._post_slots[tid] = new_of_old[slots[live]]
            self._post_tf[tid] = self._post_tf[tid][:used][live].copy()
            self._post_used[tid] = int(live.sum())
        for name in ("_ids", "_ns", "_len"):
            setattr(self, name, getattr(self, name)[keep].copy())
        self._alive = np.ones(keep.shape[0], bool)
        self._terms = [self._terms[i] for i in keep.tolist()]
        self._n = keep.shape[0]
        self._slot = {int(r): i for i, r in enumerate(self._ids[: self._n].tolist())}

    def search(self, text: str, depth: int, *, namespace: str | None = None, only_ids: np.ndarray | None = None,
               exclude_ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top `depth` live rows by BM25 score (> 0 only), best first, ties by smaller id: (ids, scores)."""
        live = self.live_rows
        terms = [self._vocab[t] for t in set(tokenize(text)) if t in self._vocab]
        if not terms or live == 0:
            return np.empty(0, np.int64), np.empty(0, np.float32)
        avgdl = max(self._live_len / live, 1e-9)
        used = [self._post_used[tid] for tid in terms]
        slots = np.concatenate([self._post_slots[tid][:count] for tid, count in zip(terms, used)])
        tf = np.concatenate([self._post_tf[tid][:count] for tid, count in zip(terms, used)])
        # One term's postings at a time or all at once, each posting's score is the same float32 arithmetic: the idf
        # (a double, as math.log gives it) rounded to float32 where it meets tf, then the same operations in order.
        idf = np.array([math.log(1.0 + (live - df + 0.5) / (df + 0.5)) for df in self._df[terms].tolist()],
                       np.float64).astype(np.float32)
        idf = np.repeat(idf, used)
        # Only the postings of live rows in the namespace are scored: a store of many namespaces costs one look at
        # each posting, not a score.
        wanted = self._alive[slots]
        if namespace is not None:
            wanted &= self._ns[slots] == self._ns_code.get(namespace, -1)
        if not wanted.all():
            slots, tf, idf = slots[wanted], tf[wanted], idf[wanted]
        if slots.shape[0] == 0:
            return np.empty(0, np.int64), np.empty(0, np.float32)
        norm = self.k1 * (1.0 - self.b + self.b * self._len[slots] / avgdl)
        scores = (idf * tf * (self.k1 + 1.0) / (tf + norm)).astype(np.float64)
        if 16 * slots.shape[0] >= self._n:  # postings dense among the slots: one pass over them
            total = np.bincount(slots, weights=scores, minlength=self._n)
            uniq = np.flatnonzero(total)
            total = total[uniq]
        else:
            uniq, inverse = np.unique(slots, return_inverse=True)
            total = np.bincount(inverse, weights=scores, minlength=uniq.shape[0])
        ids = self._ids[uniq]
        if only_ids is not None or (exclude_ids is not None and exclude_ids.size):
            keep = np.ones(ids.shape[0], bool)
            if only_ids is not None:
                keep &= np.isin(ids, only_ids)
            if exclude_ids is not None and exclude_ids.size:
                keep &= ~np.isin(ids, exclude_ids)
            ids, total = ids[keep], total[keep]
        if ids.shape[0] > 2 * depth:  # only the rows scoring at least the depth-th best can be in the answer
            floor = np.partition(total, ids.shape[0] - depth)[ids.shape[0] - depth]
            contenders = total >= floor
            ids, total = ids[contenders], total[contenders]
        order = np.lexsort((ids, -total))[:depth]
        return ids[order].astype(np.int64), total[order].astype(np.float32)


def rrf_fuse(rankings: Sequence[np.ndarray], k: int, *, c: float = 60.0,
             weights: Sequence[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Reciprocal-rank fusion: sum over rankings of w / (c + rank), rank from 1; best first, ties by smaller id."""
    fused: dict[int, float] = {}
    for index, ranking in enumerate(rankings):
        weight = 1.0 if weights is None else float(weights[index])
        for rank, row_id in enumerate(np.asarray(ranking).tolist(), start=1):
            fused[row_id] = fused.get(row_id, 0.0) + weight / (c + rank)
    if not fused:
        return np.empty(0, np.int64), np.empty(0, np.float32)
    ids = np.fromiter(fused.keys(), np.int64, count=len(fused))
    scores = np.fromiter(fused.values(), np.float64, count=len(fused))
    order = np.lexsort((ids, -scores))[:k]
    return ids[order], scores[order].astype(np.float32)
