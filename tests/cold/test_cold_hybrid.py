"""Cold tier hybrid search: incremental BM25 over memory texts, reciprocal-rank fusion with the vector ranking."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tiered_recall.errors import InvalidInput
from tiered_recall.storage import ColdStore
from tiered_recall.storage._bm25 import Bm25Index, rrf_fuse, tokenize

pytestmark = pytest.mark.lancedb

DIM = 8


def unit(rng, n):
    v = rng.standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def rows(ids, vectors, texts, namespaces=None, roles=None):
    ids = np.asarray(ids, dtype=np.int64)
    n = ids.shape[0]
    return dict(ids=ids, vectors=vectors, namespaces=namespaces or ["default"] * n, texts=texts,
                sessions=[None] * n, roles=roles or [None] * n, created_at_us=ids * 10, metadata=[None] * n)


def test_tokenize_lowercases_drops_stopwords_and_plurals():
    assert tokenize("The Dogs and my HOBBIES, in 2023!") == ["dog", "hobby", "2023"]


def test_bm25_scores_match_the_formula_and_deleted_rows_never_score():
    bm = Bm25Index(k1=1.2, b=0.4)
    docs = {1: "red apple pie", 2: "green apple", 3: "apple apple banana split", 4: "car engine"}
    bm.upsert(list(docs), ["a", "a", "b", "a"], list(docs.values()))
    ids, scores = bm.search("apple pie", 10)
    toks = {i: tokenize(t) for i, t in docs.items()}
    avgdl = sum(len(t) for t in toks.values()) / 4

    def score(i):
        total = 0.0
        for term in ("apple", "pie"):
            df = sum(term in t for t in toks.values())
            tf = toks[i].count(term)
            idf = math.log(1 + (4 - df + 0.5) / (df + 0.5))
            total += idf * tf * 2.2 / (tf + 1.2 * (1 - 0.4 + 0.4 * len(toks[i]) / avgdl)) if tf else 0.0
        return total
    want = sorted((i for i in docs if score(i) > 0), key=lambda i: (-score(i), i))
    assert ids.tolist() == want
    np.testing.assert_allclose(scores, [score(i) for i in want], rtol=1e-5)
    assert bm.search("apple", 10, namespace="b")[0].tolist() == [3]
    bm.remove([1, 3])
    assert bm.search("apple pie", 10)[0].tolist() == [2]
    bm.upsert([2], ["a"], ["car wash"])  # an upsert replaces the text
    assert bm.search("apple", 10)[0].size == 0 and bm.search("car", 10)[0].tolist() == [2, 4]


def test_bm25_compaction_keeps_answers():
    bm = Bm25Index()
    n = 3000
    bm.upsert(list(range(n)), ["x"] * n, [f"word{i % 50} common" for i in range(n)])
    bm.remove(list(range(0, 2000)))
    assert bm.live_rows == 1000
    ids, _ = bm.search("word7", 100)
    assert sorted(ids.tolist()) == [i for i in range(2000, n) if i % 50 == 7]


def test_bm25_vocabulary_holds_only_terms_of_live_rows_and_answers_like_a_fresh_index():
    # Texts with one-off tokens (here a number per memory), added and deleted for a long time: the vocabulary
    # must not keep every token ever seen (the soak's workers grew by tens of MB that way).
    rng = np.random.default_rng(7)
    words = "apple river mountain coffee train doctor".split()
    bm, live, gone, next_id = Bm25Index(), {}, [], 0
    for step in range(6000):
        if rng.random() < 0.6 or not live:
            text = " ".join(rng.choice(words, 3)) + f" note {step}"
            bm.upsert([next_id], ["a" if step % 2 else "b"], [text])
            live[next_id] = text
            next_id += 1
        else:
            victim = list(live)[int(rng.integers(len(live)))]
            bm.remove([victim])
            gone.append(live.pop(victim))
    fresh = Bm25Index()
    fresh.upsert(list(live), ["a" if int(t.split()[-1]) % 2 else "b" for t in live.values()], list(live.values()))
    assert bm.live_rows == fresh.live_rows == len(live)
    assert bm.stats()["terms"] == fresh.stats()["terms"]  # exactly the live rows' terms
    assert bm.stats()["term_ids"] <= fresh.stats()["terms"] + 64  # freed ids are reused
    for query in ("apple note", "coffee train", gone[-1], gone[0], "river 5999", "mountain doctor 17"):
        for namespace in (None, "a"):
            got_ids, got_scores = bm.search(query, 20, namespace=namespace)
            want_ids, want_scores = fresh.search(query, 20, namespace=namespace)
            assert got_ids.tolist() == want_ids.tolist(), query
            np.testing.assert_allclose(got_scores, want_scores, rtol=1e-5)


def test_rrf_fuse_orders_by_fused_score_then_smaller_id():
    ids, scores = rrf_fuse([np.array([5, 1, 2]), np.array([1, 9])], 10, c=60)
    assert ids.tolist()[0] == 1  # in both rankings
    assert ids.tolist()[1:] == [5, 9, 2]  # 5 and 9 tie at 1/61: the smaller id first
    assert scores[0] == pytest.approx(1 / 62 + 1 / 61)


def test_hybrid_search_fuses_bm25_with_vectors_and_returns_exact_cosine(tmp_path):
    rng = np.random.default_rng(0)
    n = 200
    v = unit(rng, n)
    texts = [f"note {i} about the weather" for i in range(n)]
    texts[77] = "Caroline adopted a golden retriever puppy named Oscar"
    ns = ["a"] * 150 + ["b"] * 50
    with ColdStore(tmp_path / "cold", dim=DIM) as store:
        store.add(**rows(np.arange(n), v, texts, ns))
        q = v[3]
        vec_ids, _ = store.search(q, k=5)
        assert 77 not in vec_ids.tolist()
        ids, scores = store.search(q, k=5, text="what puppy did Caroline adopt?")
        assert 77 in ids.tolist() and ids[0] in (3, 77)
        np.testing.assert_allclose(scores, v[ids] @ q, atol=1e-5)  # exact cosine, in fused order
        assert store.text_search("golden retriever", k=3)[0].tolist() == [77]
        # Filters apply to both rankings.
        ids, _ = store.search(q, k=10, namespace="b", text="Caroline puppy")
        assert set(ids.tolist()) <= set(range(150, 200))
        ids, _ = store.search(q, k=10, text="Caroline puppy", exclude_ids=[77])
        assert 77 not in ids.tolist()
        ids, _ = store.search(q, k=10, text="Caroline puppy", where="id < 50")
        assert set(ids.tolist()) <= set(range(50))
        # Kept in step with writes: deleted rows never come back, new texts are found.
        store.delete([77])
        assert 77 not in store.search(q, k=10, text="Caroline puppy")[0].tolist()
        store.add(**rows([500], unit(rng, 1), ["Melanie painted a sunrise over the lake"]))
        assert store.text_search("sunrise lake", k=2)[0].tolist() == [500]
        assert store.search(q, k=200, text="sunrise")[0].tolist().count(500) == 1
        # Blank text is plain vector search; a non-str is refused.
        np.testing.assert_array_equal(store.search(q, k=5, text="  ")[0], store.search(q, k=5)[0])
        with pytest.raises(InvalidInput, match="text"):
            store.search(q, k=5, text=3)


def test_hybrid_sees_other_processes_writes(tmp_path):
    import subprocess
    import sys
    import textwrap
    rng = np.random.default_rng(1)
    path = tmp_path / "cold"
    v = unit(rng, 3)
    with ColdStore(path, dim=DIM) as store:
        store.add(**rows([1, 2], v[:2], ["alpha beta", "gamma delta"]))
        assert store.text_search("gamma", k=5)[0].tolist() == [2]
        code = textwrap.dedent(f"""
            import json, numpy as np
            from tiered_recall.storage import ColdStore
            with ColdStore({str(path)!r}, dim={DIM}) as s:
                vec = np.array([{v[2].tolist()!r}], dtype=np.float32)
                s.add(ids=np.array([3]), vectors=vec, namespaces=["default"], texts=["gamma ray burst"],
                      sessions=[None], roles=[None], created_at_us=np.array([3]), metadata=[None])
                s.delete([2])
                print(json.dumps({{"ok": True}}))
        """)
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert store.text_search("gamma", k=5)[0].tolist() == [3]
