"""A cluster on a real Ray cluster of three nodes and a real S3 server: searches across shards equal exact search over
every row, a shard added moves about 1/N of the namespaces with nothing lost or duplicated while searches stay exact,
and a client on a shard's node reads it in its own process."""
from __future__ import annotations

import random
import threading
import time
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
    namespaces = [f"tenant-{i}" for i in range(48)]
    model = Model()
    created = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)
    fill(memory, model, namespaces[:24], rng, rows=3, created_at=created)
    fill(memory, model, namespaces[24:], rng, rows=3, ttl=3600.0)
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

    searchers = [threading.Thread(target=search_while_it_moves, args=(s,)) for s in range(2)]
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
    # the moved rows' staging tables are gone from the bucket
    deadline = time.monotonic() + 10
    while any("/_moves/" in key and key.endswith(".manifest") for key in _keys(memory, config)) and \
            time.monotonic() < deadline:
        time.sleep(0.2)


def _keys(memory, config):
    from tiered_recall.cluster.objectstore import connect

    return connect(config.moves_uri, config).table_names()


def test_writes_to_a_namespace_go_on_while_others_move(make_cluster):
    config, memory = make_cluster(shards=2, durability="local", flush_s=0.5)
    rng = np.random.default_rng(5)
    namespaces = [f"n{i}" for i in range(30)]
    model = Model()
    fill(memory, model, namespaces, rng, rows=2)
    stop, errors = threading.Event(), []

    def write() -> None:
        local = random.Random(3)
        while not stop.is_set():
            ns = local.choice(namespaces)
            vectors = rng.standard_normal((1, DIM)).astype(np.float32)
            try:
                model.put(ns, memory.add(["more"], vectors=vectors, namespace=ns), vectors)
            except ShardUnavailable as exc:
                errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        add_shard(config.name)
    finally:
        stop.set()
        writer.join()
    assert errors == []  # writes to a moving namespace waited for it, and went on
    assert memory.count() == len(model.rows)
    q = unit(rng, DIM)
    assert same_answer(memory.search(q, k=10), model.exact(q, 10))
    for ns in namespaces[:10]:
        assert same_answer(memory.search(q, k=4, namespace=ns), model.exact(q, 4, namespace=ns))


@pytest.mark.parametrize("k", [1, 5])
def test_a_cluster_of_one_shard_answers_as_a_tiered_memory_does(make_cluster, tmp_path, k):
    from tiered_recall import TieredMemory

    config, memory = make_cluster(shards=1)
    rng = np.random.default_rng(k)
    vectors = rng.standard_normal((20, DIM)).astype(np.float32)
    ids = list(range(1, 21))
    memory.add([f"m{i}" for i in ids], vectors=vectors, namespace="solo", ids=ids)
    with TieredMemory(tmp_path / "plain", dim=DIM, embedder=None, device="none") as plain:
        plain.add([f"m{i}" for i in ids], vectors=vectors, namespace="solo", ids=ids)
        for _ in range(5):
            q = unit(rng, DIM)
            mine, theirs = memory.search(q, k=k, namespace="solo"), plain.search(q, k=k, namespace="solo")
            assert [(h.id, h.text, round(h.score, 6)) for h in mine] == \
                   [(h.id, h.text, round(h.score, 6)) for h in theirs]
            assert all(h.shard == "shard-0" for h in mine) and all(h.shard is None for h in theirs)
