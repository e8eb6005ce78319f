"""Hierarchical namespaces (tuples of labels, prefix search exact through both tiers, list_namespaces) and expiry
(a memory past its time to live is never returned, whatever tier serves, and the sweep deletes it)."""
from __future__ import annotations

import time

import numpy as np
import pytest

from tiered_recall import InvalidInput
from tiered_recall.coordinator import search as search_module
from tiered_recall.namespaces import namespace_labels, namespace_name

pytestmark = pytest.mark.lancedb
DIM = 16


def unit_rows(rng, n):
    x = rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def exact_ids(rows: dict[int, tuple[tuple[str, ...], np.ndarray]], q, k, under):
    ids = [i for i, (ns, _) in rows.items() if ns[:len(under)] == under]
    scores = np.array([rows[i][1] @ q for i in ids], dtype=np.float64)
    order = np.lexsort((np.array(ids), -scores))[:k]
    return [ids[j] for j in order], scores[order]


def test_a_tuple_namespace_is_stored_by_its_labels_and_a_slashed_name_is_the_same_namespace(open_memory):
    memory = open_memory()
    rng = np.random.default_rng(1)
    x = unit_rows(rng, 3)
    memory.add(["a", "b"], vectors=x[:2], namespace=("users", "alice"))
    memory.add(["c"], vectors=x[2:], namespace="users/alice")
    assert memory.count(("users", "alice")) == 3 == memory.count("users/alice")
    assert {h.text for h in memory.search(x[0], k=5, namespace=("users", "alice"))} == {"a", "b", "c"}
    for labels in [("a/b", "50%"), ("%2F",), ("x", "y", "z")]:
        assert namespace_labels(namespace_name(labels)) == labels
    with pytest.raises(InvalidInput, match="non-empty str"):
        memory.add("x", vectors=x[0], namespace=("users", ""))
    with pytest.raises(InvalidInput, match="at least one label"):
        memory.add("x", vectors=x[0], namespace=())
    with pytest.raises(InvalidInput, match="not both"):
        memory.search(x[0], namespace="a", namespace_prefix=("a",))


@pytest.mark.parametrize("namespaces, fanout_max", [(4, 64), (20, 64), (20, 0)],
                         ids=["fan-out", "fan-out-20", "one-filtered-search"])
def test_prefix_search_is_exact_through_both_tiers(open_memory, monkeypatch, namespaces, fanout_max):
    monkeypatch.setattr(search_module, "PREFIX_FANOUT_MAX", fanout_max)  # both ways of searching a prefix
    memory = open_memory(hot_capacity=60)  # fewer rows than the store: some namespaces are cold-only or partial
    rng = np.random.default_rng(namespaces)
    rows: dict[int, tuple[tuple[str, ...], np.ndarray]] = {}
    for n in range(namespaces):
        ns = ("users", f"u{n}") if n % 3 else ("users", f"u{n}", "notes")
        x = unit_rows(rng, 8)
        for i, memory_id in enumerate(memory.add([f"{ns}-{i}" for i in range(8)], vectors=x, namespace=ns)):
            rows[memory_id] = (ns, x[i])
    other = unit_rows(rng, 8)
    for i, memory_id in enumerate(memory.add([f"other-{i}" for i in range(8)], vectors=other, namespace="usersX")):
        rows[memory_id] = (("usersX",), other[i])  # shares the prefix's characters, not its first label
    for trial in range(12):
        q = unit_rows(rng, 1)[0]
        for under in [("users",), ("users", "u1"), ("users", "u3", "notes")]:
            want, want_scores = exact_ids(rows, q, 7, under)
            hits = memory.search(q, k=7, namespace_prefix=under)
            np.testing.assert_allclose([h.score for h in hits], want_scores, atol=1e-5)
            clearly = {i for i, s in zip(want, want_scores) if s > want_scores[-1] + 1e-5}
            assert clearly <= {h.id for h in hits}
            assert all(namespace_labels(h.namespace)[:len(under)] == under for h in hits)
    assert memory.search(other[0], k=3, namespace_prefix=("nobody",)) == []


@pytest.mark.parametrize("where", ["1=1) OR (1=1", "role = 'user') OR (1=1", "1=1 OR namespace = 'x' --",
                                   "1=1 /* x */", "role = 'user'; DELETE FROM memories", "(role = 'user'",
                                   "role = 'user"])
def test_a_where_filter_cannot_reach_past_its_scope(open_memory, where):
    """The store puts a where filter inside parentheses beside the namespace condition: a filter that closes them,
    opens a comment or a quote, or holds a statement break is refused, not run over every namespace."""
    memory = open_memory(device="none")
    rng = np.random.default_rng(3)
    memory.add(["alice's"], vectors=unit_rows(rng, 1), namespace=("users", "alice"), role="user")
    memory.add(["bob's"], vectors=unit_rows(rng, 1), namespace=("users", "bob"), role="user")
    q = unit_rows(rng, 1)[0]
    for scope in (dict(namespace_prefix=("users", "alice")), dict(namespace=("users", "alice"))):
        with pytest.raises(InvalidInput, match="where"):
            memory.search(q, k=5, where=where, **scope)
        with pytest.raises(InvalidInput, match="where"):
            memory.cold.search(q, k=5, namespace="users/alice", where=where)
    # quoted parentheses, doubled quotes and the like stay allowed
    hits = memory.search(q, k=5, namespace_prefix=("users", "alice"), where="role = 'user' OR text = 'a '')('")
    assert [h.text for h in hits] == ["alice's"]


def test_list_namespaces_by_prefix_suffix_depth_and_page(open_memory):
    memory = open_memory()
    x = unit_rows(np.random.default_rng(2), 1)[0]
    for ns in [("users", "alice", "memories"), ("users", "bob", "memories"), ("users", "bob", "prefs"),
               ("teams", "red"), "plain"]:
        memory.add("m", vectors=x, namespace=ns)
    assert memory.list_namespaces() == [("plain",), ("teams", "red"), ("users", "alice", "memories"),
                                        ("users", "bob", "memories"), ("users", "bob", "prefs")]
    assert memory.list_namespaces(prefix=("users",), max_depth=2) == [("users", "alice"), ("users", "bob")]
    assert memory.list_namespaces(suffix=("memories",)) == [("users", "alice", "memories"),
                                                            ("users", "bob", "memories")]
    assert memory.list_namespaces(prefix=("users", "*", "prefs")) == [("users", "bob", "prefs")]
    assert memory.list_namespaces(limit=2, offset=1) == [("teams", "red"), ("users", "alice", "memories")]
    with pytest.raises(InvalidInput, match="offset"):
        memory.list_namespaces(offset=-1)


@pytest.mark.parametrize("device", ["cpu", "none"])
def test_an_expired_memory_is_never_returned_and_the_search_stays_exact(open_memory, device, wall_clock):
    memory = open_memory(device=device, ttl_sweep_s=3600.0)  # no timed sweep: the search alone must hold
    rng = np.random.default_rng(3)
    q = unit_rows(rng, 1)[0]
    near = q + 0.05 * unit_rows(rng, 6)  # the best matches, all expiring
    near /= np.linalg.norm(near, axis=1, keepdims=True)
    live = unit_rows(rng, 10)
    doomed = memory.add([f"soon-{i}" for i in range(6)], vectors=near, namespace="n", ttl=30.0)
    kept = memory.add([f"kept-{i}" for i in range(10)], vectors=live, namespace="n")
    assert {h.id for h in memory.search(q, k=6, namespace="n")} == set(doomed)
    assert memory.get(doomed[:1])[0].expires_at is not None
    wall_clock(31)
    hits = memory.search(q, k=4, namespace="n", explain=True)
    scores = live @ q
    order = np.lexsort((np.array(kept), -scores))[:4]
    assert [h.id for h in hits] == [kept[j] for j in order], hits.rule
    assert memory.get(doomed) == [None] * 6
    assert all(not m.text.startswith("soon") for m in memory.memories("n"))
    # The search that stepped over them woke the sweep (its interval is an hour): they go soon.
    deadline = time.monotonic() + 10.0
    while (memory.count("n") > 10 or memory.stats()["expiry"]["deleted"] < 6) and time.monotonic() < deadline:
        time.sleep(0.05)  # the sweep's count is kept just after its delete returns
    assert memory.count("n") == 10
    assert memory.stats()["expiry"]["deleted"] == 6


def test_the_sweep_deletes_in_the_background_and_refresh_keeps_a_memory(open_memory, wall_clock):
    memory = open_memory(ttl_sweep_s=0.2)
    x = unit_rows(np.random.default_rng(4), 3)
    short = memory.add(["short"], vectors=x[0:1], namespace="n", ttl=60.0)[0]
    refreshed = memory.add(["refreshed"], vectors=x[1:2], namespace="n", ttl=60.0)[0]
    forever = memory.add(["forever"], vectors=x[2:3], namespace="n")[0]
    wall_clock(40)
    memory.get([refreshed], refresh_ttl=True)  # read, and its time to live starts again: 60 s from here
    wall_clock(40)  # past the first 60 s, within the refreshed ones
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and memory.count("n") > 2:
        time.sleep(0.05)  # the sweep, every 0.2 s, deletes what has expired; nothing reads it meanwhile
    assert memory.count("n") == 2, memory.stats()["expiry"]
    assert memory.get([short]) == [None]
    assert [m.text for m in memory.get([refreshed, forever])] == ["refreshed", "forever"]
    assert memory.stats()["expiry"]["deleted"] == 1
    with pytest.raises(InvalidInput, match="ttl"):
        memory.add("x", vectors=x[0], namespace="n", ttl=0)
    with pytest.raises(InvalidInput, match="expiry"):
        memory.add("x", vectors=x[0], namespace="n", metadata={"_tr_expires_at_us": 1})


def _search_while_expiring(path: str, device: str, seed: int, ready, seen, stop, results) -> None:
    """A second process's searches during the race: counts hits that had expired before the search began. It says
    when its store is open (ready), how many hits with a time to live it has seen (seen), and searches until the
    writer is done (stop)."""
    from tiered_recall import TieredMemory

    rng = np.random.default_rng(seed)
    searches = expiring = violations = 0
    with TieredMemory(path, dim=DIM, embedder=None, device=device, ttl_sweep_s=0.2, orphan_grace_s=2.0) as memory:
        ready.set()
        deadline = time.monotonic() + 300.0  # only if the writer died: it sets stop
        while not stop.is_set() and time.monotonic() < deadline:
            started_us = time.time_ns() // 1000
            for hit in memory.search(unit_rows(rng, 1)[0], k=10, namespace="race"):
                if hit.expires_at is not None:
                    expiring += 1
                    violations += hit.expires_at.timestamp() * 1e6 <= started_us
            searches += 1
            seen.value = expiring
    results.put((device, searches, expiring, violations))


@pytest.mark.slow
def test_expiry_races_searches_from_two_processes(open_memory, tmp_path):
    """Two processes (a CPU hot tier, and none) search while a third adds memories that expire within 50-400 ms:
    no search returns a memory that had expired before it began. The writer starts only once both searchers have
    opened the store, and it writes for 4.5 s and until each has seen enough hits that expire (a loaded machine
    makes fewer adds in a fixed window); they search until it is done. A fixed window from the searchers' start let
    the writer finish before they had opened the store at all on a loaded machine."""
    import multiprocessing

    memory = open_memory(path=tmp_path / "race", ttl_sweep_s=0.2)  # the writer, with a CPU hot tier
    rng = np.random.default_rng(9)
    memory.add([f"seed-{i}" for i in range(40)], vectors=unit_rows(rng, 40), namespace="race", ttl=0.3)
    context = multiprocessing.get_context("spawn")
    results, stop = context.Queue(), context.Event()
    ready = [context.Event(), context.Event()]
    seen = [context.Value("q", 0), context.Value("q", 0)]
    searchers = [context.Process(target=_search_while_expiring,
                                 args=(str(tmp_path / "race"), device, n, ready[n], seen[n], stop, results))
                 for n, device in enumerate(["cpu", "none"])]
    for p in searchers:
        p.start()
    try:
        for event, p in zip(ready, searchers):
            assert event.wait(timeout=120), f"searcher {p.name} did not open the store in 120 s"
        forever = 0
        started = time.monotonic()
        # memories that expire within 50-400 ms, most of what a search can find
        while time.monotonic() - started < 4.5 or min(v.value for v in seen) <= 100:
            assert time.monotonic() - started < 180, f"the searchers saw {[v.value for v in seen]} expiring hits"
            n = int(rng.integers(1, 6))
            memory.add([f"m{time.monotonic_ns()}-{i}" for i in range(n)], vectors=unit_rows(rng, n),
                       namespace="race", ttl=float(rng.uniform(0.05, 0.4)))
            if rng.random() < 0.2:
                memory.add(["forever"], vectors=unit_rows(rng, 1), namespace="race")
                forever += 1
            time.sleep(0.01)
    finally:
        stop.set()
    reports = [results.get(timeout=60) for _ in searchers]
    for p in searchers:
        p.join(timeout=30)
        assert p.exitcode == 0
    for device, searches, expiring, violations in reports:
        assert searches > 20 and expiring > 100, (device, searches, expiring)  # the race did happen
        assert violations == 0, f"{device}: {violations} hits had expired before their search began"
    # Every memory with a time to live has expired by now: the sweeps leave only the ones without.
    deadline = time.monotonic() + 30.0
    while memory.count("race") > forever and time.monotonic() < deadline:
        time.sleep(0.1)
    assert memory.count("race") == forever
