"""The vectorised retrieval stages and BM25 search rank exactly as the loop implementations they replaced: every dev
question's BM25 ranking, fused pool and re-ranked top k (ids and scores) compared with the reference below, which is
the code of 040a8e2 (coordinator/stages.py and storage/_bm25.py) kept only here.

The pools are built as a text search builds them, over the LoCoMo dev split ingested with WordLlama (the stages read
only a pool's ids, scores, texts and metadata, so the embedder that ranked it does not matter here)."""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from tiered_recall.coordinator.presets import PRESETS
from tiered_recall.coordinator.stages import (CONVERSATION_KEY, RRF_C, TURN_INDEX_KEY, Candidate, Stages, fused_pool,
                                              names_a_time, rerank)
from tiered_recall.storage._bm25 import Bm25Index, tokenize
from tiered_recall.testing.locomo import DATA_FILE, DEFAULT_DATA, ExactSearchSink, load_questions

K = 25


# ---- the reference: 040a8e2's loops -----------------------------------------------------------------------------------
def reference_bm25_search(index: Bm25Index, text: str, depth: int, namespace: str | None) -> tuple:
    live = index.live_rows
    terms = [index._vocab[t] for t in set(tokenize(text)) if t in index._vocab]
    if not terms or live == 0:
        return np.empty(0, np.int64), np.empty(0, np.float32)
    avgdl = max(index._live_len / live, 1e-9)
    slot_parts, score_parts = [], []
    for tid in terms:
        used = index._post_used[tid]
        slots = index._post_slots[tid][:used]
        tf = index._post_tf[tid][:used]
        df = float(index._df[tid])
        idf = math.log(1.0 + (live - df + 0.5) / (df + 0.5))
        norm = index.k1 * (1.0 - index.b + index.b * index._len[slots] / avgdl)
        slot_parts.append(slots)
        score_parts.append(idf * tf * (index.k1 + 1.0) / (tf + norm))
    slots = np.concatenate(slot_parts)
    scores = np.concatenate(score_parts).astype(np.float64)
    uniq, inverse = np.unique(slots, return_inverse=True)
    total = np.bincount(inverse, weights=scores, minlength=uniq.shape[0])
    keep = index._alive[uniq]
    if namespace is not None:
        keep &= index._ns[uniq] == index._ns_code.get(namespace, -1)
    ids = index._ids[uniq]
    ids, total = ids[keep], total[keep]
    order = np.lexsort((ids, -total))[:depth]
    return ids[order].astype(np.int64), total[order].astype(np.float32)


def reference_pool(vector_ids, bm25_ids, weight: float, depth: int) -> list[tuple[int, float]]:
    fused: dict[int, float] = defaultdict(float)
    for rank, memory_id in enumerate(vector_ids, start=1):
        fused[int(memory_id)] += 1.0 / (RRF_C + rank)
    for rank, memory_id in enumerate(bm25_ids, start=1):
        fused[int(memory_id)] += weight / (RRF_C + rank)
    return sorted(fused.items(), key=lambda item: (-item[1], item[0]))[:depth]


def reference_rerank(pool, query_text: str, k: int, stages: Stages) -> list[tuple[int, float]]:
    from tiered_recall.coordinator.stages import _TEMPORAL_QUESTION

    raw = np.array([candidate.score for candidate in pool], dtype=np.float64)
    span = raw.max() - raw.min()
    scores = (raw - raw.min()) / span if span > 0 else np.ones_like(raw)
    adjusted = scores.copy()
    if stages.neighbour_weight:
        at: dict[tuple[Any, int], int] = {}
        for index, candidate in enumerate(pool):
            turn = candidate.metadata.get(TURN_INDEX_KEY)
            if isinstance(turn, int):
                at[(candidate.metadata.get(CONVERSATION_KEY), turn)] = index
        best = np.zeros(len(pool))
        for (conversation, turn), index in at.items():
            neighbours = [at[key] for key in ((conversation, turn - 1), (conversation, turn + 1)) if key in at]
            if neighbours:
                best[index] = max(scores[i] for i in neighbours)
        adjusted += stages.neighbour_weight * best
    if stages.temporal_weight and _TEMPORAL_QUESTION.search(query_text):
        adjusted += stages.temporal_weight * np.array([names_a_time(candidate.text) for candidate in pool])
    if not stages.session_spread:
        order = np.lexsort((np.arange(len(pool)), -adjusted))[:k]
        return [(pool[i].id, float(adjusted[i])) for i in order]
    taken: dict[Any, int] = defaultdict(int)
    remaining = list(range(len(pool)))
    chosen = []
    while remaining and len(chosen) < k:
        charged = {i: adjusted[i] - stages.session_spread * taken[pool[i].session] for i in remaining}
        best_index = max(remaining, key=lambda i: (charged[i], -i))
        remaining.remove(best_index)
        taken[pool[best_index].session] += 1
        chosen.append((pool[best_index].id, float(charged[best_index])))
    return chosen


# ---- the comparison ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dev_split():
    data_file = DEFAULT_DATA / DATA_FILE
    if not data_file.is_file():
        pytest.skip(f"the LoCoMo dev split is not at {data_file}")
    from tiered_recall.embedders import resolve_embedder
    from tiered_recall.ingest import ingest

    embedder = resolve_embedder("wordllama")
    sink = ExactSearchSink(embedder)
    ingest(data_file, memory=sink, namespace="{conversation}", progress=False)
    questions, _ = load_questions(data_file)
    index = Bm25Index()
    records = list(sink.records.values())
    index.upsert([r.id for r in records], [r.namespace for r in records], [r.text for r in records])
    return sink, questions, embedder.embed_queries([q.text for q in questions]), index


def test_bm25_search_ranks_as_the_loop_did(dev_split) -> None:
    _, questions, _, index = dev_split
    for question in questions:
        for namespace, depth in ((question.conversation, 64), (question.conversation, 1000), (None, 100)):
            ids, scores = index.search(question.text, depth, namespace=namespace)
            expected_ids, expected_scores = reference_bm25_search(index, question.text, depth, namespace)
            np.testing.assert_array_equal(ids, expected_ids)
            np.testing.assert_array_equal(scores, expected_scores)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_dev_questions_top_k_is_the_loops(dev_split, preset: str) -> None:
    """The preset's stages, and the same with a session spread (its greedy loop), question by question."""
    sink, questions, query_vectors, index = dev_split
    by_namespace: dict[str, list] = defaultdict(list)
    for record in sink.records.values():
        by_namespace[record.namespace].append(record)
    matrices = {name: (np.array([r.id for r in members]), np.stack([sink.vectors[r.id] for r in members]))
                for name, members in by_namespace.items()}
    stages = PRESETS[preset].stages
    settings = (stages, replace(stages, session_spread=0.02))
    neighbour_moves = 0
    for question, vector in zip(questions, query_vectors):
        ids, matrix = matrices[question.conversation]
        cosine = matrix @ vector
        ranked = np.lexsort((ids, -cosine))[: stages.depth]
        vector_ids = ids[ranked].tolist()
        bm25_ids = index.search(question.text, stages.depth, namespace=question.conversation)[0].tolist()
        pooled = fused_pool(vector_ids, bm25_ids, stages.bm25_weight, stages.pool)
        assert pooled == reference_pool(vector_ids, bm25_ids, stages.bm25_weight, stages.pool)
        pool = [Candidate(i, score, sink.records[i].text, sink.records[i].metadata.get("session_number"),
                          sink.records[i].metadata) for i, score in pooled]
        for setting in settings:
            got = [(candidate.id, score) for candidate, score in rerank(pool, question.text, K, setting)]
            assert got == reference_rerank(pool, question.text, K, setting), question.text
        plain = [c.id for c, _ in rerank(pool, question.text, K, Stages())]
        neighbour_moves += plain != [c.id for c, _ in rerank(pool, question.text, K, stages)]
    assert neighbour_moves > len(questions) // 4  # the stages did re-rank: the comparison was not of pool orders
