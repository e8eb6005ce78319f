"""tiered_recall.integrations.langchain: LangChain's standard VectorStore suite (sync and async), filters equal to
brute-force filtered search, MMR, relevance scores, the id mapping, errors, and mem0 driven through it offline."""
from __future__ import annotations

import hashlib
import importlib
import re
import sys

import numpy as np
import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding, Embeddings
from langchain_tests.integration_tests import VectorStoreIntegrationTests

from tiered_recall import InvalidInput, TieredMemory
from tiered_recall.integrations.langchain import ID_KEY, TieredRecallEmbeddings, TieredRecallVectorStore, store_id

pytestmark = pytest.mark.lancedb

DIM = 16  # conftest's open_memory opens its TieredMemory this wide


# The standard suite mixes sync and async tests in one class, and a mark cannot be put on an inherited test without
# overriding it (which the suite's own test_no_overrides forbids): the class is marked for pytest-asyncio (strict
# mode) and the notice that its sync tests carry the mark needlessly is silenced, for this class only.
@pytest.mark.asyncio
@pytest.mark.filterwarnings("ignore:The test <Function .*> is marked with '@pytest.mark.asyncio' but it is not an "
                            "async function")
class TestStandardSuite(VectorStoreIntegrationTests):
    """langchain-tests' VectorStoreIntegrationTests over a store of its own (no hot tier: the suite tests the
    VectorStore contract; the hot tier is exercised by the tests below)."""

    @pytest.fixture
    def vectorstore(self, tmp_path):
        """An empty store in this test's own folder."""
        store = TieredRecallVectorStore(self.get_embeddings(), path=tmp_path / "store", device="none")
        try:
            yield store
        finally:
            store.close()


class TableEmbedding(Embeddings):
    """Texts -> the vectors a test chose (padded to DIM), so what is nearest to what is known."""

    def __init__(self, table: dict[str, list[float]]) -> None:
        self.table = {text: np.pad(np.asarray(v, dtype=np.float64), (0, DIM - len(v))).tolist()
                      for text, v in table.items()}

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self.table[t] for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self.table[text]


@pytest.fixture
def hot_store(open_memory):
    """store(embedding=..., namespace=...) -> a TieredRecallVectorStore over a fresh TieredMemory with a CPU hot tier
    (conftest stops its sidecar afterwards)."""
    def _store(embedding: Embeddings | None = None, **kwargs) -> TieredRecallVectorStore:
        return TieredRecallVectorStore(embedding or DeterministicFakeEmbedding(size=DIM), memory=open_memory(),
                                       **kwargs)
    return _store


@pytest.fixture
def path_store(tmp_path):
    """store(embedding=..., **kw) -> a TieredRecallVectorStore opened from a folder of this test (no hot tier)."""
    opened = []

    def _store(embedding: Embeddings | None = None, folder: str = "store", **kwargs) -> TieredRecallVectorStore:
        kwargs.setdefault("device", "none")
        store = TieredRecallVectorStore(embedding or DeterministicFakeEmbedding(size=DIM), path=tmp_path / folder,
                                        **kwargs)
        opened.append(store)
        return store

    yield _store
    for store in opened:
        store.close()


# ---- filters: exactly what filtering everything first, then ranking, gives -------------------------------------
def corpus(n: int) -> tuple[list[str], list[dict]]:
    """n texts with metadata of several kinds: a modulus, a colour, a float, a flag, and a key only some have."""
    colours = ["red", "green", "blue"]
    texts = [f"document number {i}" for i in range(n)]
    metas = []
    for i in range(n):
        meta = {"i": i, "mod7": i % 7, "colour": colours[i % 3], "weight": (i * 37 % 101) / 10.0, "even": i % 2 == 0}
        if i % 5 == 0:
            meta["tag"] = "fifth"
        metas.append(meta)
    return texts, metas


def brute_force(embedding: Embeddings, texts, metas, ids, query: str, k: int, keep) -> list[tuple[str, float]]:
    """(id, cosine) of the k best documents among those keep(metadata) accepts, computed here from scratch."""
    vectors = np.asarray(embedding.embed_documents(texts), dtype=np.float64)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    q = np.asarray(embedding.embed_query(query), dtype=np.float64)
    q /= np.linalg.norm(q)
    scored = [(ids[i], float(vectors[i] @ q)) for i in range(len(texts)) if keep(metas[i])]
    scored.sort(key=lambda pair: -pair[1])
    return scored[:k]


# (filter, the same condition written out in Python)
FILTER_CASES = [
    ({"colour": "red"}, lambda m: m["colour"] == "red"),
    ({"colour": "red", "even": True}, lambda m: m["colour"] == "red" and m["even"] is True),
    ({"mod7": {"$eq": 3}}, lambda m: m["mod7"] == 3),
    ({"mod7": {"$ne": 3}}, lambda m: m["mod7"] != 3),
    ({"weight": {"$gt": 5.0}}, lambda m: m["weight"] > 5.0),
    ({"weight": {"$gte": 2.5, "$lt": 4.0}}, lambda m: 2.5 <= m["weight"] < 4.0),
    ({"i": {"$lte": 10}}, lambda m: m["i"] <= 10),
    ({"colour": {"$in": ["red", "blue"]}}, lambda m: m["colour"] in ("red", "blue")),
    ({"mod7": {"$nin": [0, 1, 2]}}, lambda m: m["mod7"] not in (0, 1, 2)),
    ({"tag": "fifth"}, lambda m: m.get("tag") == "fifth"),
    ({"tag": {"$exists": False}}, lambda m: "tag" not in m),
    ({"tag": {"$ne": "fifth"}}, lambda m: m.get("tag") != "fifth"),  # no key: not equal, so matched
    ({"$or": [{"mod7": 0}, {"colour": "green"}]}, lambda m: m["mod7"] == 0 or m["colour"] == "green"),
    ({"$and": [{"even": False}, {"$not": {"colour": "blue"}}]}, lambda m: not m["even"] and m["colour"] != "blue"),
    ({"even": 1}, lambda m: False),  # JSON's true is not 1
    ({"colour": "purple"}, lambda m: False),
]


def check_filtered(store: TieredRecallVectorStore, embedding, texts, metas, ids, query, k, spec, keep) -> None:
    got = store.similarity_search_with_score(query, k=k, filter=spec)
    want = brute_force(embedding, texts, metas, ids, query, k, keep)
    assert [doc.id for doc, _ in got] == [i for i, _ in want], spec
    np.testing.assert_allclose([s for _, s in got], [s for _, s in want], atol=1e-5)
    for doc, _ in got:
        assert keep(doc.metadata) and ID_KEY not in doc.metadata


def test_filters_equal_brute_force_on_a_small_namespace(hot_store):
    embedding = DeterministicFakeEmbedding(size=DIM)
    store = hot_store(embedding)
    texts, metas = corpus(60)
    ids = store.add_texts(texts, metas)
    for spec, keep in FILTER_CASES:
        for k in (1, 4, 25, 100):  # 100: more than the namespace holds
            check_filtered(store, embedding, texts, metas, ids, "what is near here", k, spec, keep)
    assert store.similarity_search("what is near here", k=4, filter=lambda doc: doc.metadata["i"] in (5, 50)) == \
        [doc for doc, _ in store.similarity_search_with_score("what is near here", k=4,
                                                                filter={"i": {"$in": [5, 50]}})]


class SearchSpy:
    """Wraps TieredMemory.search to record the k and where of each call."""

    def __init__(self, memory: TieredMemory, monkeypatch) -> None:
        self.calls: list[tuple[int, str | None]] = []
        search = memory.search

        def spy(query, *, k=10, where=None, **kw):
            self.calls.append((k, where))
            return search(query, k=k, where=where, **kw)

        monkeypatch.setattr(memory, "search", spy)


def test_filters_past_the_largest_k_stay_exact(hot_store, monkeypatch):
    """600 documents: a common filter is answered by deepening the search, a rare one (fewer matches in the best 256
    than asked for) and a k past 256 by the scan, and both equal brute force."""
    embedding = DeterministicFakeEmbedding(size=DIM)
    store = hot_store(embedding)
    texts, metas = corpus(600)
    ids = store.add_texts(texts, metas)
    spy = SearchSpy(store.memory, monkeypatch)

    check_filtered(store, embedding, texts, metas, ids, "a query", 10, {"colour": "green"},
                   lambda m: m["colour"] == "green")
    assert spy.calls and all(where is None for _, where in spy.calls)  # deepened (k doubling), no scan

    spy.calls.clear()
    rare = {"i": {"$in": [3, 333, 599]}}
    check_filtered(store, embedding, texts, metas, ids, "a query", 5, rare, lambda m: m["i"] in (3, 333, 599))
    assert any(k == 256 for k, _ in spy.calls) and any(where is not None for _, where in spy.calls)

    spy.calls.clear()
    check_filtered(store, embedding, texts, metas, ids, "another query", 300, {"even": True},
                   lambda m: m["even"] is True)
    check_filtered(store, embedding, texts, metas, ids, "another query", 400, None, lambda m: True)
    assert any(where is not None for _, where in spy.calls)


def test_a_bad_filter_fails_even_on_an_empty_store(path_store):
    store = path_store()
    for spec, says in [({"mod7": {"$regex": "x"}}, "$regex"), ({"$nor": []}, "$nor"),
                       ({"colour": {"$in": "red"}}, "list"), ({"tag": {"$exists": "yes"}}, "True or False"),
                       ({"$or": []}, "non-empty list"), (["colour"], "dict"),
                       ({"i": {"$gt": 1, "lt": 3}}, "mixes operators and the plain key 'lt'")]:
        with pytest.raises(InvalidInput, match=re.escape(says)):
            store.similarity_search("anything", k=1, filter=spec)


# ---- MMR and relevance scores --------------------------------------------------------------------------------
MMR_TABLE = {
    "query": [1.0, 0.0, 0.0],
    "close": [1.0, 0.10, 0.0],
    "close twin": [1.0, 0.11, 0.0],  # nearly the same as "close": adds little once "close" is picked
    "different": [0.6, 0.0, 0.8],
    "far": [-1.0, 0.0, 0.0],
}


def test_mmr_trades_similarity_for_diversity(hot_store):
    store = hot_store(TableEmbedding(MMR_TABLE))
    texts = ["close", "close twin", "different", "far"]
    store.add_texts(texts, [{"n": i} for i in range(4)], ids=texts)
    by_similarity = [d.id for d in store.similarity_search("query", k=2)]
    assert by_similarity == ["close", "close twin"]
    assert [d.id for d in store.max_marginal_relevance_search("query", k=2, fetch_k=4, lambda_mult=1.0)] == \
        by_similarity
    assert [d.id for d in store.max_marginal_relevance_search("query", k=2, fetch_k=4, lambda_mult=0.5)] == \
        ["close", "different"]
    # fetch_k bounds the candidates: with only the best two fetched, "different" is not among them
    assert [d.id for d in store.max_marginal_relevance_search("query", k=2, fetch_k=2, lambda_mult=0.5)] == \
        ["close", "close twin"]
    # the filter applies before MMR picks
    assert [d.id for d in store.max_marginal_relevance_search("query", k=2, fetch_k=4, lambda_mult=0.5,
                                                              filter={"n": {"$ne": 0}})] == ["close twin",
                                                                                             "different"]
    docs = store.max_marginal_relevance_search_by_vector(MMR_TABLE["query"] + [0.0] * (DIM - 3), k=3, fetch_k=4)
    assert [d.id for d in docs][:2] == ["close", "different"] and len(docs) == 3
    assert store.max_marginal_relevance_search("query", k=2, filter={"n": 99}) == []


def test_relevance_scores_map_cosine_into_zero_one(hot_store):
    store = hot_store(TableEmbedding(MMR_TABLE))
    texts = ["close", "different", "far", "query"]
    store.add_texts(texts, ids=texts)
    with_cosine = store.similarity_search_with_score("query", k=4)
    relevance = store.similarity_search_with_relevance_scores("query", k=4)
    assert [d.id for d, _ in relevance] == [d.id for d, _ in with_cosine] == ["query", "close", "different", "far"]
    np.testing.assert_allclose([s for _, s in relevance], [(1 + c) / 2 for _, c in with_cosine], atol=1e-6)
    assert all(0.0 <= s <= 1.0 for _, s in relevance)
    assert relevance[0][1] == pytest.approx(1.0, abs=1e-6) and relevance[-1][1] == pytest.approx(0.0, abs=1e-6)
    kept = store.similarity_search_with_relevance_scores("query", k=4, score_threshold=0.7)
    assert [d.id for d, _ in kept] == ["query", "close", "different"]  # different: cos 0.6 -> 0.8
    relevance_of = store._select_relevance_score_fn()
    assert (relevance_of(1.0000002), relevance_of(-1.0000002), relevance_of(0.0)) == (1.0, 0.0, 0.5)


# ---- ids ---------------------------------------------------------------------------------------------------------
def test_ids_round_trip_and_stay_within_the_namespace(open_memory):
    memory = open_memory()
    embedding = DeterministicFakeEmbedding(size=DIM)
    first = TieredRecallVectorStore(embedding, memory=memory, namespace="first")
    second = TieredRecallVectorStore(embedding, memory=memory, namespace="second")
    odd_ids = ["4f9b7c1e-0000-4000-8000-000000000001", "Zürich ☃", "  spaces  ", "x" * 300]
    assert first.add_texts(["a", "b", "c", "d"], [{"k": 1}, None, {}, {"id": "mine"}], ids=odd_ids) == odd_ids
    assert second.add_texts(["other a"], ids=[odd_ids[0]]) == [odd_ids[0]]  # the same string in another namespace

    got = first.get_by_ids([odd_ids[3], "missing", odd_ids[0], odd_ids[3]])
    assert got == [Document(id=odd_ids[3], page_content="d", metadata={"id": "mine"}),
                   Document(id=odd_ids[0], page_content="a", metadata={"k": 1})]
    assert {d.id for d in first.similarity_search("a", k=10)} == set(odd_ids)
    assert second.get_by_ids([odd_ids[0]])[0].page_content == "other a"
    stored = memory.get([store_id("first", odd_ids[0])])[0]
    assert stored.namespace == "first" and stored.metadata[ID_KEY] == odd_ids[0]

    first.delete([odd_ids[0]])
    assert first.get_by_ids([odd_ids[0]]) == [] and len(second.get_by_ids([odd_ids[0]])) == 1
    # the same id twice in one call: the later text wins, and both places in the answer keep the id
    assert first.add_texts(["old", "new"], ids=["twice", "twice"]) == ["twice", "twice"]
    assert first.get_by_ids(["twice"])[0].page_content == "new"
    generated = first.add_documents([Document(page_content="no id"), Document(page_content="own", id="own")])
    assert generated[1] == "own" and len(generated[0]) == 36 and first.get_by_ids(generated)[0].page_content == "no id"


def test_the_store_serves_only_its_own_documents(hot_store):
    """A row put into the namespace by TieredMemory.add has no LangChain id: searches and delete(None) pass it by."""
    store = hot_store()
    ids = store.add_texts(["mine one", "mine two"])
    vector = np.asarray(store.embeddings.embed_query("mine one"), dtype=np.float32)
    [foreign] = store.memory.add(["foreign"], vectors=vector[None, :], namespace=store.namespace)
    assert [d.id for d in store.similarity_search("mine one", k=3)] == [ids[0], ids[1]]
    assert store.delete() is True
    assert store.similarity_search("mine one", k=3) == []
    assert store.memory.get([foreign])[0].text == "foreign"


def test_documents_persist_and_from_texts_opens_a_store(tmp_path):
    embedding = DeterministicFakeEmbedding(size=DIM)
    with TieredRecallVectorStore.from_texts(["alpha", "beta"], embedding, [{"n": 1}, {"n": 2}], ids=["a", "b"],
                                            path=tmp_path / "store", device="none") as store:
        assert [d.id for d in store.similarity_search("beta", k=2)] == ["b", "a"]
    with TieredRecallVectorStore(embedding, path=tmp_path / "store", device="none") as again:
        assert again.get_by_ids(["a"]) == [Document(id="a", page_content="alpha", metadata={"n": 1})]


def test_the_offline_embeddings_find_by_meaning(tmp_path):
    """TieredRecallEmbeddings (E5 by default, its weights installed with tiered-recall): a question finds the
    document it is about."""
    embedding = TieredRecallEmbeddings()
    assert embedding.embed_documents([]) == []
    with TieredRecallVectorStore(embedding, path=tmp_path / "store", device="none") as store:
        assert store.memory.dim == len(embedding.embed_query("probe")) == 384
        store.add_texts(["Ana is vegan and never eats meat", "Ana moved to Porto last spring",
                         "Bob plays chess on Sundays"], ids=["diet", "home", "chess"])
        assert store.similarity_search("What food does Ana avoid?", k=1)[0].id == "diet"
        assert store.similarity_search("Which city does Ana live in?", k=1)[0].id == "home"


# ---- async (the standard suite covers add, search, delete and get) ---------------------------------------------
@pytest.mark.asyncio
async def test_async_searches_match_the_sync_ones(hot_store):
    store = hot_store(TableEmbedding(MMR_TABLE))
    texts = ["close", "close twin", "different", "far"]
    await store.aadd_texts(texts, [{"n": i} for i in range(4)], ids=texts)
    assert [d.id for d in await store.amax_marginal_relevance_search("query", k=2, fetch_k=4)] == \
        [d.id for d in store.max_marginal_relevance_search("query", k=2, fetch_k=4)] == ["close", "different"]
    assert await store.asimilarity_search_with_relevance_scores("query", k=2, filter={"n": {"$gte": 2}}) == \
        store.similarity_search_with_relevance_scores("query", k=2, filter={"n": {"$gte": 2}})
    assert [d.id for d in await store.asimilarity_search_by_vector(MMR_TABLE["far"] + [0.0] * (DIM - 3), k=1)] == \
        ["far"]


# ---- errors --------------------------------------------------------------------------------------------------
def test_a_dimension_mismatch_names_the_fix(path_store):
    path_store(DeterministicFakeEmbedding(size=6)).add_texts(["six wide"])
    wider = path_store(DeterministicFakeEmbedding(size=8), folder="store")  # the same folder, another model
    with pytest.raises(InvalidInput, match="8-d vectors but the store at .* holds 6-d ones: use the embedding model"):
        wider.add_texts(["eight wide"])
    with pytest.raises(InvalidInput, match="8-d vectors"):
        wider.similarity_search("eight wide")
    with pytest.raises(InvalidInput, match="8-d vectors"):
        wider.similarity_search_by_vector([0.5] * 8)


def test_bad_arguments_are_refused_with_the_fix(path_store, tmp_path):
    store = path_store()
    embedding = DeterministicFakeEmbedding(size=DIM)
    with pytest.raises(InvalidInput, match="either memory=.* or path="):
        TieredRecallVectorStore(embedding)
    with pytest.raises(InvalidInput, match="device and hot_capacity are for a store opened from path"):
        TieredRecallVectorStore(embedding, memory=store.memory, device="cpu")
    with pytest.raises(InvalidInput, match="namespace must be a non-empty string"):
        TieredRecallVectorStore(embedding, memory=store.memory, namespace="")
    with pytest.raises(InvalidInput, match="langchain_core Embeddings"):
        TieredRecallVectorStore(lambda texts: texts, path=tmp_path / "x")
    with pytest.raises(InvalidInput, match=f"the key '{ID_KEY}'"):
        store.add_texts(["a"], [{ID_KEY: "forged"}])
    with pytest.raises(InvalidInput, match="LangChain ids are"):
        store.add_texts(["a"], ids=[7])
    with pytest.raises(InvalidInput, match="2 metadatas for 1 texts"):
        store.add_texts(["a"], [{}, {}])
    with pytest.raises(InvalidInput, match="not one string"):
        store.get_by_ids("abc")
    with pytest.raises(InvalidInput, match="k must be a positive int"):
        store.similarity_search("a", k=0)
    with pytest.raises(InvalidInput, match="unexpected argument.*namespace"):
        store.similarity_search("a", namespace="elsewhere")
    with pytest.raises(InvalidInput, match="lambda_mult"):
        store.max_marginal_relevance_search("a", lambda_mult=2)
    assert store.add_texts([]) == [] and store.similarity_search("a") == []  # nothing was written by the refusals


def test_without_langchain_core_the_import_names_the_extra(monkeypatch):
    for name in [n for n in sys.modules if n == "langchain_core" or n.startswith("langchain_core.")]:
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: "import ... halted"
    monkeypatch.delitem(sys.modules, "tiered_recall.integrations.langchain")
    with pytest.raises(ImportError, match=r'pip install "tiered-recall\[langchain\]"'):
        importlib.import_module("tiered_recall.integrations.langchain")


# ---- mem0 over the store, offline ---------------------------------------------------------------------------------
class WordsEmbedding(Embeddings):
    """A bag of words hashed into DIM buckets: texts that share words are near (no model, no network)."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self.embed_query(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        v = np.full(DIM, 0.01)
        for word in text.lower().replace("?", " ").replace(".", " ").split():
            v[hashlib.blake2b(word.encode(), digest_size=2).digest()[0] % DIM] += 1.0
        return v.tolist()


def test_mem0_adds_and_searches_through_the_store(path_store, tmp_path, monkeypatch):
    """mem0's "langchain" vector-store provider over a TieredRecallVectorStore: infer=False (no LLM step; a fake
    chat model that must never be called), mem0's langchain embedder over a local embedding, telemetry off."""
    monkeypatch.setenv("MEM0_TELEMETRY", "False")
    monkeypatch.setenv("MEM0_DIR", str(tmp_path / "mem0"))  # read when mem0 is imported, next line
    mem0 = pytest.importorskip("mem0", reason="mem0ai is not installed")
    pytest.importorskip("langchain_community", reason="mem0's langchain provider needs langchain-community")
    from langchain_core.language_models import FakeListChatModel

    embedding = WordsEmbedding()
    store = path_store(embedding)
    llm = FakeListChatModel(responses=["the LLM must not be called"])
    m = mem0.Memory.from_config({
        "vector_store": {"provider": "langchain", "config": {"client": store, "collection_name": "mem0"}},
        "embedder": {"provider": "langchain", "config": {"model": embedding}},
        "llm": {"provider": "langchain", "config": {"model": llm}},
        "history_db_path": str(tmp_path / "history.db"),
    })
    try:
        added = [m.add(text, user_id=user, infer=False)["results"][0]
                 for text, user in [("Ana is vegan", "alice"), ("Ana lives in Porto", "alice"),
                                    ("Bob is vegan too", "bob")]]
        assert store.memory.count(store.namespace) == 3
        stored = store.get_by_ids([a["id"] for a in added])  # mem0's memory ids are the documents' ids
        assert [d.page_content for d in stored] == ["Ana is vegan", "Ana lives in Porto", "Bob is vegan too"]
        assert [d.metadata["user_id"] for d in stored] == ["alice", "alice", "bob"]

        found = m.search("Is Ana vegan?", filters={"user_id": "alice"}, top_k=2)["results"]
        assert found[0]["id"] == added[0]["id"] and found[0]["memory"] == "Ana is vegan"
        assert {r["user_id"] for r in found} == {"alice"}  # the filter reached the store: no bob
        direct = store.similarity_search_with_score("Is Ana vegan?", k=1, filter={"user_id": "alice"})
        assert found[0]["score"] == pytest.approx(direct[0][1], abs=1e-6)

        m.delete(added[1]["id"])
        assert store.get_by_ids([added[1]["id"]]) == [] and store.memory.count(store.namespace) == 2
        assert llm.i == 0
    finally:
        m.db.close()
