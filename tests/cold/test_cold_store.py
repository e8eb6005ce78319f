"""Cold tier (storage.ColdStore): durability, exact search, filters, upkeep, other processes, input checks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

from tiered_recall.errors import InvalidInput, StorageError
from tiered_recall.storage import ColdStore

pytestmark = pytest.mark.lancedb

DIM = 16


def unit_rows(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    v = rng.standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def rows(ids, vectors, *, namespaces=None, roles=None, sessions=None, t0=0):
    ids = np.asarray(ids, dtype=np.int64)
    n = ids.shape[0]
    return dict(
        ids=ids, vectors=vectors,
        namespaces=namespaces or ["default"] * n,
        texts=[f"text {i}" for i in ids.tolist()],
        sessions=sessions or [None] * n,
        roles=roles or [None] * n,
        created_at_us=(t0 + ids * 1000).astype(np.int64),
        metadata=[{"n": int(i)} for i in ids.tolist()],
    )


def exact_top_k(matrix, ids, query, k, mask=None):
    scores = matrix @ query
    if mask is not None:
        scores, ids = scores[mask], ids[mask]
    order = np.lexsort((ids, -scores))[:k]
    return ids[order], scores[order]


@pytest.fixture
def store(tmp_path):
    with ColdStore(tmp_path / "cold", dim=DIM) as s:
        yield s


def test_add_get_delete_count_and_upsert(store):
    rng = np.random.default_rng(1)
    v = unit_rows(rng, 6)
    store.add(**rows(np.arange(6), v, namespaces=["a", "a", "a", "b", "b", "c"], roles=["user", "assistant"] * 3))
    assert store.count() == 6 and store.count("a") == 3 and store.count("zzz") == 0
    assert store.namespace_counts() == {"a": 3, "b": 2, "c": 1}

    got = store.get(np.array([4, 99, 0]))
    assert got[1] is None
    assert got[0]["id"] == 4 and got[0]["namespace"] == "b" and got[0]["role"] == "user"
    assert got[0]["text"] == "text 4" and got[0]["metadata"] == {"n": 4} and got[0]["created_at_us"] == 4000
    assert got[0]["session"] is None
    np.testing.assert_array_equal(got[0]["vector"], v[4])
    assert got[2]["id"] == 0 and got[2]["role"] == "user"

    # Upsert: same id replaces the row, never duplicates it.
    new = unit_rows(rng, 1)
    store.add(ids=np.array([4]), vectors=new, namespaces=["a"], texts=["replaced"], sessions=["s9"], roles=[None],
              created_at_us=np.array([123], np.int64), metadata=[None])
    assert store.count() == 6 and store.count("a") == 4 and store.count("b") == 1
    row = store.get([4])[0]
    assert row["text"] == "replaced" and row["session"] == "s9" and row["metadata"] == {}
    np.testing.assert_array_equal(row["vector"], new[0])
    ids, scores = store.search(new[0], k=2)
    assert ids[0] == 4 and abs(scores[0] - 1.0) < 1e-5 and 4 not in ids[1:]

    assert store.delete(np.array([1, 4, 1000])) == 2
    assert store.delete([1]) == 0
    assert store.count() == 4 and store.get([1, 4]) == [None, None]
    ids, _ = store.search(new[0], k=10)
    assert sorted(ids.tolist()) == [0, 2, 3, 5]


def test_search_equals_numpy_exact_with_filters(store):
    rng = np.random.default_rng(2)
    n = 600
    v = unit_rows(rng, n)
    ids = rng.permutation(10 * n)[:n].astype(np.int64)
    ns = rng.choice(["alpha", "beta", "gamma"], n).tolist()
    roles = rng.choice(["user", "assistant"], n).tolist()
    sessions = rng.choice(["s1", "s2", "s3"], n).tolist()
    for lo in range(0, n, 200):  # several commits, as a real store sees them
        sl = slice(lo, lo + 200)
        store.add(**rows(ids[sl], v[sl], namespaces=ns[sl], roles=roles[sl], sessions=sessions[sl]))
    ns_arr, role_arr, sess_arr = np.array(ns), np.array(roles), np.array(sessions)
    for q in unit_rows(rng, 5):
        for k in (1, 10, 50):
            cases = [
                ({}, None),
                ({"namespace": "beta"}, ns_arr == "beta"),
                ({"where": "role = 'user'"}, role_arr == "user"),
                ({"namespace": "gamma", "where": "session = 's2' AND role = 'assistant'"},
                 (ns_arr == "gamma") & (sess_arr == "s2") & (role_arr == "assistant")),
            ]
            for kwargs, mask in cases:
                got_ids, got_scores = store.search(q, k=k, **kwargs)
                want_ids, want_scores = exact_top_k(v, ids, q, k, mask)
                np.testing.assert_array_equal(got_ids, want_ids, err_msg=str(kwargs))
                np.testing.assert_allclose(got_scores, want_scores, atol=1e-5)
                assert got_ids.dtype == np.int64 and got_scores.dtype == np.float32
    q = v[7]
    excluded = ids[:50]
    got_ids, _ = store.search(q, k=20, exclude_ids=excluded)
    want_ids, _ = exact_top_k(v, ids, q, 20, ~np.isin(ids, excluded))
    np.testing.assert_array_equal(got_ids, want_ids)
    # k larger than the table returns every row once.
    assert len(store.search(q, k=10_000)[0]) == n


def test_equal_scores_are_ordered_by_smaller_id(store):
    e = np.eye(DIM, dtype=np.float32)
    store.add(**rows([9, 3, 7, 5], np.stack([e[0], e[0], e[1], e[0]])))
    ids, scores = store.search(e[0], k=2)
    assert ids.tolist() == [3, 5] and np.allclose(scores, 1.0)


def test_recent_is_newest_first_and_filters_namespace(store):
    rng = np.random.default_rng(3)
    v = unit_rows(rng, 8)
    store.add(**rows(np.arange(8), v, namespaces=["a", "b"] * 4))
    got = store.recent(3)
    assert got["ids"].tolist() == [7, 6, 5]
    assert got["created_at_us"].tolist() == [7000, 6000, 5000]
    assert got["namespace"] == ["b", "a", "b"]
    np.testing.assert_array_equal(got["vectors"], v[[7, 6, 5]])
    assert store.recent(10, namespace="a")["ids"].tolist() == [6, 4, 2, 0]
    assert store.recent(0)["ids"].shape == (0,)


def test_single_row_adds_stay_compacted_in_background(tmp_path):
    rng = np.random.default_rng(4)
    n = 500
    v = unit_rows(rng, n)
    # wal=False: every add is its own LanceDB commit, the case background compaction exists for.
    with ColdStore(tmp_path / "cold", dim=DIM, compact_every_writes=50, compact_every_s=60.0, wal=False) as store:
        for i in range(n):
            store.add(**rows([i], v[i:i + 1]))
        assert store.wait_for_maintenance(timeout=30)
        stats = store.stats()
        assert stats["rows"] == n
        assert stats["maintenance_errors"] == 0, stats["last_maintenance_error"]
        # How many compactions ran depends on how fast each one is (a busy machine merges more writes into one);
        # what must hold is that the table stays compacted.
        assert stats["compactions"] >= 1
        assert stats["fragments"] <= 50, stats  # without compaction this would be 500
        assert store.count() == n
        ids, scores = store.search(v[123], k=5)
        want_ids, want_scores = exact_top_k(v, np.arange(n), v[123], 5)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_allclose(scores, want_scores, atol=1e-5)
        store.optimize()
        stats = store.stats()
        assert stats["fragments"] == 1 and stats["versions"] == 1


def test_background_compaction_yields_to_another_process_holding_the_lock(tmp_path):
    from tiered_recall.storage._maintenance import maintenance_lock

    rng = np.random.default_rng(10)
    v = unit_rows(rng, 12)
    path = tmp_path / "cold"
    with ColdStore(path, dim=DIM, compact_every_writes=5, compact_every_s=60.0, wal=False) as store:
        with maintenance_lock(str(path), blocking=True) as held:  # as if another process were compacting
            assert held
            for i in range(6):
                store.add(**rows([i], v[i:i + 1]))
            assert store.wait_for_maintenance(timeout=30)
            assert store.stats()["compactions"] == 0 and store.stats()["fragments"] == 6
        store.add(**rows([6], v[6:7]))  # the skipped writes are still owed: this one triggers the compaction
        assert store.wait_for_maintenance(timeout=30)
        stats = store.stats()
        assert stats["compactions"] == 1 and stats["fragments"] == 1 and stats["rows"] == 7


@pytest.mark.parametrize("wal", [True, False])
def test_maintenance_reconnects_after_many_versions(tmp_path, monkeypatch, wal):
    """LanceDB's index cache keeps an entry per table version: maintenance opens a fresh connection every
    _LANCE_RECONNECT_VERSIONS versions, and nothing is lost or stale across the switch."""
    from tiered_recall.storage import _tables

    monkeypatch.setattr(_tables, "_LANCE_RECONNECT_VERSIONS", 3)
    rng = np.random.default_rng(11)
    n = 60
    v = unit_rows(rng, n)
    with ColdStore(tmp_path / "cold", dim=DIM, compact_every_writes=5, compact_every_s=60.0, wal=wal,
                   wal_flush_rows=4, wal_flush_s=0.05) as store:
        for i in range(n):
            store.add(**rows([i], v[i:i + 1]))
            if i % 3 == 2:
                assert store.delete([i - 1]) == 1
            if i % 10 == 9:
                store.flush()
        assert store.wait_for_maintenance(timeout=30)
        stats = store.stats()
        assert stats["maintenance_errors"] == 0, stats["last_maintenance_error"]
        assert stats["lance_reconnects"] >= 1, stats
        live = np.array([i for i in range(n) if i % 3 != 1])
        assert stats["rows"] == live.size and store.count() == live.size
        assert store.get([1, 2])[0] is None and store.get([2])[0]["id"] == 2
        ids, _ = store.search(v[30], k=5)
        want, _ = exact_top_k(v[live], live, v[30], 5)
        np.testing.assert_array_equal(ids, want)
        ids, _ = store.search(v[30], k=5, where="role IS NULL")  # served by LanceDB through the new connection
        np.testing.assert_array_equal(ids, want)
        store.optimize()
        assert store.stats()["rows"] == live.size


def _run_child(code: str) -> dict:
    # A fresh interpreter (spawn semantics): never fork a process that has LanceDB initialised.
    # cwd away from the checkout: `-c` puts the cwd first on sys.path, and the source tree's
    # tiered_recall/ (without storage/ mapped in) would shadow the installed package.
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60,
                          cwd=tempfile.gettempdir())
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_other_processes_see_new_writes(tmp_path):
    path = tmp_path / "cold"
    rng = np.random.default_rng(5)
    v = unit_rows(rng, 12)
    with ColdStore(path, dim=DIM) as store:
        store.add(**rows(np.arange(10), v[:10]))
        assert store.count() == 10
        # The child reads what we wrote, then writes rows of its own and deletes one of ours.
        child = _run_child(f"""
            import json, numpy as np
            from tiered_recall.storage import ColdStore
            with ColdStore({str(path)!r}, dim={DIM}) as s:
                before = s.count()
                vec = np.array({v[10:].tolist()!r}, dtype=np.float32)
                vec /= np.linalg.norm(vec, axis=1, keepdims=True)
                s.add(ids=np.array([10, 11]), vectors=vec, namespaces=["other", "other"], texts=["x", "y"],
                      sessions=[None, None], roles=[None, None], created_at_us=np.array([1, 2]), metadata=[None, None])
                deleted = s.delete([0])
                # An upsert keeps the row count: the other process must still notice the changed vector.
                s.add(ids=np.array([1]), vectors=vec[:1], namespaces=["default"], texts=["moved"],
                      sessions=[None], roles=[None], created_at_us=np.array([3]), metadata=[None])
                print(json.dumps({{"before": before, "deleted": deleted}}))
        """)
        assert child == {"before": 10, "deleted": 1}
        # This process had a mirror of the old rows: it must see the child's writes and never return row 0.
        assert store.count() == 11 and store.namespace_counts() == {"default": 9, "other": 2}
        ids, scores = store.search(v[10], k=2)
        assert ids.tolist() == [1, 10] and np.allclose(scores, 1.0, atol=1e-5)  # row 1 now holds v[10] too
        assert store.get([1])[0]["text"] == "moved"
        ids, _ = store.search(v[1], k=12)
        assert ids[0] != 1 and len(ids) == 11
        ids, _ = store.search(v[0], k=12)
        assert 0 not in ids.tolist() and len(ids) == 11
        assert store.get([0]) == [None]
        # And a write from here after theirs is seen by a new reader.
        store.add(**rows([20], v[:1]))
        assert _run_child(f"""
            import json
            from tiered_recall.storage import ColdStore
            with ColdStore({str(path)!r}, dim={DIM}) as s:
                print(json.dumps({{"count": s.count(), "has20": s.get([20])[0] is not None}}))
        """) == {"count": 12, "has20": True}


def _bad_add_cases(v):
    """Malformed arguments the cold tier refuses itself (vector values, finite and unit norm, are checked once, at
    the API: tests/coordinator/test_bad_input.py)."""
    good = rows([1, 2], v[:2])
    return {
        "wrong dim": ({**good, "vectors": np.ones((2, DIM + 1), np.float32) / np.sqrt(DIM + 1)}, "shape"),
        "int vectors": ({**good, "vectors": np.ones((2, DIM), np.int32)}, "float32"),
        "short texts": ({**good, "texts": ["only one"]}, "one entry per id"),
        "short namespaces": ({**good, "namespaces": ["a"]}, "one entry per id"),
        "empty namespace": ({**good, "namespaces": ["a", ""]}, "non-empty"),
        "bad role": ({**good, "roles": [None, 5]}, "str or None"),
        "timestamps shape": ({**good, "created_at_us": np.array([1], np.int64)}, "created_at_us"),
        "float timestamps": ({**good, "created_at_us": np.array([1.5, 2.0])}, "int64 microseconds"),
        "metadata not json": ({**good, "metadata": [{"x": object()}, None]}, "JSON"),
        "metadata not dict": ({**good, "metadata": ["x", None]}, "dict or None"),
        "empty batch": ({**good, "ids": np.array([], np.int64), "vectors": np.empty((0, DIM), np.float32),
                         "namespaces": [], "texts": [], "sessions": [], "roles": [], "created_at_us": np.array([], np.int64),
                         "metadata": []}, "at least one"),
        "duplicate ids": ({**good, "ids": np.array([3, 3])}, "more than once"),
        "float ids": ({**good, "ids": np.array([1.0, 2.0])}, "int64"),
    }


def test_bad_inputs_raise_invalid_input_and_write_nothing(store):
    rng = np.random.default_rng(6)
    v = unit_rows(rng, 3)
    version = store.stats()["table_version"]
    for name, (kwargs, fragment) in _bad_add_cases(v).items():
        with pytest.raises(InvalidInput, match=fragment):
            store.add(**kwargs)
        assert store.count() == 0, name
    assert store.stats()["table_version"] == version  # nothing was committed
    store.add(**rows([1], v[:1]))
    with pytest.raises(InvalidInput, match=r"shape \(16,\)"):
        store.search(np.ones(DIM + 1, np.float32), k=1)
    for k in (0, -1, 2.5, True):
        with pytest.raises(InvalidInput, match="positive int"):
            store.search(v[0], k=k)
    with pytest.raises(InvalidInput, match="non-empty"):
        store.search(v[0], k=1, namespace="")
    with pytest.raises(InvalidInput, match="where"):
        store.search(v[0], k=1, where="no_such_column = 3")
    with pytest.raises(InvalidInput, match="where"):
        store.search(v[0], k=1, where="   ")
    with pytest.raises(InvalidInput, match="1-d"):
        store.get(np.zeros((2, 2), np.int64))
    with pytest.raises(InvalidInput, match="limit"):
        store.recent(-1)
    assert store.count() == 1


def test_a_bad_where_filter_names_the_reason_in_the_filters_own_terms(store):
    v = unit_rows(np.random.default_rng(8), 1)
    store.add(**rows([1], v))
    for namespace in (None, "default"):  # the search wraps the filter in its own statement: not shown
        with pytest.raises(InvalidInput) as info:
            store.search(v[0], k=1, namespace=namespace, where="role = = 'user'")
        assert str(info.value) == ("the where filter \"role = = 'user'\" is not valid LanceDB SQL over the columns id, "
                                   "namespace, session, role, text, created_at, metadata: Expected: an expression, "
                                   "found: =")
        # what could reach past the parentheses the search puts the filter in is refused before LanceDB reads it
        for where, reason in (("role = 'user", "leaves a ' quote open"),
                              ("role = 'user' AND (", "leaves a parenthesis open")):
            with pytest.raises(InvalidInput) as info:
                store.search(v[0], k=1, namespace=namespace, where=where)
            assert str(info.value).startswith(f"the where filter {where!r} {reason}: ")


def test_filter_problem_reads_lancedbs_wording():
    from tiered_recall.storage._search import filter_problem

    where = "role = 'a' and text like '%x"
    assert filter_problem(where, ValueError("Invalid input, Invalid input, invalid SQL predicate: Unterminated "
                                            "string literal at at Line: 1, Column: 27")) == (
        "Unterminated string literal at column 27")
    assert filter_problem("id = 'x'", ValueError(
        "Invalid input, Error resolving filter expression id = 'x': Invalid user input: Received literal "
        "Utf8(\"x\") and could not convert to literal of type 'Int64', /root/.cargo/registry/src/lance/x.rs:23:88")) \
        == "Received literal Utf8(\"x\") and could not convert to literal of type 'Int64'"


def test_reopen_keeps_rows_and_refuses_another_dim(tmp_path):
    path = tmp_path / "cold"
    rng = np.random.default_rng(7)
    v = unit_rows(rng, 3)
    with ColdStore(path, dim=DIM) as store:
        store.add(**rows([1, 2, 3], v))
    assert (path.stat().st_mode & 0o777) == 0o700
    with ColdStore(path, dim=DIM) as store:
        assert store.count() == 3 and store.dim == DIM
        np.testing.assert_array_equal(store.search(v[1], k=1)[0], [2])
    with pytest.raises(InvalidInput, match=rf"dim {DIM}.*dim={DIM * 2}"):
        ColdStore(path, dim=DIM * 2)
    with pytest.raises(InvalidInput, match="dim"):
        ColdStore(tmp_path / "other", dim=0)


def test_storage_failures_become_storage_error(tmp_path, monkeypatch):
    rng = np.random.default_rng(8)
    v = unit_rows(rng, 2)
    store = ColdStore(tmp_path / "cold", dim=DIM, wal=False)  # every add commits to LanceDB

    def disk_full(*_a, **_k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(store._tables.table, "merge_insert", disk_full)
    monkeypatch.setattr(store._tables.table, "add", disk_full)
    with pytest.raises(StorageError, match="No space left"):
        store.add(**rows([1, 2], v))
    monkeypatch.undo()
    assert store.count() == 0
    store.close()
    with pytest.raises(StorageError, match="closed"):
        store.count()


def test_log_failures_become_storage_error_and_flush_failures_keep_rows_logged(store, monkeypatch):
    rng = np.random.default_rng(9)
    v = unit_rows(rng, 3)

    def disk_full(*_a, **_k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(store._wal, "write", disk_full)
    with pytest.raises(StorageError, match="disk is full"):
        store.add(**rows([1, 2], v[:2]))
    monkeypatch.undo()
    assert store.count() == 0

    store.add(**rows([1, 2], v[:2]))  # durable in the log
    monkeypatch.setattr(store._tables.flush_table, "merge_insert", disk_full)  # the handle flushes commit through
    with pytest.raises(StorageError, match="No space left"):
        store.flush()
    assert store.count() == 2 and store.search(v[1], k=1)[0].tolist() == [2]  # still served from the log
    monkeypatch.undo()
    assert store.flush() == 2
    assert store._tables.table.count_rows() == 2 and store.get([1, 2])[1]["id"] == 2

    def sync_fails(*_a, **_k):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(store._wal, "sync", sync_fails)  # written, then the fdatasync fails: not acknowledged
    with pytest.raises(StorageError, match="could not be made durable"):
        store.add(**rows([9], v[2:3]))


def test_large_tables_search_through_lancedb_with_ann_index(tmp_path):
    """Past the mirror budget LanceDB serves searches; rows added after the ANN index are still found."""
    rng = np.random.default_rng(9)
    n = 1200
    v = unit_rows(rng, n + 20)
    ns = rng.choice(["a", "b"], n + 20).tolist()
    ids = np.arange(n + 20, dtype=np.int64)
    with ColdStore(tmp_path / "cold", dim=DIM, mirror_max_bytes=0, ann_index_min_rows=1000,
                   scalar_index_min_rows=1000, background=False) as store:
        store.add(**rows(ids[:n], v[:n], namespaces=ns[:n]))
        assert store.stats()["search_path"] == "lancedb-exact"
        q = v[5]
        got_ids, got_scores = store.search(q, k=10, namespace="a")
        want_ids, want_scores = exact_top_k(v[:n], ids[:n], q, 10, np.array(ns[:n]) == "a")
        np.testing.assert_array_equal(got_ids, want_ids)
        np.testing.assert_allclose(got_scores, want_scores, atol=1e-5)

        store.optimize()  # builds the indices past the thresholds
        stats = store.stats()
        assert stats["index_kind"] != "none" and stats["search_path"] == "lancedb-ann+rerank"
        store.add(**rows(ids[n:], v[n:], namespaces=ns[n:]))  # after the index: not in it yet
        for i in range(n, n + 20):
            got_ids, got_scores = store.search(v[i], k=3, namespace=ns[i])
            assert got_ids[0] == i
            np.testing.assert_allclose(got_scores, v[got_ids] @ v[i], atol=1e-5)  # exact scores after re-ranking
        assert store.delete([n]) == 1
        assert n not in store.search(v[n], k=5)[0].tolist()
        assert store.count() == n + 19 and store.count("a") == ns.count("a") - (ns[n] == "a")
        assert store.recent(2)["ids"].tolist() == [n + 19, n + 18]


def test_lance_threads_sets_env_and_lagging_readers_keep_their_mirror(tmp_path, monkeypatch):
    monkeypatch.delenv("LANCE_CPU_THREADS", raising=False)
    rng = np.random.default_rng(11)
    v = unit_rows(rng, 4)
    path = tmp_path / "cold"
    with ColdStore(path, dim=DIM, lance_threads=2) as writer, \
            ColdStore(path, dim=DIM, read_consistency_interval_s=3600.0) as lagging:
        assert os.environ["LANCE_CPU_THREADS"] == "2"
        writer.add(**rows([1, 2], v[:2]))
        # A reader with a long consistency interval may see the old snapshot, but its own writes and answers
        # stay coherent (no reload on every call, no duplicate rows).
        lagging.add(**rows([3], v[2:3]))
        assert lagging.get([3])[0]["id"] == 3
        ids, scores = lagging.search(v[2], k=1)
        assert ids.tolist() == [3] and abs(scores[0] - 1.0) < 1e-5
        assert writer.count() == 3
    with pytest.raises(InvalidInput, match="lance_threads"):
        ColdStore(path, dim=DIM, lance_threads=0)


def test_stats_lists_versions_again_when_another_process_cleans_one_up_meanwhile(tmp_path):
    # Seen in the soak: a process's stats() listed the table's versions while another process's maintenance
    # deleted old ones, and LanceDB failed on the vanished manifest.
    rng = np.random.default_rng(12)
    with ColdStore(tmp_path / "cold", dim=DIM, wal=False) as store:
        store.add(**rows([1, 2], unit_rows(rng, 2)))
        table = store._tables.table
        real = table.list_versions
        calls = {"n": 0}

        def vanishing_once():
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("lance error: Not found: /x/memories.lance/_versions/18446744073709551385.manifest")
            return real()

        table.list_versions = vanishing_once
        stats = store.stats()
        assert calls["n"] == 2 and stats["rows"] == 2 and stats["versions"] >= 1

        def broken():
            raise RuntimeError("lance error: IO error: disk on fire")

        table.list_versions = broken
        with pytest.raises(StorageError, match="read table statistics"):
            store.stats()


def test_opening_a_store_leaves_lancedbs_rest_namespace_client_unloaded_until_used(tmp_path):
    """The REST namespace client's API classes (most of `import lancedb`) are not loaded by a store in a folder; a
    first use of the client's package loads them then, whole."""
    import subprocess
    import sys

    script = f"""
import sys
from tiered_recall.storage import ColdStore
with ColdStore({str(tmp_path / "cold")!r}, dim=4) as store:
    store.count()
assert "lance_namespace_urllib3_client.api" not in sys.modules, "the REST client's API was imported"
import lance_namespace_urllib3_client as client
assert client.ApiClient.__name__ == "ApiClient" and "lance_namespace_urllib3_client.api" in sys.modules
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
