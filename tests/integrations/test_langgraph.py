"""The LangGraph store: one random sequence of operations run against it and against LangGraph's own InMemoryStore,
every result compared (search order by score, ties aside); plus time to live, which InMemoryStore does not have."""
from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("langgraph")
from langchain_core.embeddings.fake import DeterministicFakeEmbedding  # noqa: E402
from langgraph.store.base import GetOp, ListNamespacesOp, MatchCondition, PutOp, SearchOp  # noqa: E402
from langgraph.store.memory import InMemoryStore  # noqa: E402

from tiered_recall.integrations.langgraph import TieredRecallStore  # noqa: E402

pytestmark = pytest.mark.lancedb

DIMS = 16
NAMESPACES = [("users", "alice"), ("users", "bob"), ("users", "bob", "notes"), ("teams", "red"), ("misc",)]
PREFIXES = [(), ("users",), ("users", "bob"), ("teams",), ("nobody",)]
KEYS = [f"k{i}" for i in range(12)]
WORDS = "pizza tea cats dogs rain Porto trains chess jazz yoga tax garden".split()


def random_value(rng: random.Random) -> dict:
    return {"text": " ".join(rng.sample(WORDS, 3)), "extra": {"title": rng.choice(WORDS)},
            "n": rng.randint(0, 9), "tag": rng.choice(["a", "b", "c"])}


def random_filter(rng: random.Random):
    return rng.choice([None, None, {"tag": rng.choice("abc")}, {"n": {"$gt": rng.randint(0, 8)}},
                       {"n": {"$lte": rng.randint(0, 8)}, "tag": {"$ne": "a"}}, {"extra": {"title": rng.choice(WORDS)}}])


def comparable(item):
    return None if item is None else (tuple(item.namespace), item.key, json.dumps(item.value, sort_keys=True))


def snapshot(reference: InMemoryStore) -> dict:
    """(namespace, key) -> value of every item: what a batch's reads see (its puts are applied after them)."""
    return {(ns, key): item.value for ns, items in reference._data.items() for key, item in items.items()}


def deeper(op: SearchOp) -> SearchOp:
    """The same search from the top and past its window: what ties at the window's edges are tied with."""
    return SearchOp(op.namespace_prefix, op.filter, op.offset + op.limit + 10, 0, op.query, refresh_ttl=False)


def check_same(op, got, want, reference: InMemoryStore, before: dict, where: str, ranking=None) -> None:
    if isinstance(op, GetOp):
        assert comparable(got) == comparable(want), where
    elif isinstance(op, SearchOp) and op.query:
        assert len(got) == len(want), f"{where}: {len(got)} results, InMemoryStore {len(want)}"
        got_scores = [r.score for r in got]
        want_scores = [r.score for r in want]
        assert got_scores == pytest.approx(want_scores, abs=1e-5), where
        # The same items, but where an item ties with one outside the window (before the offset or past the limit),
        # either may be returned.
        window = {(tuple(r.namespace), r.key) for r in want}
        outside = [r.score for r in ranking if (tuple(r.namespace), r.key) not in window and r.score is not None]

        def clear(results):
            return {(tuple(r.namespace), r.key) for r in results
                    if r.score is not None and all(abs(r.score - other) > 1e-5 for other in outside)}

        assert clear(got) == clear(want), where
        # Unindexed items fill a short answer unscored, in each store's own listing order (InMemoryStore's insertion
        # order, oldest first here): as many, each a real item (its value checked below).
        assert sum(r.score is None for r in got) == sum(r.score is None for r in want), where
        for r in got:
            assert before.get((tuple(r.namespace), r.key)) == r.value, where
    elif isinstance(op, SearchOp):  # no query: compared as sets (InMemoryStore lists in insertion order)
        assert {comparable(r) for r in got} == {comparable(r) for r in want}, where
    elif isinstance(op, ListNamespacesOp):
        # InMemoryStore also lists namespaces whose items were all deleted (or that a get only looked at).
        filled = {ns for ns, _ in before}
        want = [ns for ns in want if any(full[:len(ns)] == ns for full in filled)]
        assert got == want, where
    else:
        assert got is None and want is None, where


def random_op(rng: random.Random, stored: dict):
    kind = rng.choices(["put", "delete", "get", "search", "scan", "list"], weights=[8, 2, 3, 6, 2, 2])[0]
    if kind == "put":
        key = rng.choice(KEYS)
        if key in ("k10", "k11"):  # always unindexed: InMemoryStore keeps old texts' vectors when index changes
            return PutOp(rng.choice(NAMESPACES), key, random_value(rng), index=False)
        return PutOp(rng.choice(NAMESPACES), key, random_value(rng))
    if kind == "delete":
        return PutOp(rng.choice(NAMESPACES), rng.choice(KEYS), None)
    if kind == "get":
        return GetOp(rng.choice(NAMESPACES), rng.choice(KEYS), refresh_ttl=False)
    if kind == "search":
        return SearchOp(rng.choice(PREFIXES), random_filter(rng), rng.randint(1, 6), rng.randint(0, 3),
                        " ".join(rng.sample(WORDS, 2)), refresh_ttl=False)
    if kind == "scan":
        return SearchOp(rng.choice(PREFIXES), random_filter(rng), 100, 0, None, refresh_ttl=False)
    conditions = rng.choice([(), (MatchCondition("prefix", ("users",)),), (MatchCondition("suffix", ("notes",)),),
                             (MatchCondition("prefix", ("users", "*")),)])
    return ListNamespacesOp(conditions, rng.choice([None, 1, 2]), 100, 0)


@pytest.mark.parametrize("seed, steps", [(1, 1100), (2, 300), (3, 300)])
def test_a_random_sequence_gives_what_langgraphs_in_memory_store_gives(tmp_path, seed, steps):
    embeddings = DeterministicFakeEmbedding(size=DIMS)
    index = {"dims": DIMS, "embed": embeddings, "fields": ["text", "extra.title"]}
    reference = InMemoryStore(index=index)
    rng = random.Random(seed)
    with TieredRecallStore(tmp_path / "lg", index=index, device="cpu", hot_capacity=30) as store:
        log = []
        for step in range(steps):
            if rng.random() < 0.1:  # a batch of several operations, as LangGraph sends them
                ops = [random_op(rng, {}) for _ in range(rng.randint(2, 4))]
            else:
                ops = [random_op(rng, {})]
            log.append(ops)
            before = snapshot(reference)
            rankings = [reference.batch([deeper(op)])[0] if isinstance(op, SearchOp) and op.query else None
                        for op in ops]  # read before the batch's puts, as the batch's own reads are
            got, want = store.batch(ops), reference.batch(ops)
            for op, g, w, ranking in zip(ops, got, want, rankings):
                check_same(op, g, w, reference, before, f"seed {seed} step {step}: {op}", ranking)
        operations = sum(len(ops) for ops in log)
        searches = sum(isinstance(op, SearchOp) and bool(op.query) for ops in log for op in ops)
        assert operations >= steps and searches > steps // 8  # the sequence did search


def test_the_public_methods_and_namespaces(tmp_path):
    embeddings = DeterministicFakeEmbedding(size=DIMS)
    index = {"dims": DIMS, "embed": embeddings, "fields": ["text"]}
    with TieredRecallStore(tmp_path / "lg", index=index, device="none") as store:
        store.put(("users", "alice"), "food", {"text": "Ana is vegetarian"})
        store.put(("users", "alice"), "pets", {"text": "a cat called Miso"})
        store.put(("users", "bob"), "food", {"text": "Bob likes tacos"})
        assert store.get(("users", "alice"), "food").value == {"text": "Ana is vegetarian"}
        assert store.get(("users", "carol"), "food") is None
        hits = store.search(("users",), query="a cat called Miso", limit=3)
        assert hits[0].key == "pets" and hits[0].score == pytest.approx(1.0, abs=1e-5)
        assert {(tuple(h.namespace), h.key) for h in hits} == {(("users", "alice"), "food"),
                                                              (("users", "alice"), "pets"), (("users", "bob"), "food")}
        assert store.list_namespaces(prefix=("users",)) == [("users", "alice"), ("users", "bob")]
        store.delete(("users", "alice"), "pets")
        assert store.get(("users", "alice"), "pets") is None
        assert [h.key for h in store.search(("users", "alice"), query="cat")] == ["food"]


def test_an_item_past_its_time_to_live_is_gone_and_reading_refreshes_it(tmp_path, wall_clock):
    embeddings = DeterministicFakeEmbedding(size=DIMS)
    ttl = {"refresh_on_read": True, "sweep_interval_minutes": 1}
    with TieredRecallStore(tmp_path / "lg", index={"dims": DIMS, "embed": embeddings}, ttl=ttl,
                           device="cpu") as store:
        assert store.supports_ttl
        store.put(("s",), "brief", {"text": "goes soon"}, ttl=1)  # minutes, as LangGraph counts them
        store.put(("s",), "kept", {"text": "read often"}, ttl=1)
        store.put(("s",), "forever", {"text": "never expires"})
        wall_clock(40)
        assert store.get(("s",), "kept") is not None  # a read starts its time to live again: 60 s from here
        wall_clock(40)
        assert store.get(("s",), "brief") is None
        keys = {h.key for h in store.search(("s",), query="goes soon", limit=10, refresh_ttl=False)}
        assert keys == {"kept", "forever"}
        wall_clock(15)
        assert {h.key for h in store.search(("s",), limit=10)} == {"kept", "forever"}  # refreshes "kept"
        wall_clock(50)  # past the get's 60 s, within the search's
        assert store.get(("s",), "kept", refresh_ttl=False) is not None
        store.search(("s",), query="read often", limit=10, refresh_ttl=False)
        wall_clock(15)  # past the search's 60 s: the search without refresh left it as it was
        assert store.get(("s",), "kept") is None
        assert {h.key for h in store.search(("s",), limit=10)} == {"forever"}
