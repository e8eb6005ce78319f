"""Cold tier FAISS index: size-based choice, exact scores, filters inside the ANN search, deletes, persistence,
repair of stale/corrupt files, killed writers and concurrent writer processes."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tiered_recall.storage import ColdStore
from tiered_recall.storage import _index as index_module
from tiered_recall.storage import _search as search_module
from tiered_recall.storage import cold_store as cold_module

pytestmark = pytest.mark.lancedb

DIM = 16
MIN_ROWS = 1000  # FAISS threshold in these tests (the default is 20_000)


def clustered(rng: np.random.Generator, n: int, centres: int = 40, dim: int = DIM) -> np.ndarray:
    c = rng.standard_normal((centres, dim)).astype(np.float32)
    v = c[rng.integers(0, centres, n)] + 0.25 * rng.standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def near(rng: np.random.Generator, v: np.ndarray, n: int) -> np.ndarray:
    """Queries near stored rows (what a memory query looks like), unit norm."""
    q = v[rng.integers(0, v.shape[0], n)] + 0.1 * rng.standard_normal((n, v.shape[1])).astype(np.float32)
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def rows(ids, vectors, namespaces=None):
    ids = np.asarray(ids, dtype=np.int64)
    n = ids.shape[0]
    return dict(ids=ids, vectors=vectors, namespaces=namespaces or ["default"] * n,
                texts=[f"memory {i}" for i in ids.tolist()], sessions=[None] * n, roles=[None] * n,
                created_at_us=(ids * 1000).astype(np.int64), metadata=[None] * n)


def exact(matrix, ids, q, k, mask=None):
    s = matrix @ q
    if mask is not None:
        s, ids = s[mask], ids[mask]
    order = np.lexsort((ids, -s))[:k]
    return ids[order], s[order]


def open_store(path, **kw):
    kw.setdefault("faiss_min_rows", MIN_ROWS)
    kw.setdefault("compact_every_s", 3600.0)
    return ColdStore(path, dim=DIM, **kw)


def check_exact_scores(store, matrix_by_id: dict, q, ids, scores):
    want = np.array([matrix_by_id[i] @ q for i in ids.tolist()], np.float32)
    np.testing.assert_allclose(scores, want, atol=1e-5)
    assert np.all(np.diff(scores) <= 1e-6)


def test_small_store_is_exact_and_large_store_switches_to_faiss(tmp_path):
    rng = np.random.default_rng(0)
    v = clustered(rng, 3000)
    ids = np.arange(3000, dtype=np.int64)
    with open_store(tmp_path / "cold") as store:
        store.add(**rows(ids[:500], v[:500]))
        assert store.wait_for_index(30)
        assert store.stats()["search_path"] == "mirror-exact" and store.stats()["faiss"] is None
        store.add(**rows(ids[500:], v[500:]))
        assert store.wait_for_index(60)
        stats = store.stats()
        assert stats["search_path"] == "faiss-ivf+rerank", stats
        assert stats["faiss"]["rows"] == 3000 and stats["faiss"]["tuned_recall"] >= 0.95, stats["faiss"]
        assert stats["faiss_choice"]["method"] == "ivf", stats["faiss_choice"]
        by_id = dict(zip(ids.tolist(), v))
        hits = 0
        for q in near(rng, v, 40):
            got, scores = store.search(q, k=10)
            check_exact_scores(store, by_id, q, got, scores)
            hits += len(set(got.tolist()) & set(exact(v, ids, q, 10)[0].tolist()))
        assert hits / 400 >= 0.9


def test_namespace_filters_apply_inside_the_ann_search(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    n = 4000
    v = clustered(rng, n)
    ids = np.arange(n, dtype=np.int64)
    ns = np.array(["big"] * n, dtype=object)
    ns[rng.choice(n, 30, replace=False)] = "tiny"       # answered exactly over its own rows
    mid = rng.choice(np.flatnonzero(ns == "big"), 400, replace=False)
    ns[mid] = "mid"                                      # FAISS with an ID-selector bitmap
    monkeypatch.setattr(search_module, "_EXACT_SUBSET_MAX", 100)
    with open_store(tmp_path / "cold") as store:
        store.add(**rows(ids, v, ns.tolist()))
        store.build_index()
        assert store.stats()["search_path"] == "faiss-ivf+rerank"
        by_id = dict(zip(ids.tolist(), v))
        hits = 0
        for q in near(rng, v, 20):
            for name in ("tiny", "mid"):
                got, scores = store.search(q, k=10, namespace=name)
                assert len(got) == 10 and set(ns[got].tolist()) == {name}  # never starved, never leaking
                check_exact_scores(store, by_id, q, got, scores)
                want, _ = exact(v, ids, q, 10, ns == name)
                if name == "tiny":
                    np.testing.assert_array_equal(got, want)
                else:
                    hits += len(set(got.tolist()) & set(want.tolist()))
            got, _ = store.search(q, k=5, namespace="mid", where="id >= 0")  # where + namespace via the bitmap
            assert set(ns[got].tolist()) == {"mid"}
        assert hits / 200 >= 0.9
        # A namespace with fewer rows than k: every row, once.
        got, _ = store.search(v[0], k=100, namespace="tiny")
        assert sorted(got.tolist()) == sorted(ids[ns == "tiny"].tolist())


def test_deleted_and_replaced_rows_never_come_back_from_faiss(tmp_path):
    rng = np.random.default_rng(2)
    n = 2500
    v = clustered(rng, n)
    ids = np.arange(n, dtype=np.int64)
    with open_store(tmp_path / "cold") as store:
        store.add(**rows(ids, v))
        store.build_index()
        assert store.stats()["faiss"] is not None
        gone = ids[:100]
        assert store.delete(gone) == 100
        for i in gone[:20].tolist():
            got, _ = store.search(v[i], k=20)
            assert not set(got.tolist()) & set(gone.tolist())
        # An upsert moves a row: its old vector no longer finds it with score 1.
        newv = clustered(rng, 1)
        store.add(**rows([500], newv))
        got, scores = store.search(v[500], k=5)
        assert 500 not in got.tolist() or abs(scores[got.tolist().index(500)] - float(newv[0] @ v[500])) < 1e-5
        got, scores = store.search(newv[0], k=1)
        assert got.tolist() == [500] and abs(scores[0] - 1) < 1e-5
        # Deleting most rows repacks the mirror: FAISS labels follow the move.
        store.delete(ids[100:2000])
        live = ids[2000:]
        assert store.count() == live.shape[0] and store.stats()["faiss"]["rows"] == live.shape[0]
        for i in live[:30].tolist():
            got, scores = store.search(v[i], k=3, exclude_ids=[live[-1]])
            assert got[0] == i and abs(scores[0] - 1) < 1e-5 and set(got.tolist()) <= set(live.tolist())


def test_index_is_saved_and_loaded_on_restart_without_a_rebuild(tmp_path):
    rng = np.random.default_rng(3)
    v = clustered(rng, 2000)
    ids = np.arange(2000, dtype=np.int64)
    path = tmp_path / "cold"
    with open_store(path) as store:
        store.add(**rows(ids, v))
        store.build_index()
        nprobe = store.stats()["faiss"]["nprobe"]
        store.add(**rows([5000], clustered(rng, 1)))  # unsaved change: close() saves it
    with open_store(path) as store:
        stats = store.stats()
        assert stats["faiss_source"] == "loaded" and stats["faiss_builds"] == 0, stats
        assert stats["faiss"]["rows"] == 2001 and stats["faiss"]["nprobe"] == nprobe
        assert store.search(v[7], k=1)[0].tolist() == [7]


def test_stale_index_is_repaired_and_corrupt_index_is_rebuilt(tmp_path):
    rng = np.random.default_rng(4)
    v = clustered(rng, 2200)
    ids = np.arange(2200, dtype=np.int64)
    path = tmp_path / "cold"
    with open_store(path) as store:
        store.add(**rows(ids[:2000], v[:2000]))
        store.build_index()
    # Another writer without FAISS (e.g. an older version) changes rows: the saved index is now stale.
    moved = clustered(rng, 1)
    with open_store(path, index="exact") as store:
        store.add(**rows(ids[2000:], v[2000:]))
        store.delete(ids[:50])
        store.add(**rows([60], moved))
    with open_store(path) as store:
        stats = store.stats()
        assert stats["faiss_source"] == "repaired", stats
        rec = stats["faiss_last_reconcile"]
        assert rec["added"] == 201 and rec["dropped"] == 51, rec  # 200 new + moved row 60; 50 deleted + old row 60
        assert stats["faiss"]["rows"] == 2150
        for i in (0, 10, 49):
            assert not set(store.search(v[i], k=10)[0].tolist()) & set(range(50))
        assert store.search(v[2100], k=1)[0].tolist() == [2100]
        assert store.search(moved[0], k=1)[0].tolist() == [60]
    # Corrupt the published index file: it is rejected and rebuilt from LanceDB.
    folder = path / "faiss_index"
    meta = json.loads((folder / "meta.json").read_text())
    with open(folder / meta["index_file"], "r+b") as fh:
        fh.seek(meta["index_bytes"] // 2)
        fh.write(b"\xff" * 64)
    # The rebuild runs in the background and can be done before the first stats(): "built" then, never "loaded"
    # or "repaired", and the rejection stays in faiss_error.
    with open_store(path) as store:
        assert store.stats()["faiss_source"] in ("rejected", "built")
        assert store.wait_for_index(60)
        stats = store.stats()
        assert stats["faiss_source"] == "built" and stats["faiss"]["rows"] == 2150
        assert stats["faiss_error"].startswith("saved index rejected"), stats["faiss_error"]
        assert store.search(v[2100], k=1)[0].tolist() == [2100]
    (folder / "meta.json").write_text("{not json")
    with open_store(path) as store:
        assert store.stats()["faiss_source"] in ("rejected", "built") and store.wait_for_index(60)
        stats = store.stats()
        assert stats["faiss_source"] == "built" and stats["faiss"]["rows"] == 2150
        assert stats["faiss_error"].startswith("saved index rejected"), stats["faiss_error"]


_WRITER = """
import json, sys, numpy as np
from tiered_recall.storage import ColdStore
path, first, count, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(seed)
with ColdStore(path, dim={dim}, faiss_min_rows={min_rows}, compact_every_writes=8, compact_every_s=0.5,
               cleanup_grace_s=1.0) as s:
    for i in range(first, first + count):
        v = rng.standard_normal((1, {dim})).astype(np.float32)
        v /= np.linalg.norm(v)
        s.add(ids=np.array([i]), vectors=v, namespaces=["w"], texts=[f"m {{i}}"], sessions=[None], roles=[None],
              created_at_us=np.array([i]), metadata=[None])
        print(i, flush=True)
"""


def _writer(path, first, count, seed) -> subprocess.Popen:
    # A fresh interpreter (never fork a process with LanceDB/FAISS initialised).
    code = textwrap.dedent(_WRITER.format(dim=DIM, min_rows=MIN_ROWS))
    return subprocess.Popen([sys.executable, "-c", code, str(path), str(first), str(count), str(seed)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _check_consistent(store, expected_ids: set[int]):
    """Every live row is found by its own vector with score 1; the index holds exactly the live rows."""
    assert store.count() == len(expected_ids)
    stats = store.stats()
    if stats["faiss"] is not None:
        assert stats["faiss"]["rows"] == len(expected_ids), stats["faiss"]
    rows_ = store.get(np.array(sorted(expected_ids), np.int64))
    assert all(r is not None for r in rows_)
    for r in rows_[:: max(1, len(rows_) // 60)]:
        got, scores = store.search(r["vector"], k=1)
        assert got.tolist() == [r["id"]] and abs(scores[0] - 1) < 1e-5


def test_killing_a_writer_mid_add_leaves_a_consistent_index(tmp_path):
    rng = np.random.default_rng(5)
    path = tmp_path / "cold"
    base = clustered(rng, 1500)
    with open_store(path) as store:
        store.add(**rows(np.arange(1500), base, ["w"] * 1500))
        store.build_index()
    proc = _writer(path, 10_000, 5000, seed=1)
    seen = 0
    deadline = time.monotonic() + 30
    while seen < 60 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += 1
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=10)  # also closes the pipes
    assert seen >= 60, err
    with open_store(path) as store:
        count = store.count()
        assert count >= 1500 + seen  # every acknowledged add is durable
        assert store.stats()["faiss_source"] in ("loaded", "repaired")
        ids = {r for r in range(1500)} | set(range(10_000, 10_000 + count - 1500))
        _check_consistent(store, ids)


def test_two_writer_processes_lose_nothing(tmp_path):
    rng = np.random.default_rng(6)
    path = tmp_path / "cold"
    with open_store(path) as store:
        store.add(**rows(np.arange(1200), clustered(rng, 1200), ["w"] * 1200))
        store.build_index()
        a, b = _writer(path, 20_000, 120, seed=2), _writer(path, 30_000, 120, seed=3)
        for proc in (a, b):
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            assert len(out.split()) == 120
        # This process saw none of it happen: its mirror and FAISS index catch up from LanceDB.
        expected = set(range(1200)) | set(range(20_000, 20_120)) | set(range(30_000, 30_120))
        _check_consistent(store, expected)
    with open_store(path) as store:
        _check_consistent(store, expected)


def random_unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    v = rng.standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_ivf_that_misses_the_recall_target_falls_back_to_exact_search(tmp_path, caplog):
    """Uniformly random vectors (dim 128): no probe budget of a quarter of the lists reaches recall@10 0.97, so the
    store keeps exact search, says so (stats, one warning), keeps the choice across a reopen and re-makes it once
    the store has grown 4x."""
    dim, n = 128, 2000
    rng = np.random.default_rng(11)
    v = random_unit(rng, n, dim)
    ids = np.arange(n, dtype=np.int64)
    path = tmp_path / "cold"
    with caplog.at_level("WARNING", logger=index_module.__name__):
        with ColdStore(path, dim=dim, faiss_min_rows=MIN_ROWS, compact_every_s=3600.0) as store:
            store.add(**rows(ids, v))
            assert store.wait_for_index(60)
            stats = store.stats()
            choice = stats["faiss_choice"]
            assert stats["faiss_builds"] == 1 and stats["faiss_error"] is None, stats
            assert choice["method"] == "exact" and choice["tuned_recall"] < 0.97, choice
            assert "below the target" in choice["reason"] and choice["nprobe"] <= choice["probe_budget"], choice
            assert stats["search_path"] == "faiss-flat-exact" and stats["faiss"] is None, stats
            for q in random_unit(rng, 20, dim):
                got, scores = store.search(q, k=10)
                want, want_s = exact(v, ids, q, 10)
                np.testing.assert_array_equal(got, want)
                np.testing.assert_allclose(scores, want_s, atol=1e-5)
            # Deleted and excluded rows never come back from the flat scan.
            q = v[3]
            top = exact(v, ids, q, 5)[0]
            store.delete(top[:2])
            mask = ~np.isin(ids, top[:3])
            got, _ = store.search(q, k=10, exclude_ids=top[2:3])
            np.testing.assert_array_equal(got, exact(v, ids, q, 10, mask=mask)[0])
    warned = [r for r in caplog.records if "exact search" in r.getMessage()]
    assert len(warned) == 1 and "\n" not in warned[0].getMessage(), [r.getMessage() for r in caplog.records]
    # Reopened: the saved choice holds (no rebuild, no index files to load).
    with ColdStore(path, dim=dim, faiss_min_rows=MIN_ROWS, compact_every_s=3600.0) as store:
        assert store.wait_for_index(60)
        stats = store.stats()
        assert stats["faiss_builds"] == 0 and stats["faiss_source"] == "loaded", stats
        assert stats["faiss_choice"]["method"] == "exact" and stats["search_path"] == "faiss-flat-exact"
        # Grown past 4x the rows the choice was made for: built and judged again.
        more = clustered(rng, 3 * n + 10, dim=dim)
        store.add(**rows(np.arange(n, 4 * n + 10), more))  # 1998 + 6010 live rows > 4 x 1998
        assert store.wait_for_index(120)
        stats = store.stats()
        assert stats["faiss_builds"] == 1 and stats["faiss_choice"]["rows"] == 4 * n + 8, stats["faiss_choice"]


def test_choice_rules_and_a_saved_index_below_target_is_not_used(tmp_path):
    from tiered_recall.storage._ann import choose_method
    assert choose_method(1.0, 1, 64, 1 / 64, 0.97)[0] == "ivf"
    assert choose_method(0.80, 16, 64, 0.25, 0.97)[0] == "exact"
    method, why = choose_method(0.99, 32, 64, 0.5, 0.97)  # reached, but scanning half the rows: not faster
    assert method == "exact" and "no faster" in why
    # An index saved with a tuned recall below the target (as an older version kept it) is replaced by exact search.
    rng = np.random.default_rng(12)
    v = clustered(rng, 2000)
    ids = np.arange(2000, dtype=np.int64)
    path = tmp_path / "cold"
    with open_store(path) as store:
        store.add(**rows(ids, v))
        store.build_index()
        assert store.stats()["faiss_choice"]["method"] == "ivf"
    meta_path = path / cold_module.FAISS_FOLDER / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["tuned_recall"] = 0.5
    meta_path.write_text(json.dumps(meta))
    with open_store(path) as store:
        stats = store.stats()
        assert stats["faiss"] is None and stats["faiss_choice"]["method"] == "exact", stats
        assert stats["faiss_builds"] == 0 and stats["search_path"] == "faiss-flat-exact"
        assert store.search(v[7], k=1)[0].tolist() == [7]
    assert not meta_path.exists() and (path / cold_module.FAISS_FOLDER / "choice.json").exists()


def test_bad_index_options_are_refused(tmp_path):
    from tiered_recall.errors import InvalidInput
    with pytest.raises(InvalidInput, match="index must be one of"):
        ColdStore(tmp_path / "c", dim=DIM, index="hnsw")
    with pytest.raises(InvalidInput, match="faiss_min_rows"):
        ColdStore(tmp_path / "c", dim=DIM, faiss_min_rows=0)
    with pytest.raises(InvalidInput, match="target_recall"):
        ColdStore(tmp_path / "c", dim=DIM, target_recall=1.5)


def test_lancedb_index_mode_serves_searches_from_lancedb(tmp_path):
    rng = np.random.default_rng(7)
    v = clustered(rng, 300)
    with open_store(tmp_path / "cold", index="lancedb") as store:
        store.add(**rows(np.arange(300), v))
        assert store.stats()["search_path"] == "lancedb-exact"
        got, scores = store.search(v[3], k=3)
        want, want_s = exact(v, np.arange(300), v[3], 3)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(scores, want_s, atol=1e-5)


