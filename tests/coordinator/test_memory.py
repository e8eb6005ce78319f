"""TieredMemory end to end: tiered answers equal exact search, durability across sidecar kills, sharing, bad input."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest

from tiered_recall import InvalidInput, TieredMemory
from tiered_recall.hot.proc import pid_alive
from tiered_recall.hot import HotTier, segment_path

DIM = 32


def unit_rows(rng, n, dim=DIM):
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def sidecar_pid(memory: TieredMemory) -> int:
    with HotTier.attach(memory.sidecar_name) as hot:
        return hot.owner_pid




def exact(vectors: dict[int, np.ndarray], namespaces: dict[int, str], q: np.ndarray, k: int, namespace=None):
    ids = np.array(sorted(i for i in vectors if namespace is None or namespaces[i] == namespace), dtype=np.int64)
    if ids.size == 0:
        return [], np.array([])
    x = np.stack([vectors[i] for i in ids])
    scores = x @ q
    order = np.lexsort((ids, -scores))[:k]
    return ids[order].tolist(), scores[order]


def check_against_exact(memory, vectors, namespaces, rng, k=5):
    for namespace in (None, "a", "b", "c"):
        for _ in range(4):
            q = unit_rows(rng, 1)[0]
            want_ids, want_scores = exact(vectors, namespaces, q, k, namespace)
            hits = memory.search(q, k=k, namespace=namespace)
            got_scores = np.array([h.score for h in hits])
            assert len(hits) == len(want_ids)
            np.testing.assert_allclose(got_scores, want_scores, atol=1e-5)
            # identical up to float near-ties
            clearly = {i for i, s in zip(want_ids, want_scores) if s > want_scores[-1] + 1e-5}
            assert clearly <= {h.id for h in hits}
            assert all(namespace is None or h.namespace == namespace for h in hits)
            assert all(h.tier in ("hot", "cold") for h in hits)


def test_tiered_search_equals_exact_search_across_adds_deletes_and_evictions(open_memory):
    rng = np.random.default_rng(11)
    memory = open_memory(hot_capacity=40)  # smaller than the data: namespaces become incomplete
    vectors: dict[int, np.ndarray] = {}
    namespaces: dict[int, str] = {}
    next_id = 1
    for step in range(12):
        ns = ["a", "b", "c"][step % 3]
        n = int(rng.integers(3, 12))
        x = unit_rows(rng, n)
        ids = list(range(next_id, next_id + n))
        next_id += n
        memory.add([f"memory {i}" for i in ids], vectors=x, ids=ids, namespace=ns)
        for i, v in zip(ids, x):
            vectors[i], namespaces[i] = v, ns
        if step % 4 == 3:  # delete a few, across namespaces
            victims = [int(v) for v in rng.choice(sorted(vectors), size=4, replace=False)]
            assert memory.delete(victims) == 4
            for v in victims:
                del vectors[v], namespaces[v]
        check_against_exact(memory, vectors, namespaces, rng)
    stats = memory.stats()
    assert stats["cold_rows"] == len(vectors)
    assert stats["hot_rows"] <= 40
    assert stats["latency"].get("hot+cold", {}).get("searches", 0) > 0, "some searches had to ask the cold tier"


def test_complete_namespace_is_answered_by_the_hot_tier_alone(open_memory):
    rng = np.random.default_rng(5)
    memory = open_memory(hot_capacity=1000)
    x = unit_rows(rng, 30)
    memory.add([f"m{i}" for i in range(30)], vectors=x, ids=list(range(30)), namespace="small")
    hits = memory.search(x[7], k=3, namespace="small")
    assert hits[0].id == 7 and all(h.tier == "hot" for h in hits)
    assert memory.stats()["latency"]["hot"]["searches"] == 1
    assert "hot+cold" not in memory.stats()["latency"]


def test_a_scope_no_rule_could_answer_is_searched_in_the_cold_tier_without_asking_the_hot_one(open_memory):
    """With the hot tier holding part of a namespace and no bounds to rule on (rules=("complete",)), the cold tier's
    exact answer is the answer: the hot tier is not asked (its search count stays), the path is "cold", and the cold
    hits are still promoted; a namespace the hot tier holds whole is answered by it alone."""
    rng = np.random.default_rng(11)
    memory = open_memory(hot_capacity=8, rules=("complete",))
    x = unit_rows(rng, 20)
    memory.add([f"m{i}" for i in range(20)], vectors=x, ids=list(range(20)), namespace="big")
    memory.add(["s0", "s1"], vectors=unit_rows(rng, 2), ids=[100, 101], namespace="small")
    hot = memory._link.hot
    asked = hot.stats()["searches"]
    report = memory.search(x[0], k=3, namespace="big", explain=True)
    assert (report.rule, report.path) == ("cold", "cold")
    assert report.hits[0].id == 0 and all(h.tier == "cold" for h in report.hits)
    assert hot.stats()["searches"] == asked, "the hot tier was asked although no rule could use its answer"
    assert bool(hot.contains(np.array([0], dtype=np.int64))[0]), "a cold hit is promoted on the cold path"
    small = memory.search(x[0], k=1, namespace="small", explain=True)
    assert (small.rule, small.path) == ("complete", "hot") and hot.stats()["searches"] == asked + 1


def test_cold_hits_are_promoted(open_memory):
    rng = np.random.default_rng(6)
    memory = open_memory(hot_capacity=5)
    x = unit_rows(rng, 20)
    memory.add([f"m{i}" for i in range(20)], vectors=x, ids=list(range(20)), namespace="n")
    first = memory.search(x[0], k=1, namespace="n")  # id 0 was evicted long ago: served cold
    assert first[0].id == 0 and first[0].tier == "cold"
    second = memory.search(x[0], k=1, namespace="n")
    assert second[0].id == 0 and second[0].tier == "hot"


def test_a_promotion_waits_for_no_writer(open_memory):
    """While another process holds the store's write lock, a cold hit is answered but not promoted (a promotion
    racing a delete could leave the hot tier a row the cold tier lacks); once the lock is free it is."""
    import fcntl

    rng = np.random.default_rng(7)
    memory = open_memory(hot_capacity=5)
    x = unit_rows(rng, 20)
    memory.add([f"m{i}" for i in range(20)], vectors=x, ids=list(range(20)), namespace="n")
    with open(memory.path / ".write.lock", "a+") as other:  # another open file: flock excludes it like a process
        fcntl.flock(other, fcntl.LOCK_EX)
        with memory._write_lock.held(wait=False) as got:
            assert got is False
        assert memory.search(x[0], k=1, namespace="n")[0].tier == "cold"
        assert memory.search(x[0], k=1, namespace="n")[0].tier == "cold", "not promoted while the lock is taken"
    with memory._write_lock.held() as outer, memory._write_lock.held(wait=False) as inner:
        assert outer is True and inner is True  # re-entrant within the thread that holds it
    assert memory.search(x[0], k=1, namespace="n")[0].tier == "cold"
    assert memory.search(x[0], k=1, namespace="n")[0].tier == "hot"


def test_the_write_lock_excludes_other_threads_and_closes_with_the_store(open_memory):
    """The lock file stays open between uses; another thread of the process is still excluded (a mutex before the
    flock, which alone would not tell two threads of one open file apart), and close() closes the file."""
    import threading

    memory = open_memory()
    lock = memory._write_lock
    seen = []
    with lock.held():
        worker = threading.Thread(target=lambda: seen.append(lock.held(wait=False).__enter__()))
        worker.start()
        worker.join()
    assert seen == [False]
    with lock.held(wait=False) as got:
        assert got is True
    fd = lock._fd
    assert fd is not None and os.fstat(fd)
    memory.close()
    assert lock._fd is None
    with pytest.raises(OSError):
        os.fstat(fd)


def test_hits_carry_the_memory_fields_and_a_query_of_any_magnitude_is_normalised(open_memory):
    """A Hit is its memory's fields plus score and tier (equal to one built field by field); a query vector is
    searched by its direction whether its square norm overflows or underflows float32."""
    from tiered_recall.coordinator.records import Hit

    rng = np.random.default_rng(21)
    memory = open_memory()
    x = unit_rows(rng, 6)
    ids = memory.add([f"m{i}" for i in range(6)], vectors=x, namespace="n", session="s", role="user",
                     metadata={"k": 1}, ttl=3600)
    q = x[2]
    hits = memory.search(q, k=3, namespace="n")
    assert hits[0].id == ids[2]
    for hit in hits:
        stored = memory.get([hit.id])[0]
        assert hit == Hit(stored.id, stored.text, hit.score, hit.tier, stored.namespace, stored.session, stored.role,
                          stored.created_at, stored.metadata, stored.expires_at, stored.ttl_s)
        assert repr(hit).startswith(f"Hit(id={hit.id}, text=")
    for scale in (1e30, 1e-30):
        scaled = memory.search((q.astype(np.float64) * scale).astype(np.float32), k=3, namespace="n")
        assert [h.id for h in scaled] == [h.id for h in hits]
        np.testing.assert_allclose([h.score for h in scaled], [h.score for h in hits], atol=1e-6)


def test_rows_another_process_logged_come_back_from_the_cache_whole(open_memory, tmp_path):
    """A process hears of every row another logs and keeps its fields; the Memory a lookup makes of them equals the
    one get() reads (text, namespace, session, role, time, metadata, expiry), and stays the one cached."""
    rng = np.random.default_rng(12)
    path = tmp_path / "shared"
    writer, reader = open_memory(path), open_memory(path)
    ids = writer.add(["first", "second"], vectors=unit_rows(rng, 2), namespace=("users", "ana"), session="s1",
                     role=["user", None], metadata=[{"k": [1, 2]}, None], ttl=60)
    assert reader.count(("users", "ana")) == 2  # the reader followed the log
    cached = reader._cache.lookup(ids)
    assert [cached[i] for i in ids] == writer.get(ids)
    assert cached[ids[0]].metadata == {"k": [1, 2]} and cached[ids[1]].metadata == {}
    assert cached[ids[0]].expires_at is not None and cached[ids[0]].ttl_s == 60
    assert reader._cache.lookup(ids[:1])[ids[0]] is cached[ids[0]]


def test_get_count_metadata_and_roundtrip(open_memory):
    rng = np.random.default_rng(8)
    memory = open_memory()
    ids = memory.add(["hello", "world"], vectors=unit_rows(rng, 2), namespace="x", session="s1",
                     role=["user", "assistant"], metadata=[{"a": 1}, None], created_at=1_700_000_000.0)
    got = memory.get(ids + [123456789])
    assert [m.text for m in got[:2]] == ["hello", "world"] and got[2] is None
    assert got[0].role == "user" and got[1].role == "assistant" and got[0].session == "s1"
    assert got[0].metadata == {"a": 1} and got[1].metadata == {}
    assert int(got[0].created_at.timestamp()) == 1_700_000_000
    assert memory.count() == 2 and memory.count("x") == 2 and memory.count("other") == 0
    # an upsert by id replaces, never duplicates
    memory.add(["hello again"], vectors=unit_rows(rng, 1), ids=[ids[0]], namespace="x")
    assert memory.count("x") == 2 and memory.get(ids[0])[0].text == "hello again"


def test_bad_input_raises_and_writes_nothing(open_memory):
    rng = np.random.default_rng(9)
    memory = open_memory()
    good = unit_rows(rng, 1)
    bad_calls = [
        lambda: memory.add(["x"], vectors=unit_rows(rng, 1, DIM + 1), namespace="n"),
        lambda: memory.add([""], vectors=good, namespace="n"),
        lambda: memory.add(["x"], vectors=np.full((1, DIM), np.nan, np.float32), namespace="n"),
        lambda: memory.add(["x"], vectors=np.zeros((1, DIM), np.float32), namespace="n"),
        lambda: memory.add(["x", "y"], vectors=good, namespace="n"),
        lambda: memory.add(["x"], vectors=good, namespace=""),
        lambda: memory.add(["x"], vectors=good, namespace=5),
        lambda: memory.add(["x"], vectors=good, namespace="n", metadata={"bad": object()}),
        lambda: memory.add(["x"], vectors=good, namespace="n", ids=[-1]),
        lambda: memory.add(["\ud800"], vectors=good, namespace="n"),
        lambda: memory.add(["x"], namespace="n"),  # no embedder and no vectors
        lambda: memory.search(good[0], k=0),
        lambda: memory.search(good[0], k=-3),
        lambda: memory.search(np.full(DIM, np.inf, np.float32)),
        lambda: memory.search(unit_rows(rng, 1, DIM - 1)[0]),
        lambda: memory.search(good[0], namespace=""),
    ]
    for call in bad_calls:
        with pytest.raises(InvalidInput):
            call()
    assert memory.count() == 0
    assert memory.search(good[0], k=3, namespace="never-written") == []


def test_add_succeeds_while_the_sidecar_is_down_and_the_hot_tier_catches_up(open_memory):
    rng = np.random.default_rng(10)
    memory = open_memory(hot_capacity=100)
    x = unit_rows(rng, 30)
    memory.add(["a"] * 10, vectors=x[:10], ids=list(range(10)), namespace="n")
    os.kill(sidecar_pid(memory), signal.SIGKILL)
    time.sleep(0.1)
    acknowledged = memory.add(["b"] * 10, vectors=x[10:20], ids=list(range(10, 20)), namespace="n")
    assert acknowledged == list(range(10, 20))
    # searches keep answering (from the cold tier, or a restarted sidecar) with every acknowledged row
    for i in (3, 15):
        assert memory.search(x[i], k=1, namespace="n")[0].id == i
    time.sleep(1.1)  # past the reconnect back-off
    memory.add(["c"] * 10, vectors=x[20:], ids=list(range(20, 30)), namespace="n")
    assert memory.count("n") == 30
    hits = memory.search(x[15], k=1, namespace="n")
    assert hits[0].id == 15 and hits[0].tier == "hot", "a new sidecar re-warmed from the cold tier"
    assert memory.stats()["hot_rows"] == 30


def _other_process_adds(path: str, q: list[float], queue) -> None:
    try:
        memory = TieredMemory(path, dim=DIM, embedder=None, device="cpu", orphan_grace_s=2.0)
        memory.add(["from the child"], vectors=np.array([q], dtype=np.float32), ids=[777], namespace="shared")
        hits = memory.search(np.array(q, dtype=np.float32), k=5, namespace="shared")
        queue.put(sorted(h.id for h in hits))
        memory.close()
    except Exception as exc:
        queue.put(repr(exc))


def test_two_processes_share_one_store_and_one_sidecar(open_memory, tmp_path):
    rng = np.random.default_rng(12)
    memory = open_memory(tmp_path / "shared")
    x = unit_rows(rng, 3)
    memory.add(["from the parent"] * 3, vectors=x, ids=[1, 2, 3], namespace="shared")
    pid_before = sidecar_pid(memory)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_other_process_adds, args=(str(tmp_path / "shared"), x[0].tolist(), queue))
    child.start()
    child_saw = queue.get(timeout=120)
    child.join(30)
    assert child_saw == [1, 2, 3, 777]
    assert sidecar_pid(memory) == pid_before, "the child attached to the running sidecar"
    hits = memory.search(x[0], k=5, namespace="shared")
    assert sorted(h.id for h in hits) == [1, 2, 3, 777]


def _open_and_die(path: str, ready) -> None:
    TieredMemory(path, dim=DIM, embedder=None, device="cpu", orphan_grace_s=1.0)
    ready.set()
    time.sleep(60)


def test_sidecar_exits_after_its_last_client_dies(tmp_path):
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(target=_open_and_die, args=(str(tmp_path / "s"), ready))
    child.start()
    assert ready.wait(120)
    from tiered_recall.coordinator.link import sidecar_name_of

    path = segment_path(sidecar_name_of(tmp_path / "s"))  # the name the child used
    with HotTier.attach(path.name.removeprefix("tiered-recall.")) as hot:
        pid = hot.owner_pid
    child.kill()
    child.join(10)
    deadline = time.monotonic() + 8
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(pid), "the orphaned sidecar is still running"
    assert not path.exists()


def _bag_of_words(texts):
    """A tiny deterministic embedder for tests: hashed bag of words."""
    import zlib

    out = np.zeros((len(texts), DIM), dtype=np.float32)
    for row, text in enumerate(texts):
        for word in text.lower().split():
            out[row, zlib.crc32(word.encode()) % DIM] += 1.0
    out[out.sum(axis=1) == 0, 0] = 1.0
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_hybrid_search_fuses_keywords_with_vectors(open_memory):
    memory = open_memory(embedder=_bag_of_words, dim=None)
    memory.add(["the francesinha in porto was great", "i adopted a cat named miso", "review moved to the 21st",
                "porto wine tasting on friday"], namespace="h")
    report = memory.search("francesinha", k=2, namespace="h", hybrid=True, explain=True)
    assert report.rule == "hybrid"
    assert report.hits[0].text == "the francesinha in porto was great"
    assert all(h.tier == "cold" for h in report.hits)
    with pytest.raises(InvalidInput, match="text query"):
        memory.search(np.ones(DIM, dtype=np.float32), hybrid=True)


def test_a_search_report_reads_like_the_hits_it_explains(open_memory):
    rng = np.random.default_rng(5)
    memory = open_memory()
    x = unit_rows(rng, 12)
    memory.add([f"m{i}" for i in range(12)], vectors=x, namespace="r")
    plain = memory.search(x[3], k=4, namespace="r")
    report = memory.search(x[3], k=4, namespace="r", explain=True)
    assert [h.id for h in report] == [h.id for h in plain] == [h.id for h in report.hits]
    assert len(report) == 4 and report[0].id == plain[0].id and report[-1].id == plain[-1].id


def test_memories_lists_every_memory_oldest_first_and_namespaces_counts_both_tiers(open_memory):
    rng = np.random.default_rng(6)
    memory = open_memory(hot_capacity=3, policy="lru")
    ids_a = memory.add(["a0", "a1", "a2", "a3"], vectors=unit_rows(rng, 4), namespace="a")
    time.sleep(0.002)
    ids_b = memory.add(["b0", "b1"], vectors=unit_rows(rng, 2), namespace="b")
    everything = list(memory.memories(batch=2))  # batches smaller than the store: order kept across them
    # One add's memories share their time, so they come by id; the older add's all come first.
    assert [m.id for m in everything] == sorted(ids_a) + sorted(ids_b)
    assert {m.id: m.text for m in everything} == {i: t for i, t in zip(list(ids_a) + list(ids_b),
                                                                         ["a0", "a1", "a2", "a3", "b0", "b1"])}
    assert [m.id for m in memory.memories("b")] == sorted(ids_b)
    counts = memory.namespaces()
    assert {ns: v["memories"] for ns, v in counts.items()} == {"a": 4, "b": 2}
    assert sum(v["hot"] for v in counts.values()) == 3  # the hot tier's capacity, shared by both
    assert all(0 <= v["hot"] <= v["memories"] for v in counts.values())


def test_vectors_returns_the_stored_unit_vectors_in_the_order_asked(open_memory):
    rng = np.random.default_rng(7)
    memory = open_memory()
    x = rng.standard_normal((3, DIM)).astype(np.float32) * 3.0  # not unit: the store normalises
    ids = memory.add(["v0", "v1", "v2"], vectors=x, namespace="v")
    got = memory.vectors([ids[2], 12345, ids[0]])
    assert got[1] is None
    np.testing.assert_allclose(got[0], x[2] / np.linalg.norm(x[2]), atol=1e-6)
    np.testing.assert_allclose(got[2], x[0] / np.linalg.norm(x[0]), atol=1e-6)
    assert memory.vectors([]) == []
