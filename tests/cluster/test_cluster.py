"""A cluster on a real Ray cluster of three nodes and a real S3 server: searches across shards equal exact search over
every row, a shard added moves about 1/N of the namespaces with nothing lost or duplicated while searches stay exact,
and a client on a shard's node reads it in its own process."""
from __future__ import annotations

import threading
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

import numpy as np
import pytest

from tiered_recall.cluster import ClusterMemory, add_shard
from tiered_recall.cluster.hashing import owner
from tiered_recall.errors import ShardUnavailable
from tiered_recall.namespaces import namespace_name

from exact import Model, same_answer, unit

DIM = 8


def fill(memory, model: Model, namespaces, rng: np.random.Generator, rows: int = 4, **extra) -> None:
    def add(ns):
        vectors = rng.standard_normal((rows, DIM)).astype(np.float32)
        ids = memory.add([f"{namespace_name(ns)} #{j}" for j in range(rows)], vectors=vectors, namespace=ns,
                         metadata=[{"j": j} for j in range(rows)], **extra)
        model.put(ns, ids, vectors)

    with ThreadPoolExecutor(8) as pool:  # concurrent adds to a shard share its commits
        list(pool.map(add, namespaces))


def test_a_search_across_shards_equals_exact_search_over_every_row(make_cluster, ray_nodes):
    config, memory = make_cluster(shards=3)
    rng = np.random.default_rng(7)
    namespaces = [("users", f"u{i}") for i in range(18)] + [f"team-{i}" for i in range(9)]
    model = Model()
    fill(memory, model, namespaces, rng)
    ring = memory._session.view.ring
    assert len(ring) == 3 and len({owner(namespace_name(ns), ring) for ns in namespaces}) == 3

    for _ in range(4):
        q = unit(rng, DIM)
        for ns in rng.permutation(np.array(namespaces, dtype=object))[:6]:
            ns = tuple(ns) if isinstance(ns, (list, tuple, np.ndarray)) else ns
            hits = memory.search(q, k=3, namespace=ns)
            assert same_answer(hits, model.exact(q, 3, namespace=ns))
            assert {h.shard for h in hits} == {owner(namespace_name(ns), ring)}
            assert all(h.tier in ("hot", "cold") and h.namespace == namespace_name(ns) for h in hits)
        across = memory.search(q, k=10, namespace_prefix=("users",))
        assert same_answer(across, model.exact(q, 10, prefix=("users",)))
        everywhere = memory.search(q, k=12)
        assert same_answer(everywhere, model.exact(q, 12))
        assert len({h.shard for h in everywhere}) > 1  # the answer really came from several shards
    report = memory.search(unit(rng, DIM), k=5, explain=True)
    assert len(report.hits) == 5 and report.rule and report.seconds > 0 and all(h.shard for h in report)

    assert memory.count() == len(model.rows) == 4 * len(namespaces)
    assert memory.count(("users", "u3")) == 4
    assert memory.list_namespaces(prefix=("users",), limit=1000) == sorted(("users", f"u{i}") for i in range(18))
    assert set(memory.namespaces()) == {namespace_name(ns) for ns in namespaces}
    some = sorted(model.rows)[:5]
    for i, found in zip(some, memory.get(some)):
        assert found.id == i and found.namespace == model.rows[i][0] and found.metadata.keys() == {"j"}
    for i, vector in zip(some, memory.vectors(some)):
        assert np.allclose(vector, model.rows[i][1], atol=1e-6)
    listed = list(memory.memories(("users", "u5")))
    assert sorted(m.text for m in listed) == [f"users/u5 #{j}" for j in range(4)]
    assert [m.id for m in listed] == sorted(m.id for m in listed)  # one add: one created_at, then by id
    assert sorted(m.id for m in memory.memories()) == sorted(model.rows)

    gone = [i for i, (ns, _) in model.rows.items() if ns == "team-2"]
    assert memory.delete(gone + [12345]) == 4
    model.drop(gone)
    assert memory.count("team-2") == 0 and memory.get(gone) == [None] * 4
    q = unit(rng, DIM)
    assert same_answer(memory.search(q, k=12), model.exact(q, 12))

    # This process runs on the head node, where one shard runs: its reads were served here, with no Ray hop, and
    # they are the answers the shard itself gives.
    served = memory.stats()["colocated"]
    assert served and sum(f["served"] for f in served.values()) > 0
    with ClusterMemory(ray_nodes.address, name=config.name, colocated=False) as remote:
        for ns in namespaces:
            assert [h.id for h in remote.search(q, k=3, namespace=ns)] == \
                   [h.id for h in memory.search(q, k=3, namespace=ns)]


def test_adding_a_shard_moves_about_one_nth_of_the_namespaces_and_loses_none(make_cluster, ray_nodes):
    config, memory = make_cluster(shards=2)
    rng = np.random.default_rng(11)
    namespaces = [f"tenant-{i}" for i in range(36)]
    model = Model()
    created = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)
    fill(memory, model, namespaces[:18], rng, rows=3, created_at=created)
    fill(memory, model, namespaces[18:], rng, rows=3, ttl=3600.0)
    before = {ns: sorted(memory.memories(ns), key=lambda m: m.id) for ns in namespaces}
    old_ring = memory._session.view.ring

    stop, failures, checked, unavailable = threading.Event(), [], [0], [0]

    def search_while_it_moves(seed: int) -> None:
        local = np.random.default_rng(seed)
        while not stop.is_set():
            q = unit(local, DIM)
            ns = namespaces[int(local.integers(len(namespaces)))]
            try:
                if not same_answer(memory.search(q, k=3, namespace=ns), model.exact(q, 3, namespace=ns)):
                    failures.append(("one", ns))
                if not same_answer(memory.search(q, k=8), model.exact(q, 8)):
                    failures.append(("all", None))
                checked[0] += 1
            except ShardUnavailable:
                unavailable[0] += 1

    searchers = [threading.Thread(target=search_while_it_moves, args=(1,))]
    for t in searchers:
        t.start()
    try:
        added = add_shard(config.name)
    finally:
        stop.set()
        for t in searchers:
            t.join()
    assert failures == [] and checked[0] > 0

    memory._session.refresh(force=True)
    new_ring = memory._session.view.ring
    assert set(new_ring) == set(old_ring) | {added}
    moved = [ns for ns in namespaces if owner(ns, old_ring) != owner(ns, new_ring)]
    assert all(owner(ns, new_ring) == added for ns in moved)  # only to the new shard, only what it now owns
    assert 0.15 <= len(moved) / len(namespaces) <= 0.55  # about 1/3
    assert memory.count() == len(model.rows)  # nothing lost, nothing twice
    for ns in namespaces:
        after = sorted(memory.memories(ns), key=lambda m: m.id)
        assert after == before[ns], ns  # ids, texts, metadata, created_at, expiry and ttl as they were
        hits = memory.search(unit(rng, DIM), k=1, namespace=ns)
        assert hits[0].shard == owner(ns, new_ring)
    ids = sorted(model.rows)
    for i, vector in zip(ids, memory.vectors(ids)):
        assert np.allclose(vector, model.rows[i][1], atol=1e-6)
    q = unit(rng, DIM)
    assert same_answer(memory.search(q, k=10), model.exact(q, 10))
    assert all(m.created_at == created for ns in namespaces[:3] for m in memory.memories(ns))
    assert _staging_tables(config) == []  # each batch's staged rows were dropped once it moved


def _staging_tables(config) -> list[str]:
    from tiered_recall.cluster.objectstore import connect

    return list(connect(config.moves_uri, config).table_names())


def test_no_credential_is_ever_printed_or_logged_and_writes_fail_loudly_while_storage_is_away(
        make_cluster, s3, ray_temp_dir, caplog, capfd):
    from tiered_recall.cluster import status
    from tiered_recall.errors import StorageError

    config, memory = make_cluster(shards=2)
    rng = np.random.default_rng(3)
    model = Model()
    fill(memory, model, [f"c{i}" for i in range(6)], rng, rows=2)
    s3.stop()
    try:
        with pytest.raises(StorageError) as away:
            memory.add(["while the store is away"], vectors=rng.standard_normal((1, DIM)), namespace="c1",
                       ids=[424242])
    finally:
        s3.start()
    message = str(away.value)
    assert "not acknowledged" in message and "cannot be reached" in message and s3.endpoint in message, message
    vectors = rng.standard_normal((1, DIM)).astype(np.float32)
    model.put("c2", memory.add(["after it came back"], vectors=vectors, namespace="c2"), vectors)  # recovered
    assert all(found is not None for found in memory.get(sorted(model.rows)))  # nothing acknowledged was lost
    printed = [message, repr(config), str(config.public()), str(status(config.name)), str(memory.stats()),
               caplog.text, *capfd.readouterr()]
    credentials = (s3.secret_key, s3.access_key)
    for text in printed:
        assert not any(secret in text for secret in credentials)
    leaked = [str(path) for path in Path(ray_temp_dir).rglob("*") if path.is_file() and path.stat().st_size < 1 << 26
              and any(secret.encode() in path.read_bytes() for secret in credentials)]
    assert leaked == []  # Ray's logs, the shards' and the directory's included


def test_the_framework_integrations_work_over_a_cluster(make_cluster):
    """LangChain's vector store, LangGraph's store and the MCP server over ClusterMemory, as over a TieredMemory."""
    import asyncio

    pytest.importorskip("langchain_core")
    pytest.importorskip("langgraph")
    from langchain_core.embeddings.fake import DeterministicFakeEmbedding
    from mcp import Client

    from tiered_recall.integrations.langchain import TieredRecallVectorStore
    from tiered_recall.integrations.langgraph import TieredRecallStore
    from tiered_recall.integrations.mcp_server import build_server

    _, texts = make_cluster(shards=2, dim=None, embedder="wordllama:64")  # the shards embed texts
    _, items = make_cluster(shards=1, dim=1)
    assert texts.dim == 64
    embeddings = DeterministicFakeEmbedding(size=64)

    documents = TieredRecallVectorStore(embeddings, memory=texts, namespace="docs")
    ids = documents.add_texts(["cats purr", "dogs bark", "rain in Porto"], metadatas=[{"n": 1}, {"n": 2}, {"n": 3}])
    assert documents.similarity_search("cats purr", k=1)[0].id == ids[0]
    assert [d.page_content for d in documents.get_by_ids(ids[1:])] == ["dogs bark", "rain in Porto"]
    documents.delete([ids[1]])
    assert {d.page_content for d in documents.similarity_search("dogs bark", k=3)} == {"cats purr", "rain in Porto"}

    index = {"dims": 64, "embed": embeddings, "fields": ["text"]}
    with TieredRecallStore(index=index, items=items, vectors=texts) as store:
        store.put(("users", "alice"), "food", {"text": "Ana is vegetarian"})
        store.put(("users", "bob"), "food", {"text": "Bob likes tacos"})
        assert store.get(("users", "alice"), "food").value == {"text": "Ana is vegetarian"}
        hits = store.search(("users",), query="Bob likes tacos", limit=2)
        assert (hits[0].namespace, hits[0].key) == (["users", "bob"], "food") or \
               (tuple(hits[0].namespace), hits[0].key) == (("users", "bob"), "food")
        assert store.list_namespaces(prefix=("users",)) == [("users", "alice"), ("users", "bob")]

    async def talk() -> None:
        async with Client(build_server(texts)) as client:
            added = await client.call_tool("add_memories", {"texts": ["My cat is called Miso"], "namespace": "mcp"})
            assert not added.is_error, added.content
            found = await client.call_tool("search_memories", {"query": "cat", "namespace": "mcp", "k": 1})
            assert not found.is_error and found.structured_content["hits"][0]["text"] == "My cat is called Miso"

    asyncio.run(talk())

    async def awaited() -> None:  # AsyncClusterMemory: the same cluster for asyncio code
        from tiered_recall.cluster import AsyncClusterMemory

        async with AsyncClusterMemory.wrap(texts) as memory:
            ids = await memory.add(["awaited"], vectors=np.ones((1, 64), np.float32), namespace="aio")
            hits = await memory.search(np.ones(64, np.float32), k=1, namespace="aio")
            assert [h.id for h in hits] == ids and hits[0].shard
            assert await memory.count("aio") == 1

    asyncio.run(awaited())


def test_the_cluster_serves_the_http_app_as_its_ingress(make_cluster, ray_nodes):
    """`tiered-recall cluster http` serves the HTTP API and memory browser of a single store (tiered_recall.http,
    one app, not two) over a ClusterMemory from a node's own server, behind its bearer token."""
    import ray
    import requests

    from tiered_recall.cluster.ingress import start_ingress
    from tiered_recall.http.settings import HttpSettings, TokenScope
    from tiered_recall.testing.cluster_parts import free_port

    config, memory = make_cluster(shards=2)
    ids = memory.add(["one", "two"], vectors=np.eye(2, DIM, dtype=np.float32), namespace="web")
    port, token = free_port(), "a-token-for-the-ingress-test"
    settings = HttpSettings(host="127.0.0.1", port=port, tokens={token: TokenScope.of(None)})
    handles = start_ingress(config.name, "tiered_recall.http:create_app", port=port, host="127.0.0.1",
                            nodes=[ray_nodes.cluster.head_node.node_id],
                            options={"settings": settings, "metrics": None})
    try:
        url = f"http://127.0.0.1:{port}/v1"
        assert requests.post(f"{url}/search", json={"vector": [1.0] + [0.0] * (DIM - 1), "k": 1}, timeout=30
                             ).status_code == 401
        found = requests.post(f"{url}/search", json={"vector": [1.0] + [0.0] * (DIM - 1), "k": 1, "namespace": "web",
                                                     "explain": True},
                              headers={"Authorization": f"Bearer {token}"}, timeout=30).json()
        assert [hit["id"] for hit in found["hits"]] == [ids[0]] and found["hits"][0]["text"] == "one"
        count = requests.get(f"{url}/count", params={"namespace": "web"},
                             headers={"Authorization": f"Bearer {token}"}, timeout=30).json()
        assert count["count"] == 2
        assert requests.get(f"http://127.0.0.1:{port}/", timeout=30).status_code == 200  # the memory browser
    finally:
        for handle in handles:
            ray.get(handle.close.remote(), timeout=60)
            ray.kill(handle, no_restart=True)
