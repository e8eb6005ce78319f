"""The sidecar under many clients, hostile slot contents, and killed processes."""
from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import threading
import time

import numpy as np
import pytest

from tiered_recall.hot import layout as L
from tiered_recall.errors import SidecarUnavailable
from tiered_recall.hot import HotTier, segment_path, start_sidecar


def _client_worker(name: str, worker: int, rounds: int, queue) -> None:
    try:
        rng = np.random.default_rng(worker)
        hot = HotTier.attach(name, timeout_s=20)
        dim = hot.dim
        x = rng.standard_normal((20, dim)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        ids = worker * 1000 + np.arange(20)
        ns = 1000 + worker
        hot.upsert(ids, x, ns)
        wrong = 0
        for r in range(rounds):
            i = r % 20
            res = hot.search(x[i], k=3, namespace_hash=ns)
            if res.ids[0, 0] != ids[i] or not set(res.ids[0, : res.hits]) <= set(ids):
                wrong += 1
        hot.close()
        queue.put((worker, wrong, None))
    except Exception as exc:  # report, do not hang the parent
        queue.put((worker, -1, repr(exc)))


def test_sixteen_client_processes_get_their_own_answers(start, segment_name):
    start(dim=32, capacity=1000, slots=8)  # fewer slots than clients: claiming must contend
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_client_worker, args=(segment_name, w, 300, queue)) for w in range(16)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert all(err is None for _, _, err in results), results
    assert all(wrong == 0 for _, wrong, _ in results), results


def _raw_request(hot: HotTier, slot_index: int, **fields) -> L.Slot:
    """Writes a request straight into a slot, as a hostile client could, and waits for the answer."""
    base = hot._header.slots_offset + slot_index * hot._header.slot_bytes
    slot = L.Slot.from_buffer(hot._mm, base)
    assert slot.state == L.SLOT_FREE
    slot.state = L.SLOT_CLAIMED
    for key, value in fields.items():
        setattr(slot, key, value)
    slot.seq += 1
    slot.state = L.SLOT_REQUEST
    hot._header.doorbell += 1
    deadline = time.monotonic() + 5
    while slot.state != L.SLOT_DONE:
        assert time.monotonic() < deadline, "the sidecar never answered the raw request"
        time.sleep(0.0005)
    return slot


GARBAGE = [
    dict(opcode=0), dict(opcode=99), dict(opcode=0xFFFFFFFF),
    dict(opcode=L.OP_SEARCH, k=0, count=1), dict(opcode=L.OP_SEARCH, k=100000, count=1),
    dict(opcode=L.OP_SEARCH, k=10, count=0), dict(opcode=L.OP_SEARCH, k=10, count=0xFFFFFFFF),
    dict(opcode=L.OP_SEARCH, k=256, count=100000), dict(opcode=L.OP_UPSERT, count=0),
    dict(opcode=L.OP_UPSERT, count=0xFFFFFFFF), dict(opcode=L.OP_DELETE, count=0xFFFFFFFF),
    dict(opcode=L.OP_CONTAINS, count=0x7FFFFFFF), dict(opcode=L.OP_SET_TOTALS, count=0xFFFFFFFF),
    dict(opcode=L.OP_PING, flags=0xFFFF0000),
]


def test_garbage_requests_get_errors_and_the_sidecar_keeps_serving(start):
    _, hot = start(dim=16, capacity=100)
    x = np.eye(16, dtype=np.float32)
    hot.upsert(np.arange(16), x, 1)
    for fields in GARBAGE:
        slot = _raw_request(hot, 3, **fields)
        assert slot.status < 0, fields
        assert slot.message, fields
        slot.state = L.SLOT_FREE
    # NaN in the payload of an otherwise valid search
    payload_at = hot._header.slots_offset + 3 * hot._header.slot_bytes + L.SLOT_HEADER_BYTES
    np.frombuffer(hot._mm, dtype=np.float32, count=16, offset=payload_at)[:] = np.nan
    slot = _raw_request(hot, 3, opcode=L.OP_SEARCH, k=5, count=1, flags=0)
    assert slot.status == L.E_NOT_FINITE
    slot.state = L.SLOT_FREE
    res = hot.search(x[5].copy(), k=1)
    assert res.ids[0, 0] == 5
    assert hot.stats()["errors"] == len(GARBAGE) + 1


def test_sigkill_sidecar_makes_a_waiting_client_raise_in_time(start, segment_name):
    proc, hot = start(dim=8, capacity=10)
    hot.timeout_s, hot._timeout_ns = 5.0, int(5e9)
    os.kill(proc.pid, signal.SIGSTOP)  # the request will wait...
    threading.Timer(0.3, lambda: os.kill(proc.pid, signal.SIGKILL)).start()  # ...until the sidecar dies
    t0 = time.monotonic()
    with pytest.raises(SidecarUnavailable, match="not running"):
        hot.search(np.ones(8, dtype=np.float32) / np.sqrt(np.float32(8)), k=1)
    elapsed = time.monotonic() - t0
    assert elapsed < 2.0, f"took {elapsed:.2f} s to notice a dead sidecar"
    proc.popen.wait(5)
    assert segment_path(segment_name).exists(), "SIGKILL leaves the segment behind"
    # a new sidecar reclaims the stale segment
    proc2 = start_sidecar(segment_name, dim=8, capacity=10)
    try:
        with HotTier.attach(segment_name) as hot2:
            assert hot2.owner_pid == proc2.pid
            assert hot2.ping() >= 0
    finally:
        proc2.stop()


def test_unanswered_request_times_out_and_the_slot_is_freed(start):
    proc, hot = start(dim=8, capacity=10)
    hot.timeout_s, hot._timeout_ns = 0.3, int(0.3e9)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(SidecarUnavailable, match="did not answer"):
            hot.ping()
        assert 0.25 < time.monotonic() - t0 < 2.0
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    hot.timeout_s, hot._timeout_ns = 5.0, int(5e9)
    assert hot.ping() >= 0
    states = [L.Slot.from_buffer(hot._mm, hot._header.slots_offset + i * hot._header.slot_bytes).state
              for i in range(hot._header.slot_count)]
    assert all(s == L.SLOT_FREE for s in states), states


def _hold_a_slot(name: str, ready) -> None:
    hot = HotTier.attach(name)
    base = hot._header.slots_offset  # slot 0, claimed and never released
    slot = L.Slot.from_buffer(hot._mm, base)
    slot.state = L.SLOT_CLAIMED
    slot.owner_pid = os.getpid()
    ready.set()
    time.sleep(60)


def test_slot_of_a_killed_client_is_reclaimed(start, segment_name):
    _, hot = start(dim=8, capacity=10, slots=1)
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_a_slot, args=(segment_name, ready))
    holder.start()
    assert ready.wait(30)
    holder.kill()
    holder.join(10)
    t0 = time.monotonic()
    assert hot.ping() >= 0  # the only slot was held by the dead client: it must come back
    assert time.monotonic() - t0 < 2.0
    assert hot.stats()["reclaimed_slots"] >= 1


def test_sigterm_unlinks_the_segment(segment_name):
    proc = start_sidecar(segment_name, dim=4, capacity=4)
    assert segment_path(segment_name).exists()
    proc.popen.send_signal(signal.SIGTERM)
    assert proc.popen.wait(5) == 0
    assert not segment_path(segment_name).exists()


@pytest.mark.parametrize("path", ["compiled", "ctypes"])
def test_closing_a_client_while_its_threads_search_crashes_nothing(start, segment_name, path):
    """close() from one thread while others are inside the segment: they finish, or get SidecarUnavailable; the
    mapping is never pulled from under a call (that was a segmentation fault)."""
    rng = np.random.default_rng(3)
    n, dim = 60_000, 64
    _, owner = start(dim=dim, capacity=n, dtype="f32")
    x = rng.standard_normal((n, dim)).astype(np.float32)
    owner.upsert(np.arange(n), x / np.linalg.norm(x, axis=1, keepdims=True), 1)
    queries = rng.standard_normal((32, dim)).astype(np.float32)
    for round_ in range(4):
        hot = HotTier.attach(segment_name, timeout_s=10)
        if path == "ctypes":
            hot._fast = None
        elif hot._fast is None:
            pytest.skip("the fast path is not built here (no Python headers)")
        outcomes = {"answered": 0, "closed": 0, "other": []}
        started = threading.Barrier(5)

        def searcher(seed: int) -> None:
            started.wait()
            for i in range(10_000):
                try:
                    result = hot.search(queries[(seed + i) % len(queries)], k=5, normalize=True)
                    assert result.hits == 5
                    outcomes["answered"] += 1
                except SidecarUnavailable as exc:
                    assert "closed" in str(exc)
                    outcomes["closed"] += 1
                    return
                except Exception as exc:  # noqa: BLE001 - reported below
                    outcomes["other"].append(repr(exc))
                    return

        threads = [threading.Thread(target=searcher, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        started.wait()
        time.sleep(0.02 * (round_ + 1))  # searches are in flight (each takes ~1 ms here)
        hot.close()
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads)
        assert outcomes["other"] == []
        assert outcomes["closed"] == 4, outcomes  # every thread got the clear error once it was closed
        assert outcomes["answered"] > 0
    assert owner.search(queries[0], k=5, normalize=True).hits == 5  # the sidecar and other clients are fine


def _search_for(hot: HotTier, query: np.ndarray, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        hot.search(query, k=1, namespace_hash=7)


def test_sidecar_publishes_its_busy_clients_and_cores(start):
    """HotTier.crowded compares two words of the doorbell line: the client processes that sent requests in the
    sidecar's last sweep and the machine's cores, both written by the sidecar at each sweep (every 100 ms)."""
    _, hot = start(dim=8, capacity=100)
    x = np.eye(8, dtype=np.float32)[:1]
    hot.upsert(np.array([1]), x, 7)
    _search_for(hot, x[0], 0.35)  # spans at least two sweeps
    assert hot._header.cores == os.sysconf("SC_NPROCESSORS_ONLN")
    assert hot._header.busy_clients == 1  # this process, on its own slot
    assert hot.crowded is False
    time.sleep(0.35)
    assert hot._header.busy_clients == 0


def test_a_client_that_notes_work_without_requests_counts_as_busy(start):
    """A process at work on its store counts as busy whether or not it sends the sidecar requests: it moves the
    activity of its client entry on (HotTier.note_work), and the sweep counts the entries that moved. no_spare_core
    says when the busy processes fill the cores."""
    _, hot = start(dim=8, capacity=100)
    at = hot._header.clients_offset + ctypes.sizeof(L.ClientEntry) * hot._client_index
    entry = L.ClientEntry.from_buffer(hot._mm, at)
    assert entry.pid == os.getpid()
    before = entry.activity
    deadline = time.monotonic() + 0.35  # spans at least two sweeps
    while time.monotonic() < deadline:
        hot.note_work()
        time.sleep(0.001)
    assert entry.activity != before
    assert hot._header.busy_clients == 1 and hot._header.searches == 0
    time.sleep(0.35)
    assert hot._header.busy_clients == 0
    del entry  # the test's own view of the segment, before the fixture closes it
    for busy, cores, no_spare in ((1, 2, False), (2, 2, True), (3, 2, True), (0, 0, False)):
        hot._header.busy_clients, hot._header.cores = busy, cores
        assert hot.no_spare_core is no_spare


def test_a_client_that_reads_crowded_words_still_gets_its_answer(start):
    """The words are advisory: a stray value (another process's write) only changes how a store waits, never what a
    search gets."""
    _, hot = start(dim=8, capacity=100)
    x = np.eye(8, dtype=np.float32)
    hot.upsert(np.arange(8), x, 7)
    for busy, cores in ((10**6, 1), (0, 0), (1, 10**6)):
        hot._header.busy_clients, hot._header.cores = busy, cores
        for i in range(8):
            res = hot.search(x[i], k=1, namespace_hash=7)
            assert res.ids[0, 0] == i
