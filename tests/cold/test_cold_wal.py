"""The cold tier's write-ahead log: killed writers, torn tails, several processes, deletes of logged rows."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tiered_recall.storage import ColdStore
from tiered_recall.storage._wal import WriteAheadLog
from tiered_recall.sync import HEADER_SIZE, LogFollower, Rows, encode_rows, parse_records

DIM = 16

# A writer in its own interpreter (never fork a process with LanceDB initialised). Every acknowledged add prints
# "a <id>", every acknowledged delete "d <id>". Rows get vector seed(id), so the parent can check them.
_CHILD = """
import os, sys, json, numpy as np
from tiered_recall.storage import ColdStore
from tiered_recall.storage import _wal
from tiered_recall.sync import Rows, encode_rows

cfg = json.loads(sys.argv[1])
dim = cfg["dim"]

def vec(i):
    v = np.random.default_rng(i).standard_normal((1, dim)).astype(np.float32)
    return v / np.linalg.norm(v)

def add(s, i):
    s.add(ids=np.array([i]), vectors=vec(i), namespaces=["w"], texts=[f"m {i}"], sessions=[None], roles=["u"],
          created_at_us=np.array([i]), metadata=[{"i": i}])
    print("a", i, flush=True)

if cfg.get("kill_in_rotate_after") is not None:
    # SIGKILL this process inside a flush, after LanceDB committed the logged rows and before the log rotated:
    # the rows are then in both places, the worst moment for a replay.
    flushes = {"n": 0}
    orig = _wal.WriteAheadLog.rotate
    def rotate(self, *args):
        flushes["n"] += 1
        if flushes["n"] > cfg["kill_in_rotate_after"]:
            print("k", flush=True)
            os.kill(os.getpid(), 9)
        return orig(self, *args)
    _wal.WriteAheadLog.rotate = rotate

s = ColdStore(cfg["path"], dim=dim, wal_flush_rows=cfg.get("flush_rows", 512), wal_flush_s=cfg.get("flush_s", 0.5),
              compact_every_writes=8, compact_every_s=0.5, cleanup_grace_s=1.0)
first, count = cfg["first"], cfg["count"]
for j, i in enumerate(range(first, first + count)):
    add(s, i)
    if cfg.get("delete_every") and j % cfg["delete_every"] == cfg["delete_every"] - 1:
        victim = i - 2  # logged moments ago, maybe not flushed yet
        s.delete([victim])
        print("d", victim, flush=True)
    if cfg.get("wait_stdin_after") == j + 1:
        print("w", flush=True)
        sys.stdin.readline()
if cfg.get("torn_tail"):
    # Half of one more record at the end of the log, as if the process died inside write().
    wal = _wal.WriteAheadLog(os.path.join(cfg["path"], "_wal"))
    with wal.locked():
        wal._refresh_locked()
        rec = encode_rows(Rows(np.array([first + count]), vec(first + count), np.array([0]), ["w"], [None],
                                         [None], ["torn" * 200], [None]))
        os.pwrite(wal._wfd, rec[: len(rec) // 2], wal._wend)
        os.fsync(wal._wfd)
    print("t", flush=True)
if cfg.get("exit_without_close"):
    os.kill(os.getpid(), 9)
s.close()
"""


def vec(i: int) -> np.ndarray:
    v = np.random.default_rng(i).standard_normal((1, DIM)).astype(np.float32)
    return v / np.linalg.norm(v)


def child(tmp_path, **cfg) -> subprocess.Popen:
    cfg = {"dim": DIM, **cfg, "path": str(cfg["path"])}
    # cwd away from the checkout: `-c` puts the cwd first on sys.path (the source tree would shadow the package).
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(_CHILD), json.dumps(cfg)], cwd=tmp_path,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_events(proc: subprocess.Popen, until=None, timeout: float = 60.0) -> tuple[list[int], list[int]]:
    """Acknowledged adds and deletes printed by a child, up to `until(adds, deletes)` or its exit."""
    adds, deletes = [], []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        kind, *rest = line.split()
        if kind == "a":
            adds.append(int(rest[0]))
        elif kind == "d":
            deletes.append(int(rest[0]))
        if until is not None and until(adds, deletes, kind):
            break
    return adds, deletes


def table_ids(store: ColdStore) -> np.ndarray:
    """Every id row LanceDB itself holds (after flushing the log), duplicates included."""
    store.flush()
    data = store._tables.table.search().select(["id"]).limit(None).to_arrow()
    return np.sort(np.asarray(data.column("id").to_numpy(), np.int64))


def check_store(store: ColdStore, present: set[int], absent: set[int]) -> None:
    ids = table_ids(store)
    assert ids.shape[0] == np.unique(ids).shape[0], "a row was replayed twice"
    assert present <= set(ids.tolist()), sorted(present - set(ids.tolist()))[:10]
    assert not (absent & set(ids.tolist())), sorted(absent & set(ids.tolist()))
    assert store.count() == ids.shape[0]
    for i in sorted(present)[:: max(1, len(present) // 25)]:
        got, scores = store.search(vec(i)[0], k=1)
        assert got.tolist() == [i] and abs(scores[0] - 1) < 1e-5
        assert store.get([i])[0]["metadata"] == {"i": i}
    for i in absent:
        assert store.get([i])[0] is None
        assert i not in store.search(vec(i)[0], k=3)[0].tolist()


def test_logged_rows_survive_sigkill_mid_add_and_deleted_rows_stay_deleted(tmp_path):
    path = tmp_path / "cold"
    present, absent = set(), set()
    for round_, flush_rows in enumerate((7, 64, 1000)):
        proc = child(tmp_path, path=path, first=1000 * (round_ + 1), count=100_000, flush_rows=flush_rows,
                     flush_s=0.05, delete_every=9)
        adds, deletes = read_events(proc, until=lambda a, d, k: len(a) >= 150)
        proc.send_signal(signal.SIGKILL)  # somewhere in an add, a delete or a background flush
        more_adds, more_deletes = read_events(proc)  # what it acknowledged before dying
        proc.communicate(timeout=10)
        adds += more_adds
        deletes += more_deletes
        assert len(adds) >= 150, proc.stderr
        first = 1000 * (round_ + 1)
        last = max(adds)
        # The child deletes i - 2 right after adding i when (i - first) % 9 == 8. If the kill came after its last
        # acknowledged add, that delete may have been done without being acknowledged: its victim is either.
        undecided = {last - 2} if (last - first) % 9 == 8 and last - 2 not in deletes else set()
        present |= set(adds) - set(deletes) - undecided
        absent |= set(deletes)
        with ColdStore(path, dim=DIM) as store:  # replays the log
            check_store(store, present - absent, absent)


def test_sigkill_after_the_flush_committed_but_before_the_log_rotated(tmp_path):
    path = tmp_path / "cold"
    # Deletes are logged like adds (after adds 14, 29, 44, 59), so the one flush is close()'s, of every add and
    # delete: the kill comes after both its commits (delete, upsert), before the rotation.
    proc = child(tmp_path, path=path, first=0, count=65, flush_rows=10_000, flush_s=3600, delete_every=15,
                 kill_in_rotate_after=0)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err
    adds = [int(x.split()[1]) for x in out.splitlines() if x.startswith("a ")]
    deletes = [int(x.split()[1]) for x in out.splitlines() if x.startswith("d ")]
    assert "k" in out.split() and len(adds) == 65 and len(deletes) == 4
    wal_files = sorted(os.listdir(path / "_wal"))
    with ColdStore(path, dim=DIM) as store:
        # The rows of the last generation are in LanceDB already and in the log: replayed by id, never twice.
        check_store(store, set(adds) - set(deletes), set(deletes))
    assert wal_files  # (the log was there to replay)


def test_torn_log_tail_is_dropped_and_the_next_add_lands_cleanly(tmp_path):
    path = tmp_path / "cold"
    proc = child(tmp_path, path=path, first=0, count=5, flush_rows=10_000, flush_s=3600, torn_tail=True,
                 exit_without_close=True)
    out, err = proc.communicate(timeout=60)
    assert "t" in out.split(), err
    with ColdStore(path, dim=DIM) as store:
        assert store.count() == 5  # the torn sixth record (id 5) was never acknowledged: dropped
        check_store(store, set(range(5)), {5})
        store.add(ids=np.array([6]), vectors=vec(6), namespaces=["w"], texts=["m 6"], sessions=[None], roles=[None],
                  created_at_us=np.array([6]), metadata=[{"i": 6}])
    with ColdStore(path, dim=DIM) as store:
        check_store(store, set(range(5)) | {6}, {5})


def test_torn_tail_in_the_middle_of_a_live_log_is_cut_before_the_next_append(tmp_path):
    path = tmp_path / "cold"
    with ColdStore(path, dim=DIM, wal_flush_rows=10_000, wal_flush_s=3600) as store:
        for i in range(3):
            store.add(ids=np.array([i]), vectors=vec(i), namespaces=["w"], texts=[f"m {i}"], sessions=[None],
                      roles=[None], created_at_us=np.array([i]), metadata=[{"i": i}])
        wal = store._wal
        gen = wal.generations()[-1]
        log = wal.path_of(gen)
        # Longer than the next add's record, so overwriting in place would leave part of it behind.
        rec = encode_rows(Rows(np.array([99]), vec(99), np.array([0]), ["w"], [None], [None], ["x" * 500], [None]))
        bad = bytearray(rec)
        bad[-3] ^= 0xFF  # whole length, wrong checksum
        with open(log, "ab") as fh:
            fh.write(bytes(bad))
        store.add(ids=np.array([3]), vectors=vec(3), namespaces=["w"], texts=["m 3"], sessions=[None], roles=[None],
                  created_at_us=np.array([3]), metadata=[{"i": 3}])
        # The bad record was cut and the new one took its place: the file is 4 intact records, nothing after.
        with open(log, "rb") as fh:
            data = fh.read()
        records, end = parse_records(data[HEADER_SIZE:], HEADER_SIZE)
        assert len(records) == 4 and end == len(data)
        assert store.count() == 4
        check_store(store, {0, 1, 2, 3}, {99})


def test_other_processes_see_logged_rows_before_any_flush(tmp_path):
    path = tmp_path / "cold"
    with ColdStore(path, dim=DIM, wal_flush_s=3600) as reader:
        assert reader.count() == 0
        proc = child(tmp_path, path=path, first=0, count=40, flush_rows=10_000, flush_s=3600, wait_stdin_after=40)
        adds, _ = read_events(proc, until=lambda a, d, k: k == "w")
        assert len(adds) == 40
        assert reader._tables.table.count_rows() == 0  # nothing flushed: the rows live in the log only
        assert reader.count() == 40
        for i in adds[::7]:
            got, scores = reader.search(vec(i)[0], k=1)
            assert got.tolist() == [i] and abs(scores[0] - 1) < 1e-5
        assert reader.text_search("m", k=100)[0].shape[0] == 40  # BM25 sees them too
        # A delete is logged after the other process's logged rows (the flush commits the last operation of each
        # id): 7 never comes back.
        assert reader.delete([7]) == 1
        proc.stdin.write("\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=60)  # it closes (flushes) after this
        assert proc.returncode == 0, err
        check_store(reader, set(adds) - {7}, {7})
    with ColdStore(path, dim=DIM) as store:
        check_store(store, set(adds) - {7}, {7})


def _add(store: ColdStore, ids, text: str = "m") -> None:
    ids = np.asarray(ids, np.int64)
    store.add(ids=ids, vectors=np.concatenate([vec(int(i)) for i in ids]), namespaces=["w"] * len(ids),
              texts=[f"{text} {i}" for i in ids], sessions=[None] * len(ids), roles=[None] * len(ids),
              created_at_us=ids.copy(), metadata=[{"i": int(i)} for i in ids])


def test_deletes_are_logged_and_get_answers_from_the_log_without_a_flush(tmp_path):
    path = tmp_path / "cold"
    with ColdStore(path, dim=DIM, wal_flush_s=3600, background=False) as a, \
            ColdStore(path, dim=DIM, wal_flush_s=3600, background=False) as b:
        _add(a, range(10))
        assert b.get([3])[0]["metadata"] == {"i": 3} and b.get([3])[0]["text"] == "m 3"
        assert a.delete([3, 4, 99]) == 2  # counted from the mirror: 99 never existed
        assert a.delete([3]) == 0
        assert b.count() == 8 and b.get([3, 4, 5])[:2] == [None, None]
        assert 3 not in b.search(vec(3)[0], k=3)[0].tolist()
        assert 3 not in b.text_search("m", k=100)[0].tolist()
        _add(a, [3], text="again")  # re-added after its delete: the newest operation wins everywhere
        assert b.get([3])[0]["text"] == "again 3" and b.count() == 9
        # Nothing was flushed for any of it: the table is still empty, every answer came from the log.
        assert a._writer.flushes == 0 and b._writer.flushes == 0 and b._tables.table.count_rows() == 0
        assert b.flush() == 11  # 9 upserts (3 once, its newest row) + 2 deletes, in one flush
        assert a.get([3])[0]["text"] == "again 3" and a.count() == 9
        check_store(b, set(range(10)) - {4}, {4, 99})
        # A large add bypasses the log (a LanceDB commit of its own) and announces itself there: seen at once.
        _add(a, range(1000, 2100))
        assert b.count() == 9 + 1100 and b.get([2099])[0]["text"] == "m 2099"
    with ColdStore(path, dim=DIM) as store:
        check_store(store, (set(range(10)) - {4}) | set(range(1000, 2100)), {4, 99})


def test_two_logging_writers_and_a_reader_lose_nothing(tmp_path):
    path = tmp_path / "cold"
    with ColdStore(path, dim=DIM) as reader:
        a = child(tmp_path, path=path, first=10_000, count=300, flush_rows=32, flush_s=0.05)
        b = child(tmp_path, path=path, first=20_000, count=300, flush_rows=50, flush_s=0.05, delete_every=25)
        seen = 0
        while a.poll() is None or b.poll() is None:
            seen = max(seen, reader.count())  # follows both logs and their flushes while they run
            time.sleep(0.01)
        out_a, err_a = a.communicate()
        out_b, err_b = b.communicate()
        assert a.returncode == 0 and b.returncode == 0, err_a + err_b
        deletes = {int(x.split()[1]) for x in out_b.splitlines() if x.startswith("d ")}
        assert len(deletes) == 12 and seen > 0
        expected = set(range(10_000, 10_300)) | set(range(20_000, 20_300))
        check_store(reader, expected - deletes, deletes)


def test_log_generations_are_pruned_but_a_lagging_reader_catches_up(tmp_path):
    path = tmp_path / "cold"
    with ColdStore(path, dim=DIM, wal_flush_s=3600) as lagging, \
            ColdStore(path, dim=DIM, wal_flush_s=3600) as writer:
        writer._wal.retention_s = 0.0  # prune at once: the lagging reader's generation disappears
        writer._wal.keep_generations = 2
        for i in range(30):
            writer.add(ids=np.array([i]), vectors=vec(i), namespaces=["w"], texts=[f"m {i}"], sessions=[None],
                       roles=[None], created_at_us=np.array([i]), metadata=[{"i": i}])
            writer.flush()
        assert len(writer._wal.generations()) <= 3
        assert lagging.count() == 30  # a gap in the log: it reloads from LanceDB
        check_store(lagging, set(range(30)), set())


def test_adds_go_on_during_a_flush_and_are_carried_into_the_next_generation(tmp_path, monkeypatch):
    import threading
    path = tmp_path / "cold"

    def add(store, i):
        store.add(ids=np.array([i]), vectors=vec(i), namespaces=["w"], texts=[f"m {i}"], sessions=[None],
                  roles=[None], created_at_us=np.array([i]), metadata=[{"i": i}])
    with ColdStore(path, dim=DIM, wal_flush_s=3600) as reader, ColdStore(path, dim=DIM, wal_flush_s=3600) as store:
        for i in range(10):
            add(store, i)
        committing, release = threading.Event(), threading.Event()
        original = store._tables.commit

        def slow_commit(what, fn):
            if what.startswith("flush"):
                committing.set()
                release.wait(30)
            return original(what, fn)
        monkeypatch.setattr(store._tables, "commit", slow_commit)
        flusher = threading.Thread(target=store.flush)
        flusher.start()
        assert committing.wait(30)
        t0 = time.perf_counter()
        for i in range(10, 20):
            add(store, i)  # the flush is inside its LanceDB commit: appends must not wait for it
        assert time.perf_counter() - t0 < 5
        release.set()
        flusher.join(30)
        monkeypatch.undo()
        assert store._tables.table.count_rows() == 10  # the flush took rows 0-9; 10-19 were carried into the new generation
        gen = store._wal.generations()[-1]
        from tiered_recall.sync import read_header
        fd = store._wal.open_gen(gen)
        try:
            header = read_header(fd)
        finally:
            os.close(fd)
        assert header.carried_len > 0 and header.prev_gen == gen - 1
        assert reader.count() == 20 and store.count() == 20
        with ColdStore(path, dim=DIM, wal_flush_s=3600) as late:  # loads the table and the log, then replays it
            assert late.count() == 20
        check_store(reader, set(range(20)), set())
    with ColdStore(path, dim=DIM) as store:
        check_store(store, set(range(20)), set())


def test_the_bytes_a_follower_reads_to_a_record_are_counted_across_a_rotation(tmp_path):
    """LogFollower.bytes_between counts what a follower reads from one record boundary to another: within a
    generation, and across a rotation whose next generation starts with the records carried over from the
    previous one (read once, counted once); more than one generation on is unknown (infinite)."""

    wal = WriteAheadLog(str(tmp_path / "w"))
    records = [encode_rows(Rows(np.array([i]), vec(i), np.array([i]), [f"m{i}"], [None], [None], [None],
                                [None])) for i in range(6)]
    try:
        with wal.locked():
            ends = [wal.append(r) for r in records[:4]]
            wal.rotate(ends[0][0], ends[1][1], 1, 2)  # records 0-1 flushed, 2-3 carried into the next generation
            ends += [wal.append(r) for r in records[4:]]
        first, second = ends[0][0], ends[4][0]
        assert second == first + 1 and ends[3][0] == first

        def read_from(start, end):
            follower = LogFollower(wal.folder)
            try:
                follower.seek(*start)
                got = 0
                for kind, record in follower.poll():
                    if kind == "rows" and (record.gen, record.end) <= end:
                        got += record.end - record.offset
                return got
            finally:
                follower.close()

        start_of_log = (first, HEADER_SIZE)
        for start in [start_of_log, ends[0], ends[1], ends[2], ends[3], ends[4]]:
            for end in ends:
                if end <= start:
                    continue
                counted = LogFollower(wal.folder).bytes_between(start, end)
                # a position in the first generation reaches a record of the second through the carried copies
                assert counted == read_from(start, end), (start, end)
        assert LogFollower(wal.folder).bytes_between(ends[2], ends[5]) == len(records[3]) + len(records[4]) + len(records[5])
        assert LogFollower(wal.folder).bytes_between((first - 1, HEADER_SIZE), ends[5]) == float("inf")
    finally:
        wal.close()


def test_wal_options_are_checked(tmp_path):
    from tiered_recall.errors import InvalidInput
    for kw in ({"wal": 1}, {"wal_flush_rows": 0}, {"wal_flush_s": 0}, {"wal_flush_rows": True}):
        with pytest.raises(InvalidInput):
            ColdStore(tmp_path / "cold", dim=DIM, **kw)


def test_log_format_round_trips_and_rejects_a_bad_header(tmp_path):
    from tiered_recall.sync import decode_rows, parse_records, read_header
    rows = Rows(np.array([1, 2]), np.vstack([vec(1), vec(2)]), np.array([5, 6]), ["a", "b"], [None, "s"],
                ["user", None], ["ünïcode", "t"], [None, '{"k": 1}'])
    rec = encode_rows(rows)
    (got_offset, payload), = parse_records(rec + rec[:10], 100)[0]
    assert got_offset == 100 and parse_records(rec + rec[:10], 100)[1] == 100 + len(rec)
    back = decode_rows(payload)
    np.testing.assert_array_equal(back.ids, rows.ids)
    np.testing.assert_array_equal(back.vectors, rows.vectors)
    assert back.texts == rows.texts and back.sessions == rows.sessions and back.metadata_json == rows.metadata_json
    wal = WriteAheadLog(str(tmp_path / "w"))
    path = wal.path_of(wal.generations()[-1])
    fd = os.open(path, os.O_RDWR)
    try:
        assert read_header(fd).gen == 1
        os.pwrite(fd, b"X", 20)
        with pytest.raises(ValueError, match="bad log header"):
            read_header(fd)
    finally:
        os.close(fd)
        wal.close()
    assert HEADER_SIZE == 60


def test_a_flush_counts_down_the_operations_it_consumed_not_the_ids_it_committed(tmp_path):
    # Pairs of add and delete of one id log two operations and commit one id. Counted down by ids, this process's
    # count of pending operations (what wakes the flusher at wal_flush_rows) drifted up by one per pair, until
    # every write woke the flusher: one LanceDB commit per write. stats() flushes first, so the count is read here.
    with ColdStore(tmp_path / "cold", dim=DIM, wal_flush_rows=1000, wal_flush_s=3600, background=False) as store:
        for _ in range(20):
            _add(store, [7])
            assert store.delete([7]) == 1
        assert store._writer.pending_ops == 40
        assert store.flush() == 1  # the last operation of id 7: its delete
        assert store._writer.pending_ops == 0
        _add(store, [1, 2, 3])
        assert store._writer.pending_ops == 3
        assert store.flush() == 3 and store._writer.pending_ops == 0
        assert store.flush() == 0 and store._writer.flushes == 2
        check_store(store, {1, 2, 3}, {7})


def test_logged_records_carry_their_bump_and_every_add_is_durable_past_its_record(tmp_path):
    """The coordinator certifies the hot tier from the bump inside each record (hot_writes.py), and a writer that an
    earlier fdatasync covered does not sync again: the log's durable position is past every acknowledged record."""
    from tiered_recall.sync import Deleted
    with ColdStore(tmp_path / "cold", dim=DIM, background=False) as store:
        add_bump = store.add(ids=[1, 2], vectors=np.vstack([vec(1), vec(2)]), namespaces=["a", "a"],
                             texts=["x", "y"], sessions=[None, None], roles=[None, None],
                             created_at_us=[1, 2], metadata=[None, None])
        moved_bump = store.add(ids=[2], vectors=np.vstack([vec(3)]), namespaces=["b"], texts=["z"], sessions=[None],
                               roles=[None], created_at_us=[3], metadata=[None])
        deleted, delete_bump = store.delete_rows([1])
        assert deleted == 1 and moved_bump.namespaces == ("a", "b")  # the id's old namespace is touched too
        for bump in (add_bump, moved_bump, delete_bump):
            assert bump.record_end is not None and store._wal._synced() >= bump.record_end
        reader = LogFollower(store._wal.folder)
        reader.start_at(store._wal.generations()[-1])
        records = [r for kind, r in reader.poll() if kind in ("rows", "deleted")]
        reader.close()
        assert [(r.gen, r.end) for r in records] == [b.record_end for b in (add_bump, moved_bump, delete_bump)]
        assert isinstance(records[2], Deleted)
        for record, bump in zip(records, (add_bump, moved_bump, delete_bump)):
            assert record.bump.namespaces == bump.namespaces and record.bump.writes_before == bump.writes_before
            np.testing.assert_array_equal(record.bump.slots, bump.slots)
            np.testing.assert_array_equal(record.bump.slot_before, bump.slot_before)


def test_a_writer_syncs_while_another_holds_the_sync_lock(tmp_path, monkeypatch):
    """The log's fdatasync takes no lock (a descheduled holder would stall every writer): with the sync lock held
    elsewhere an add still syncs and returns, leaving the durable position to the holder; once the lock is free the
    position moves past the next add, and a reader's look for more records (LogFollower.has_more) sees each one."""
    import fcntl
    import threading

    from tiered_recall.storage import _wal

    syncs = []
    real_fdatasync = os.fdatasync
    monkeypatch.setattr(_wal.os, "fdatasync", lambda fd: syncs.append(fd) or real_fdatasync(fd))
    with ColdStore(tmp_path / "cold", dim=DIM, background=False) as store:
        reader = LogFollower(store._wal.folder)
        assert not reader.has_more()  # not positioned yet: nothing read to be past
        reader.start_at(store._wal.generations()[-1])
        reader.poll()
        assert not reader.has_more()
        before = store._wal._synced()
        lock_fd = os.open(tmp_path / "cold" / "_wal" / _wal.SYNC_LOCK_NAME, os.O_RDWR)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # another open file: excludes this process's writers too
        writer = threading.Thread(target=lambda: _add(store, [1]))
        writer.start()
        writer.join(30)
        assert not writer.is_alive() and syncs, "the add waited for the sync lock"
        assert store._wal._synced() == before  # the position is the holder's to move
        assert reader.has_more()
        reader.poll()
        assert not reader.has_more()
        fcntl.flock(lock_fd, fcntl.LOCK_UN)
        os.close(lock_fd)
        _add(store, [2])
        assert store._wal._synced() == store._wal.end_locked()  # past the record just written
        assert reader.has_more()
        reader.close()
        check_store(store, {1, 2}, set())


def test_an_add_of_new_ids_applies_no_record_of_other_writers_under_the_log_lock(tmp_path, monkeypatch):
    """A logged add of ids drawn at random for it (new_ids) bumps only its own namespace and leaves the records other
    processes logged meanwhile to the follow after the log's lock instead of applying them under it. Ids the caller
    chose, or an id the mirror already holds, take the full way (an upsert that moves it touches its old namespace
    too). Every answer stays exact."""
    from tiered_recall.errors import InvalidInput
    path = tmp_path / "cold"
    with ColdStore(path, dim=DIM, wal_flush_s=3600, background=False) as a, \
            ColdStore(path, dim=DIM, wal_flush_s=3600, background=False) as b:
        _add(a, range(5))
        b.count()  # b follows a's first rows
        follows_under_lock = []
        follow = b._follower.follow_log_locked

        def watched_follow():
            follows_under_lock.append(b._wal._append_lock._depth > 0)
            follow()

        monkeypatch.setattr(b._follower, "follow_log_locked", watched_follow)
        # Another process logs between b's follow before the lock and the lock itself.
        others = []
        before_lock = b._writer._follow_before_lock

        def then_another_writer():
            before_lock()
            if others:
                _add(a, others.pop())

        monkeypatch.setattr(b._writer, "_follow_before_lock", then_another_writer)

        def add_b(ids, namespace, new_ids):
            follows_under_lock.clear()
            ids = np.asarray(ids, np.int64)
            return b.add(ids=ids, vectors=np.concatenate([vec(int(i)) for i in ids]), namespaces=[namespace] * len(ids),
                         texts=["b"] * len(ids), sessions=[None] * len(ids), roles=[None] * len(ids),
                         created_at_us=ids.copy(), metadata=[None] * len(ids), new_ids=new_ids)

        bump = add_b([199], "x", new_ids=True)  # nothing logged meanwhile: the record goes in as written, no follow
        assert follows_under_lock == [False] and bump.namespaces == ("x",) and b.get([199])[0]["text"] == "b"

        others.append([100])  # one record waits: left to the follow after the lock, which reads both
        bump = add_b([200], "x", new_ids=True)
        assert follows_under_lock == [False, False] and bump.namespaces == ("x",)
        assert b.get([100])[0] is not None and b.get([200])[0]["text"] == "b"

        others.append(list(range(1000, 1000 + 200)))  # a large record waits: the same
        bump = add_b([201], "x", new_ids=True)
        assert follows_under_lock == [False, False] and bump.namespaces == ("x",)
        assert b.count() == 5 + 1 + 200 + 3 and b.get([1100])[0] is not None and b.get([201])[0]["text"] == "b"
        assert b.search(vec(201)[0], k=1)[0].tolist() == [201] and b.search(vec(1100)[0], k=1)[0].tolist() == [1100]

        others.append(list(range(2000, 2200)))
        bump = add_b([202], "x", new_ids=False)  # ids the caller chose: every earlier write applied first
        assert True in follows_under_lock and bump.namespaces == ("x",)

        bump = add_b([3], "x", new_ids=True)  # the mirror holds 3 (in "w"): an upsert, the full way
        assert True in follows_under_lock and bump.namespaces == ("w", "x")
        assert a.count() == b.count() == 5 + 1 + 200 + 200 + 4
        for store in (a, b):
            for i in (3, 100, 199, 200, 201, 202, 1100, 2100):
                assert store.search(vec(i)[0], k=1)[0].tolist() == [i]
        with pytest.raises(InvalidInput, match="new_ids"):
            add_b([300], "x", new_ids="yes")


def test_a_write_whose_mirror_apply_fails_is_still_made_durable(tmp_path, monkeypatch):
    """The append lock covers only the bump and the append: the record goes into the mirror after it, before the
    fdatasync. When that apply fails, the write raises, but its record (already in the log, which other processes may
    have read) is still made durable and its fd closed; a later follow applies it, so nothing acknowledged is lost."""
    from tiered_recall.storage import _wal
    from tiered_recall.storage._follower import Follower

    syncs = []
    real_fdatasync = os.fdatasync
    monkeypatch.setattr(_wal.os, "fdatasync", lambda fd: syncs.append(fd) or real_fdatasync(fd))
    with ColdStore(tmp_path / "cold", dim=DIM, wal_flush_s=3600, background=False) as store:
        _add(store, [1])
        open_fds = len(os.listdir("/proc/self/fd"))

        def broken(*args, **kwargs):
            raise RuntimeError("apply failed")

        for kind in ("add", "delete"):
            syncs.clear()
            with monkeypatch.context() as patch:
                patch.setattr(Follower, "apply_own_record_locked", broken)
                with pytest.raises(RuntimeError, match="apply failed"):
                    _add(store, [2]) if kind == "add" else store.delete_rows(np.array([1]))
            assert syncs, f"the {kind}'s record was not made durable"
            assert store._wal._synced() == store._wal.end_locked()
            assert len(os.listdir("/proc/self/fd")) == open_fds
        check_store(store, {2}, {1})


def test_a_version_left_for_later_while_a_writer_works_is_not_asked_again_at_every_read(tmp_path, monkeypatch):
    """A read that finds the table's version moved while another writer is at work (a flush between its commit and
    its rotation) leaves the version for later; the reads of the next moment leave it too without asking LanceDB
    (one round trip into its event loop each) while a writer is still at work, and ask again once none is. Their
    answers stay exact throughout: every row change reached the mirror through the log."""
    from tiered_recall.storage import _follower

    with ColdStore(tmp_path / "cold", dim=DIM, wal_flush_s=3600, background=False) as store:
        _add(store, range(5))
        follower, tables = store._follower, store._tables
        asks = []
        real_guard = tables.guard

        def guard(what, fn):
            if what == "read the table version":
                asks.append(what)
                return follower.mirror_version + 1  # moved, and the log does not explain it yet
            return real_guard(what, fn)

        at_work = [True]
        monkeypatch.setattr(tables, "guard", guard)
        monkeypatch.setattr(follower, "_writer_active", lambda: at_work[0])
        monkeypatch.setattr(_follower, "_DEFERRED_VERSION_RECHECK_S", 3600.0)
        follower._version_settled_at = -float("inf")
        for i in range(5):
            assert store.search(vec(i)[0], k=1)[0].tolist() == [i]
        assert len(asks) == 1  # the first read asked and deferred; the others left it without asking
        at_work[0] = False
        store.search(vec(0)[0], k=1)
        assert len(asks) == 2  # no writer at work: asked again
