"""Exactness across processes: a writer without a hot tier, or one whose hot side failed, never leaves another
process's hot tier answering from stale rows or counts (the certificates of docs/skip-rules.md)."""
from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

pytestmark = pytest.mark.lancedb

DIM = 16


@contextlib.contextmanager
def write_lock_held_elsewhere(path, hold_s: float = 10.0):
    """The store's write lock held by a thread through another open file of it, which excludes this process as
    another process would, until the block ends or hold_s passes."""
    from tiered_recall.sync import StoreWriteLock

    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with StoreWriteLock(path).held():
            held.set()
            release.wait(hold_s)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(30)
        yield
    finally:
        release.set()
        thread.join(30)


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def run_writer(path, script: str) -> None:
    """Runs `script` in a fresh interpreter with `memory` opened on the store with device='none'."""
    code = textwrap.dedent(f"""
        import json, numpy as np
        from tiered_recall import TieredMemory
        with TieredMemory({str(path)!r}, dim={DIM}, embedder=None, device="none") as memory:
        """) + textwrap.indent(textwrap.dedent(script), "    ")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_writer_without_a_hot_tier_is_seen_by_a_hot_reader(open_memory, tmp_path):
    """The issue's scenario: A (hot tier) adds one memory and searches; B (device='none', another process) adds two
    more to the namespace. A's next search, and a freshly opened reader's, return all three. B's adds are logged,
    so A's search finds its slot stale and first applies them from the log (catch-up): the hot tier then answers
    alone, and exactly."""
    rng = np.random.default_rng(1)
    vectors = unit(rng, 3)
    path = tmp_path / "store"
    a = open_memory(path, hot_capacity=64)
    a.add(vectors=vectors[:1], texts=["one"], namespace="n", ids=[1])
    report = a.search(vectors[0], k=10, namespace="n", explain=True)
    assert [h.id for h in report.hits] == [1] and report.rule == "complete"
    run_writer(path, f"memory.add(vectors=np.array({vectors[1:].tolist()}, dtype=np.float32), texts=['two', 'three'],"
                     " namespace='n', ids=[2, 3])")
    assert a.count("n") == 3
    report = a.search(vectors[0], k=10, namespace="n", explain=True)
    assert sorted(h.id for h in report.hits) == [1, 2, 3]
    assert report.rule == "complete" and {h.tier for h in report.hits} == {"hot"}  # B's rows applied from the log
    # a fresh reader attached to the same sidecar gets the same answer
    b = open_memory(path, hot_capacity=64)
    assert sorted(h.id for h in b.search(vectors[0], k=10, namespace="n")) == [1, 2, 3]


def test_a_write_that_bypassed_the_log_sends_searches_to_the_cold_tier_until_repaired(open_memory, tmp_path):
    """B (device='none') adds more rows at once than the log takes: committed to LanceDB directly, announced by a
    note that carries no rows, so no process can apply it to the hot tier from the log. A's searches of the
    namespace must ask the cold tier (the slot's certificate is stale) and find every row."""
    rng = np.random.default_rng(5)
    vectors = unit(rng, 1101)
    path = tmp_path / "store"
    a = open_memory(path, hot_capacity=4096)
    a.add(vectors=vectors[:1], texts=["one"], namespace="n", ids=[1])
    assert a.search(vectors[0], k=10, namespace="n", explain=True).rule == "complete"
    np.save(tmp_path / "big.npy", vectors[1:])
    run_writer(path, f"memory.add(['x'] * 1100, vectors=np.load({str(tmp_path / 'big.npy')!r}), namespace='n', "
                     "ids=list(range(2, 1102)))")
    report = a.search(vectors[500], k=3, namespace="n", explain=True)
    assert report.hits[0].id == 501 and report.rule == "cold"
    assert a.count("n") == 1101


def test_cold_only_delete_and_upsert_never_come_back_from_the_hot_tier(open_memory, tmp_path):
    """The case counts alone cannot catch: B (no hot tier) deletes one hot row and adds another, so the namespace's
    row count is unchanged; then B moves a vector (upsert of an existing id). A must not return the deleted row,
    must find the new one, and must score the moved row by its new vector."""
    rng = np.random.default_rng(2)
    vectors = unit(rng, 6)
    path = tmp_path / "store"
    a = open_memory(path, hot_capacity=64)
    a.add(vectors=vectors[:3], texts=["a", "b", "c"], namespace="n", ids=[1, 2, 3])
    assert a.search(vectors[0], k=10, namespace="n", explain=True).rule == "complete"
    run_writer(path, f"""
        memory.delete([1])
        memory.add(vectors=np.array([{vectors[3].tolist()}], dtype=np.float32), texts=['d'], namespace='n', ids=[4])
        memory.add(vectors=np.array([{vectors[4].tolist()}], dtype=np.float32), texts=['b2'], namespace='n', ids=[2])
        """)
    for q in (vectors[0], vectors[4], vectors[3]):
        hits = a.search(q, k=10, namespace="n")
        assert sorted(h.id for h in hits) == [2, 3, 4]
        scores = {h.id: h.score for h in hits}
        assert scores[2] == pytest.approx(float(vectors[4] @ q), abs=1e-5)  # the new vector of id 2
    assert a.search(vectors[4], k=1, namespace="n", explain=True).rule == "complete"  # repaired and certified


def test_whole_store_search_is_exact_after_a_cold_only_write(open_memory, tmp_path):
    rng = np.random.default_rng(3)
    vectors = unit(rng, 4)
    path = tmp_path / "store"
    a = open_memory(path, hot_capacity=64)
    a.add(vectors=vectors[:2], texts=["a", "b"], namespace="x", ids=[1, 2])
    assert a.search(vectors[0], k=10, explain=True).rule == "complete"
    run_writer(path, f"memory.add(vectors=np.array([{vectors[2].tolist()}], dtype=np.float32), texts=['c'], "
                     "namespace='y', ids=[3]); memory.delete([2])")
    for q in (vectors[0], vectors[2]):
        report = a.search(q, k=10, explain=True)
        assert sorted(h.id for h in report.hits) == [1, 3]


def test_a_failed_hot_side_leaves_the_namespace_uncertified(open_memory, tmp_path, monkeypatch):
    """A writer whose hot-tier delete failed (the sidecar refused it) must not leave readers trusting the hot row."""
    from tiered_recall.errors import SidecarError
    from tiered_recall.hot import HotTier

    rng = np.random.default_rng(4)
    vectors = unit(rng, 2)
    a = open_memory(tmp_path / "store", hot_capacity=64)
    a.add(vectors=vectors, texts=["a", "b"], namespace="n", ids=[1, 2])

    def refuse(self, ids):
        raise SidecarError("refused for the test")

    monkeypatch.setattr(HotTier, "delete", refuse)
    a.delete([1])
    report = a.search(vectors[0], k=10, namespace="n", explain=True)  # the hot tier still refuses: cold
    assert [h.id for h in report.hits] == [2] and report.rule == "cold"
    monkeypatch.undo()
    report = a.search(vectors[0], k=10, namespace="n", explain=True)  # the delete applied from the log now
    assert [h.id for h in report.hits] == [2]


_REPLACE = """
import sys, numpy as np
from tiered_recall import TieredMemory
with TieredMemory(sys.argv[1], dim=8, embedder=None, device="none") as memory:
    if sys.argv[2] == "delete":
        memory.delete([7])
    else:
        memory.add([sys.argv[2]], vectors=np.eye(8, dtype=np.float32)[0], namespace="n", ids=[7],
                   metadata={"version": sys.argv[2]})
"""


@pytest.mark.parametrize("device", ["cpu", "none"])
def test_a_memory_another_process_replaced_comes_back_as_it_is_now(open_memory, tmp_path, device):
    memory = open_memory(path=tmp_path / "s", dim=8, device=device)
    x = np.eye(8, dtype=np.float32)
    memory.add(["v1"], vectors=x[0], namespace="n", ids=[7], metadata={"version": "v1"})
    memory.add(["other"], vectors=x[1], namespace="n")
    assert memory.search(x[0], k=1, namespace="n")[0].text == "v1"  # now cached in this process
    for step in ("v2", "v3", "delete"):
        done = subprocess.run([sys.executable, "-c", _REPLACE, str(tmp_path / "s"), step], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        got = memory.get([7])[0]
        hits = memory.search(x[0], k=2, namespace="n")
        if step == "delete":
            assert got is None and all(h.id != 7 for h in hits)
        else:
            assert (got.text, got.metadata) == (step, {"version": step})
            assert (hits[0].id, hits[0].text, hits[0].metadata) == (7, step, {"version": step})


def test_a_process_that_did_not_write_the_rows_reads_no_disk_for_hot_answers(open_memory, tmp_path):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, 8)).astype(np.float32)
    writer = open_memory(path=tmp_path / "s", dim=8, device="cpu")
    ids = writer.add([f"m{i}" for i in range(300)], vectors=x, namespace="n")
    writer.cold.flush()  # in the table, not the log: what another process finds when it opens the store
    reader = open_memory(path=tmp_path / "s", dim=8, device="cpu")
    reader._warmer.join(timeout=30)  # the cache warming read them in the background
    reads = []
    original = reader.cold.get
    reader.cold.get = lambda wanted: (reads.append(len(wanted)), original(wanted))[1]
    for q in x[:50]:
        hits = reader.search(q, k=5, namespace="n")
        assert hits[0].text == f"m{ids.index(hits[0].id)}"
    assert reads == []


def _log_cold_only(memory, row_id: int, vector: np.ndarray, namespace: str) -> None:
    """A write another process could have made: in the cold tier and its log, its hot side not yet applied."""
    memory.cold.add(ids=[row_id], vectors=vector[None, :], namespaces=[namespace], texts=["cold only"],
                    sessions=[None], roles=[None], created_at_us=[1], metadata=[None])


def test_a_search_waits_briefly_for_the_lock_holder_instead_of_reading_the_cold_tier(open_memory, tmp_path,
                                                                                      monkeypatch):
    """A namespace's slot is stale for a logged write while another holder has the store's write lock: the search
    looks again once the holder let go (here at its first pause), applies the write itself and answers from the
    hot tier, with the new row."""
    import threading

    from tiered_recall.coordinator import link as link_module
    from tiered_recall.sync import StoreWriteLock

    rng = np.random.default_rng(21)
    vectors = unit(rng, 3)
    memory = open_memory(tmp_path / "store", hot_capacity=64)
    memory.add(vectors=vectors[:2], texts=["a", "b"], namespace="n", ids=[1, 2])
    _log_cold_only(memory, 3, vectors[2], "n")
    held, release, released = threading.Event(), threading.Event(), threading.Event()

    def holder() -> None:  # another open file of the lock: it excludes this process's searches like a process's
        with StoreWriteLock(memory.path).held():
            held.set()
            release.wait(30)
        released.set()

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(30)
    pauses = []

    def pause(seconds: float) -> None:  # the search's first look found the lock taken: let the holder go
        pauses.append(seconds)
        release.set()
        assert released.wait(30)

    monkeypatch.setattr(link_module.time, "sleep", pause)
    report = memory.search(vectors[2], k=3, namespace="n", explain=True)
    thread.join(30)
    assert pauses and report.rule == "complete"
    assert sorted(h.id for h in report.hits) == [1, 2, 3] and {h.tier for h in report.hits} == {"hot"}


def test_a_search_whose_slot_stays_stale_reads_the_cold_tier_without_asking_the_hot_tier(open_memory, tmp_path,
                                                                                          monkeypatch):
    """A slot bumped with no record to apply (a writer that died between its bump and its record) stays stale after
    the catch-up: the hot tier's rows would not be merged, so the search does not ask for them, and its answer is
    the cold tier's, exact."""
    rng = np.random.default_rng(22)
    vectors = unit(rng, 3)
    memory = open_memory(tmp_path / "store", hot_capacity=64)
    memory.add(vectors=vectors, texts=["a", "b", "c"], namespace="n", ids=[1, 2, 3])
    assert memory.search(vectors[0], k=3, namespace="n", explain=True).rule == "complete"
    memory.cold.generations.bump({"n"})
    asked = []
    hot = memory._link.hot
    real_search = hot.search
    monkeypatch.setattr(hot, "search", lambda *a, **k: asked.append(1) or real_search(*a, **k))
    report = memory.search(vectors[0], k=3, namespace="n", explain=True)
    assert report.rule == "cold" and not asked
    assert [h.id for h in report.hits][0] == 1 and sorted(h.id for h in report.hits) == [1, 2, 3]
    # the cold path repaired the slot: the next search is the hot tier's again
    assert memory.search(vectors[0], k=3, namespace="n", explain=True).rule == "complete" and asked


def test_cold_hits_already_hot_are_not_promoted_again(open_memory, tmp_path, monkeypatch):
    """An uncertified answer labels every hit "cold"; the placement tracks them as hot already, so the cold path
    neither re-places them nor takes the store's write lock for it."""
    rng = np.random.default_rng(23)
    vectors = unit(rng, 3)
    memory = open_memory(tmp_path / "store", hot_capacity=64)
    memory.add(vectors=vectors, texts=["a", "b", "c"], namespace="n", ids=[1, 2, 3])
    placement = memory._placement
    assert placement.not_hot([1, 2, 3, 99]) == [99]  # 99: not a row of the hot tier
    promoted = []
    monkeypatch.setattr(placement, "promote", lambda hot, ids: promoted.append(list(ids)))
    memory.cold.generations.bump({"n"})
    report = memory.search(vectors[0], k=3, namespace="n", explain=True)
    assert report.rule == "cold" and {h.tier for h in report.hits} == {"cold"} and promoted == []


def test_a_slot_stale_only_for_a_write_in_flight_is_not_repaired(open_memory, tmp_path, monkeypatch):
    """A writer bumps its slot after the counters were read with the log's end (so its record is not in the log
    yet): the slot is stale for the moment, and the search reads the cold tier, exactly, but does not repair the
    slot under the store's write lock, since the writer applies its own record. The counters are read here just
    before the writer's bump, and the repair's check is handed that read."""
    rng = np.random.default_rng(24)
    vectors = unit(rng, 3)
    memory = open_memory(tmp_path / "store", hot_capacity=64)
    memory.add(vectors=vectors, texts=["a", "b", "c"], namespace="n", ids=[1, 2, 3])
    assert memory.search(vectors[0], k=3, namespace="n", explain=True).rule == "complete"
    cold = memory.cold
    before_the_writer = cold.log_snapshot()
    monkeypatch.setattr(cold, "log_snapshot", lambda: before_the_writer)
    cold.generations.bump({"n"})  # the writer's bump; its record is not in the log yet
    repairs = memory._link.moves["repairs"]
    report = memory.search(vectors[0], k=3, namespace="n", explain=True)
    assert report.rule == "cold" and sorted(h.id for h in report.hits) == [1, 2, 3]
    assert memory._link.moves["repairs"] == repairs
    # a bump the counters' read did count, with no record (its writer died), is repaired as before
    monkeypatch.setattr(cold, "log_snapshot", cold.__class__.log_snapshot.__get__(cold))
    memory.search(vectors[0], k=3, namespace="n")
    assert memory._link.moves["repairs"] == repairs + 1
    assert memory.search(vectors[0], k=3, namespace="n", explain=True).rule == "complete"


def test_an_add_that_finds_the_write_lock_taken_leaves_its_hot_side_to_others(open_memory, tmp_path, monkeypatch):
    """While another holder has the store's write lock, a logged add is durable and returns without queueing for
    the lock: its record waits in the log, its slot stays stale, and searches stay exact (the cold tier answers
    until someone applies the record; once the lock is free, the next search of the slot applies it and the hot tier
    answers alone). With more than DEFERRED_LOG_BYTES waiting it queues for the lock as before."""
    from tiered_recall.coordinator import link as link_module

    rng = np.random.default_rng(25)
    vectors = unit(rng, 4)
    memory = open_memory(tmp_path / "store", hot_capacity=64)
    memory.add(vectors=vectors[:2], texts=["a", "b"], namespace="n", ids=[1, 2])
    with write_lock_held_elsewhere(memory.path):
        started = time.monotonic()
        memory.add(vectors=vectors[2:3], texts=["c"], namespace="n", ids=[3])
        assert time.monotonic() - started < 5.0  # it did not wait for the holder
        assert memory._link.logged.left_to_others == 1
        report = memory.search(vectors[2], k=3, namespace="n", explain=True)
        assert report.rule == "cold" and report.hits[0].id == 3 and sorted(h.id for h in report.hits) == [1, 2, 3]
    report = memory.search(vectors[2], k=3, namespace="n", explain=True)
    assert report.rule == "complete" and [h.id for h in report.hits][0] == 3 and {h.tier for h in report.hits} == {"hot"}

    monkeypatch.setattr(link_module, "DEFERRED_LOG_BYTES", 0)  # too much waiting already: queue for the lock
    with write_lock_held_elsewhere(memory.path, hold_s=0.5):
        started = time.monotonic()
        memory.add(vectors=vectors[3:4], texts=["d"], namespace="n", ids=[4])
        assert time.monotonic() - started >= 0.4  # it waited for the lock, then applied its own record
    assert memory._link.logged.left_to_others == 1
    assert memory.search(vectors[3], k=4, namespace="n", explain=True).rule == "complete"


def test_on_a_crowded_machine_an_add_leaves_its_hot_side_to_the_searches(open_memory, tmp_path, monkeypatch):
    """With more client processes at work than cores (HotTier.crowded) every block costs a wait for a core: a logged
    add leaves its hot side at once, lock free or taken, without napping; the next search of its slot applies it
    and answers exactly. On a machine with cores to spare an add applies its own side when the lock is free, and
    naps while it looks for a holder; with too much waiting it applies the log when the lock is free, crowded or
    not."""
    from tiered_recall.coordinator import link as link_module
    from tiered_recall.hot import HotTier

    rng = np.random.default_rng(27)
    vectors = unit(rng, 5)
    memory = open_memory(tmp_path / "store", hot_capacity=64)
    memory.add(vectors=vectors[:1], texts=["a"], namespace="n", ids=[1])
    assert memory._link.logged.left_to_others == 0  # not crowded, lock free: it applied its own side
    naps: list[float] = []
    monkeypatch.setattr(link_module.time, "sleep", lambda s: naps.append(s))
    monkeypatch.setattr(HotTier, "crowded", property(lambda self: True))
    memory.add(vectors=vectors[1:2], texts=["b"], namespace="n", ids=[2])  # lock free, crowded: left at once
    assert memory._link.logged.left_to_others == 1 and naps == []
    report = memory.search(vectors[1], k=2, namespace="n", explain=True)  # the search applies it
    assert report.rule == "complete" and report.hits[0].id == 2 and {h.tier for h in report.hits} == {"hot"}

    with write_lock_held_elsewhere(memory.path, hold_s=30.0):
        memory.add(vectors=vectors[2:3], texts=["c"], namespace="n", ids=[3])
        assert memory._link.logged.left_to_others == 2 and naps == []
        monkeypatch.setattr(HotTier, "crowded", property(lambda self: False))
        memory.add(vectors=vectors[3:4], texts=["d"], namespace="n", ids=[4])
        assert memory._link.logged.left_to_others == 3 and naps  # napped while it looked for the holder
        report = memory.search(vectors[3], k=4, namespace="n", explain=True)  # the lock is taken: cold, exact
        assert report.rule == "cold" and sorted(h.id for h in report.hits) == [1, 2, 3, 4]
    monkeypatch.setattr(HotTier, "crowded", property(lambda self: True))
    monkeypatch.setattr(link_module, "DEFERRED_LOG_BYTES", 0)  # too much waiting, the lock free: it applies
    memory.add(vectors=vectors[4:5], texts=["e"], namespace="n", ids=[5])
    assert memory._link.logged.left_to_others == 3
    report = memory.search(vectors[4], k=5, namespace="n", explain=True)
    assert report.rule == "complete" and sorted(h.id for h in report.hits) == [1, 2, 3, 4, 5]


def test_a_holder_of_the_write_lock_applies_records_logged_while_it_applied(open_memory, tmp_path, monkeypatch):
    """A writer that left its record to the lock's holder (its record landed while the holder applied the log) is
    covered before the holder lets the lock go: the holder looks again and applies the latecomer too."""
    from tiered_recall.namespaces import namespace_hash

    rng = np.random.default_rng(26)
    vectors = unit(rng, 3)
    memory = open_memory(tmp_path / "store", hot_capacity=64)
    memory.add(vectors=vectors[:2], texts=["a", "b"], namespace="n", ids=[1, 2])
    link, logged = memory._link, memory._link.logged
    real_apply = logged.apply
    calls = []

    def apply_while_a_writer_logs(hot, epoch, **kwargs):
        done = real_apply(hot, epoch, **kwargs)
        if not calls:
            _log_cold_only(memory, 3, vectors[2], "n")  # a latecomer, logged while the first apply ran
        calls.append(1)
        return done

    monkeypatch.setattr(logged, "apply", apply_while_a_writer_logs)
    with memory._write_lock.held():
        logged.apply_with_latecomers(link.hot, link.epoch)
    assert len(calls) == 2 and not logged.more_logged()
    assert link.token(namespace_hash("n")) is not None  # the latecomer's slot is current: applied
    report = memory.search(vectors[2], k=3, namespace="n", explain=True)
    assert report.rule == "complete" and report.hits[0].id == 3 and {h.tier for h in report.hits} == {"hot"}


def test_on_a_crowded_machine_a_writer_with_much_log_waiting_never_queues_for_the_lock(open_memory, tmp_path,
                                                                                      monkeypatch):
    """Crowded (HotTier.crowded), with more of the log waiting than DEFERRED_LOG_BYTES: a logged add applies the log
    when the store's write lock is free; while another process holds it, the add leaves its record to the holder or
    the next writer at once instead of queueing behind it (each writer queued there pays a wait for a core). Its slot
    stays stale meanwhile, so searches are answered from the cold tier, exactly; once the lock goes, the next search
    applies the record."""
    from tiered_recall.coordinator import link as link_module
    from tiered_recall.hot import HotTier

    rng = np.random.default_rng(29)
    vectors = unit(rng, 3)
    memory = open_memory(tmp_path / "store", hot_capacity=64)
    memory.add(vectors=vectors[:1], texts=["a"], namespace="n", ids=[1])
    monkeypatch.setattr(HotTier, "crowded", property(lambda self: True))
    monkeypatch.setattr(link_module, "DEFERRED_LOG_BYTES", 0)  # every record waiting counts as much
    memory.add(vectors=vectors[1:2], texts=["b"], namespace="n", ids=[2])  # the lock is free: it applies
    assert memory._link.logged.left_to_others == 0

    with write_lock_held_elsewhere(memory.path):
        started = time.monotonic()
        memory.add(vectors=vectors[2:3], texts=["c"], namespace="n", ids=[3])
        assert time.monotonic() - started < 5  # it did not wait for the holder
        assert memory._link.logged.left_to_others == 1
        report = memory.search(vectors[2], k=3, namespace="n", explain=True)
        assert report.rule == "cold" and [h.id for h in report.hits][0] == 3
        assert sorted(h.id for h in report.hits) == [1, 2, 3]
    report = memory.search(vectors[2], k=3, namespace="n", explain=True)  # this search applies the record
    assert report.rule == "complete" and [h.id for h in report.hits][0] == 3 and {h.tier for h in report.hits} == {"hot"}


def test_a_writer_that_closes_applies_the_writes_it_left_to_others(open_memory, tmp_path):
    """An add that left its hot side to the lock's holder, when nobody applied it since, is applied when its writer
    closes the store: no acknowledged write waits in the log for a search that may never come."""
    from tiered_recall.namespaces import namespace_hash

    rng = np.random.default_rng(27)
    vectors = unit(rng, 2)
    path = tmp_path / "store"
    writer = open_memory(path, hot_capacity=64)
    reader = open_memory(path, hot_capacity=64)  # keeps the sidecar, and looks at the certificates afterwards
    writer.add(vectors=vectors[:1], texts=["a"], namespace="n", ids=[1])
    with write_lock_held_elsewhere(path):
        writer.add(vectors=vectors[1:], texts=["b"], namespace="n", ids=[2])
    assert writer._link.logged.left_to_others == 1
    assert reader._link.token(namespace_hash("n")) is None  # the record waits in the log
    writer.close()
    assert reader._link.token(namespace_hash("n")) is not None  # applied by the writer as it closed
    report = reader.search(vectors[1], k=2, namespace="n", explain=True)
    assert report.rule == "complete" and [h.id for h in report.hits][0] == 2 and {h.tier for h in report.hits} == {"hot"}


def test_with_no_core_to_spare_a_small_scope_is_answered_from_the_mirror_without_the_sidecar(open_memory, tmp_path,
                                                                                            monkeypatch):
    """When the client processes at work fill the cores (HotTier.no_spare_core), a CPU sidecar's scan would take a
    core from one of them: a search whose scope the mirror scans exactly in a few rows is answered from it (rule
    "no-spare-core", path "cold"), exactly, without a request to the sidecar and without promotions. A scope past
    OWN_COPY_SCAN_MAX_ELEMENTS, a CUDA sidecar, or a spare core: the hot tier answers as before."""
    from tiered_recall.coordinator import search as search_module
    from tiered_recall.hot import HotTier

    rng = np.random.default_rng(31)
    vectors = unit(rng, 40)
    memory = open_memory(tmp_path / "store", hot_capacity=64)
    memory.add(vectors=vectors[:20], texts=["a"] * 20, namespace="n", ids=list(range(1, 21)))
    memory.add(vectors=vectors[20:30], texts=["b"] * 10, namespace="m", ids=list(range(21, 31)))
    hot = memory._link.hot
    assert memory.search(vectors[3], k=5, namespace="n", explain=True).rule == "complete"  # a spare core

    monkeypatch.setattr(HotTier, "no_spare_core", property(lambda self: True))
    searches_before, promoted_before = int(hot._header.searches), memory.stats()["rows_moved"]["promoted"]
    memory.add(vectors=vectors[30:31], texts=["c"], namespace="n", ids=[31])  # seen at once, hot side or not
    for i in (3, 30, 7):
        report = memory.search(vectors[i], k=5, namespace="n", explain=True)
        exact = np.argsort(-(vectors[list(range(20)) + [30]] @ vectors[i]), kind="stable")[:5]
        expected = [([*range(1, 21), 31])[j] for j in exact]
        assert report.rule == "no-spare-core" and report.path == "cold"
        assert [h.id for h in report.hits] == expected and {h.tier for h in report.hits} == {"cold"}
    assert int(hot._header.searches) == searches_before  # the sidecar was not asked
    assert memory.stats()["rows_moved"]["promoted"] == promoted_before

    monkeypatch.setattr(search_module, "OWN_COPY_SCAN_MAX_ELEMENTS", 10 * DIM)  # "n" (21 rows) is now too large
    report = memory.search(vectors[3], k=5, namespace="n", explain=True)
    assert report.rule != "no-spare-core" and int(hot._header.searches) == searches_before + 1
    assert memory.search(vectors[22], k=3, namespace="m", explain=True).rule == "no-spare-core"  # 10 rows fit
    monkeypatch.setattr(hot, "backend", "cuda")  # a GPU sidecar's scan takes no core from the clients
    assert memory.search(vectors[22], k=3, namespace="m", explain=True).rule == "complete"
