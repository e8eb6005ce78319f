"""The vectorised retrieval stages and BM25 search rank exactly as the loop implementations they replaced: every dev
question's BM25 ranking, fused pool and re-ranked top k (ids and scores) compared with the reference below, kept only
here: BM25's search as of 040a8e2 (storage/_bm25.py), fusion and re-ranking as of 8b69094 (coordinator/stages.py,
the stages that merge brought: keyword match, neighbours lifting towards a better neighbour). Both ways the stages
run are compared: the compiled loops (_trstages, native/src/stagefast.c) and the Python ones.

The pools are built as a text search builds them, over the LoCoMo dev split ingested with WordLlama (the stages read
only a pool's ids, scores, texts and metadata, so the embedder that ranked it does not matter here)."""
from __future__ import annotations

import math
import sysconfig
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tiered_recall.coordinator.presets import PRESETS
from tiered_recall.coordinator.stages import (_QUESTION_WORDS, _TEMPORAL_QUESTION, CONVERSATION_KEY, RRF_C,
                                              TURN_INDEX_KEY, Candidate, Stages, compiled_stages, fused_pool,
                                              names_a_time, rerank)
from tiered_recall.storage._bm25 import Bm25Index
from tiered_recall.text_terms import tokenize
from tiered_recall.testing.locomo import DATA_FILE, DEFAULT_DATA, ExactSearchSink, load_questions

K = 25


@pytest.fixture(params=[True, False], ids=["compiled", "python"])
def compiled(request) -> bool:
    if request.param and compiled_stages() is None:
        has_headers = (Path(sysconfig.get_paths()["include"]) / "Python.h").exists()
        assert not has_headers, "Python.h and numpy are here, so `pip install .` must have built _trstages"
        pytest.skip("this Python has no headers: the build leaves the compiled stages out")
    return request.param


# ---- the reference: the loops of 040a8e2 (BM25) and 8b69094 (the stages) ---------------------------------------
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


def reference_keyword_match(question: str, texts) -> np.ndarray:
    words = [word for word in dict.fromkeys(tokenize(question)) if word not in _QUESTION_WORDS]
    if not words or not texts:
        return np.zeros(len(texts))
    column = {word: index for index, word in enumerate(words)}
    wanted = frozenset(words)
    holds = np.zeros((len(texts), len(words)), dtype=bool)
    for row, text in enumerate(texts):
        for word in frozenset(tokenize(text)) & wanted:
            holds[row, column[word]] = True
    count = len(texts)
    found_in = holds.sum(axis=0)
    weights = np.log1p((count - found_in + 0.5) / (found_in + 0.5))
    return (holds @ weights) / weights.sum()


def reference_rerank(pool, query_text: str, k: int, stages: Stages) -> list[tuple[int, float]]:
    raw = np.array([candidate.score for candidate in pool], dtype=np.float64)
    span = raw.max() - raw.min()
    scores = (raw - raw.min()) / span if span > 0 else np.ones_like(raw)
    if stages.keyword_weight:
        scores = scores + stages.keyword_weight * reference_keyword_match(query_text, [c.text for c in pool])
    adjusted = scores.copy()
    if stages.neighbour_weight:
        places = [(c.metadata.get(CONVERSATION_KEY), c.metadata.get(TURN_INDEX_KEY)) for c in pool]
        at = {place: index for index, place in enumerate(places) if isinstance(place[1], int)}
        before = [at.get((c, turn - 1), -1) if isinstance(turn, int) else -1 for c, turn in places]
        after = [at.get((c, turn + 1), -1) if isinstance(turn, int) else -1 for c, turn in places]
        padded = np.append(scores, 0.0)
        best = np.maximum(padded[before], padded[after])
        adjusted += stages.neighbour_weight * np.maximum(best - scores, 0.0)
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


# ---- the comparison ------------------------------------------------------------------------------------------------
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
def test_every_dev_questions_top_k_is_the_loops(dev_split, preset: str, compiled: bool) -> None:
    """The preset's stages over its vector pool, the same with a session spread (its greedy loop), and with BM25
    fusion building the pool (fused_pool), question by question."""
    sink, questions, query_vectors, index = dev_split
    by_namespace: dict[str, list] = defaultdict(list)
    for record in sink.records.values():
        by_namespace[record.namespace].append(record)
    matrices = {name: (np.array([r.id for r in members]), np.stack([sink.vectors[r.id] for r in members]))
                for name, members in by_namespace.items()}
    stages = PRESETS[preset].stages
    fused = replace(stages, bm25_weight=0.3)
    settings = (stages, replace(stages, session_spread=0.02), fused)
    moved = 0
    for question, vector in zip(questions, query_vectors):
        ids, matrix = matrices[question.conversation]
        cosine = matrix @ vector
        ranked = np.lexsort((ids, -cosine))[: max(stages.depth, stages.pool)]
        vector_ids = ids[ranked].tolist()
        bm25_ids = index.search(question.text, fused.depth, namespace=question.conversation)[0].tolist()
        fused_ids = fused_pool(vector_ids[: fused.depth], bm25_ids, fused.bm25_weight, fused.pool)
        assert fused_ids == reference_pool(vector_ids[: fused.depth], bm25_ids, fused.bm25_weight, fused.pool)
        vector_pool = [(i, float(cosine[row])) for i, row in zip(vector_ids[: stages.pool], ranked)]
        for setting in settings:
            pooled = fused_ids if setting.bm25_weight else vector_pool
            pool = [Candidate(i, score, sink.records[i].text, sink.records[i].metadata.get("session_number"),
                              sink.records[i].metadata) for i, score in pooled]
            got = [(candidate.id, score) for candidate, score in rerank(pool, question.text, K, setting,
                                                                        compiled=compiled)]
            assert got == reference_rerank(pool, question.text, K, setting), question.text
            if setting is stages:
                moved += [i for i, _ in vector_pool[:K]] != [i for i, _ in got]
    assert moved > len(questions) // 4  # the stages did re-rank: the comparison was not of pool orders


def test_random_pools_with_odd_metadata_rank_as_the_loop_did(compiled: bool) -> None:
    """Pools the dev split never makes: turns repeated within a conversation, conversations missing or not strings,
    turn indexes that are bools, floats, strings or absent, sessions repeated, tied scores."""
    rng = np.random.default_rng(11)
    words = "cat dog lemon cake when yesterday park Miso garden 2023 sunday trip".split()
    odd_turns = [None, True, False, 1.0, "3", -2]
    for _ in range(300):
        size = int(rng.integers(1, 70))
        pool = []
        for index in range(size):
            metadata: dict[str, Any] = {}
            if rng.random() < 0.9:
                metadata[TURN_INDEX_KEY] = (int(rng.integers(0, 12)) if rng.random() < 0.85
                                            else odd_turns[int(rng.integers(len(odd_turns)))])
            if rng.random() < 0.9:
                metadata[CONVERSATION_KEY] = [None, "a", "b", 7][int(rng.integers(4))]
            text = " ".join(rng.choice(words, size=int(rng.integers(1, 6))))
            score = float(rng.choice([0.5, 0.25, rng.random()]))
            pool.append(Candidate(index + 1, score, text, f"s{int(rng.integers(3))}", metadata))
        question = " ".join(rng.choice(words + ["what", "when", "did"], size=4)) + "?"
        setting = Stages(keyword_weight=float(rng.choice([0.0, 0.8])),
                         neighbour_weight=float(rng.choice([0.0, 0.5, 1.0])),
                         temporal_weight=float(rng.choice([0.0, 0.1])),
                         session_spread=float(rng.choice([0.0, 0.05])))
        k = int(rng.integers(1, 30))
        got = [(candidate.id, score) for candidate, score in rerank(pool, question, k, setting, compiled=compiled)]
        assert got == reference_rerank(pool, question, k, setting), (question, setting)


def test_the_compiled_stages_follow_numpy_where_scores_are_not_finite() -> None:
    """NaN and infinite pool scores (no tier gives them, but the compiled arithmetic must not part from numpy's
    there either): the compiled path's places and scores are the Python path's, NaNs compared by their bits."""
    if compiled_stages() is None:
        pytest.skip("the compiled stages are not built here")
    from tiered_recall.coordinator.stages import FeatureCache, rank_pool
    rng = np.random.default_rng(5)
    words = "cat dog lemon when yesterday park 2023".split()
    for _ in range(300):
        size = int(rng.integers(1, 40))
        scores = [float(rng.choice([rng.random(), 0.5, np.nan, np.inf, -np.inf], p=[0.6, 0.1, 0.1, 0.1, 0.1]))
                  for _ in range(size)]
        pool = [Candidate(i, scores[i], " ".join(rng.choice(words, size=3)), "s",
                          {TURN_INDEX_KEY: int(rng.integers(0, 8)), CONVERSATION_KEY: "a"}) for i in range(size)]
        features = FeatureCache().of(pool)
        question = " ".join(rng.choice(words, size=3)) + "?"
        setting = Stages(keyword_weight=0.8, neighbour_weight=float(rng.choice([0.5, 1.0])), temporal_weight=0.1)
        with np.errstate(invalid="ignore"):  # inf - inf and inf / inf: numpy warns, and both give NaN
            got = rank_pool(scores, features, None, question, 10, setting, compiled=True)
            expected = rank_pool(scores, features, None, question, 10, setting, compiled=False)
        assert got[0] == expected[0] and list(map(repr, got[1])) == list(map(repr, expected[1])), (scores, question)


def test_the_compiled_stages_refuse_what_is_not_theirs() -> None:
    """Wrong arguments raise TypeError (rank_pool never passes them): nothing is read past an array's end."""
    fast = compiled_stages()
    if fast is None:
        pytest.skip("the compiled stages are not built here")
    with pytest.raises(TypeError):
        fast.pool_lookups([("not", "features")], ("word",))
    with pytest.raises(TypeError):
        fast.pool_lookups((), ())
    with pytest.raises(TypeError):
        fast.pool_adjusted([0.5, 0.25], np.zeros(3), 0.8, None, 0.0, None, 0.0)
    with pytest.raises(TypeError):
        fast.pool_adjusted([0.5, 0.25], None, 0.0, np.zeros((2, 2), dtype=np.int32), 0.5, None, 0.0)
    with pytest.raises(ValueError, match="outside the pool"):
        fast.pool_adjusted([0.5, 0.25], None, 0.0, np.array([[0, 3], [1, 2]], dtype=np.intp), 0.5, None, 0.0)
    with pytest.raises(TypeError):
        fast.top_k(np.zeros(3, dtype=np.float32), 2)
    assert fast.top_k(np.array([0.1, 0.3, 0.3]), 5) == ([1, 2, 0], [0.3, 0.3, 0.1])


def test_a_compiled_module_of_another_build_is_not_used_and_the_warning_names_the_fix() -> None:
    from tiered_recall.native_files import installed_extension, load_extension

    path = installed_extension("_trstages")
    if path is None:
        pytest.skip("the compiled stages are not built here")
    with pytest.warns(RuntimeWarning, match="another version of the package .* reinstall the package"):
        assert load_extension(path, "_trstages", 99, "the retrieval stages run in Python") is None
