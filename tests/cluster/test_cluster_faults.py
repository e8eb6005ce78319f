"""The long cluster tests (run with -m slow): object storage away under load, node-local durability and its window,
moves under concurrent writes, a shard removed, the directory restarted, and the command line end to end (a node
killed under load runs by default: test_cluster_node_loss.py)."""
from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

from tiered_recall.cluster import add_shard, remove_shard, status
from tiered_recall.cluster.hashing import owner
from tiered_recall.errors import ShardUnavailable
from tiered_recall.namespaces import namespace_name

from cluster_load import DIM, Load, fill
from exact import Model, same_answer, unit

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_object_storage_away_fails_writes_loudly_loses_nothing_acknowledged_and_recovers(make_cluster, s3):
    config, memory = make_cluster(shards=2)
    rng = np.random.default_rng(2)
    model = Model()
    still = [f"s{i}" for i in range(8)]
    fill(memory, model, still, rng)
    load = Load(memory, model, [f"w{i}" for i in range(8)], still, writers=2)
    try:
        time.sleep(2)
        s3.stop()
        time.sleep(12)
        during = dict(load.acknowledged)
        time.sleep(3)
        assert len(load.acknowledged) == len(during)  # nothing is acknowledged while the store is away
        s3.start()
        time.sleep(5)
    finally:
        s3.start()
        load.stop()
    assert "StorageError" in load.failures  # writes failed loudly
    assert load.wrong == []
    assert len(load.acknowledged) > len(during)  # and went on once it was back
    acknowledged = sorted(load.acknowledged)
    assert all(m is not None for m in memory.get(acknowledged))
    vectors = rng.standard_normal((1, DIM)).astype(np.float32)
    model.put("s1", memory.add(["after"], vectors=vectors, namespace="s1"), vectors)
    q = unit(rng, DIM)
    assert same_answer(memory.search(q, k=3, namespace="s1"), model.exact(q, 3, namespace="s1"))


def _table_rows(config, shard: str) -> int:
    """Rows of a shard's table in object storage itself (what a node that lost its disk starts from)."""
    import lancedb

    table = lancedb.connect(config.shard_table_uri(shard), storage_options=config.storage_options.plain())
    return table.open_table("memories").count_rows()


def test_local_durability_keeps_the_log_across_a_restart_on_its_node_and_flushes_within_its_window(
        make_cluster, ray_nodes):
    import ray

    config, memory = make_cluster(shards=1, durability="local", flush_s=30.0)
    rng = np.random.default_rng(4)
    vectors = rng.standard_normal((5, DIM)).astype(np.float32)
    ids = memory.add([f"m{i}" for i in range(5)], vectors=vectors, namespace="only")
    assert _table_rows(config, "shard-0") == 0  # acknowledged from the node-local log, not flushed yet
    handle = ray.get_actor(f"{config.name}:shard-0", namespace="tiered_recall")
    node = status(config.name)["shards"][0]["node"]
    ray.kill(handle, no_restart=False)  # the shard's process dies; Ray starts it again, on the same node
    deadline = time.monotonic() + 120
    while True:
        shard = status(config.name)["shards"][0]
        if shard["ready"] and shard["epoch"] == 2:
            break
        assert time.monotonic() < deadline, shard
        time.sleep(0.2)
    assert shard["node"] == node
    assert [m.id for m in memory.get(ids)] == ids  # its log was kept and replayed: nothing acknowledged lost
    assert _table_rows(config, "shard-0") == 5  # opening the store again moved the log into object storage

    more = memory.add(["later"], vectors=rng.standard_normal((1, DIM)), namespace="only")
    deadline = time.monotonic() + config.flush_s + 15
    while _table_rows(config, "shard-0") < 6:  # within the flush window, the shard commits it by itself
        assert time.monotonic() < deadline
        time.sleep(1.0)
    assert memory.get(more)[0] is not None


def test_writes_to_a_namespace_go_on_while_others_move(make_cluster):
    config, memory = make_cluster(shards=2, durability="local", flush_s=0.5)
    rng = np.random.default_rng(5)
    namespaces = [f"n{i}" for i in range(30)]
    model = Model()
    fill(memory, model, namespaces, rng, rows=2)
    stop, errors = threading.Event(), []

    def write() -> None:
        local = random.Random(3)
        writes = np.random.default_rng(6)
        while not stop.is_set():
            ns = local.choice(namespaces)
            vectors = writes.standard_normal((1, DIM)).astype(np.float32)
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
    for ns in namespaces:
        assert same_answer(memory.search(q, k=4, namespace=ns), model.exact(q, 4, namespace=ns))


def test_a_removed_shard_hands_its_namespaces_to_the_others(make_cluster):
    config, memory = make_cluster(shards=3)
    rng = np.random.default_rng(8)
    namespaces = [("org", f"o{i}") for i in range(24)]
    model = Model()
    fill(memory, model, namespaces, rng, rows=2)
    ring = memory._session.view.ring
    remove_shard(config.name, "shard-1")
    memory._session.refresh(force=True)
    left = memory._session.view.ring
    assert left == tuple(s for s in ring if s != "shard-1")
    assert [s["shard"] for s in status(config.name)["shards"]] == list(left)
    assert memory.count() == len(model.rows)
    q = unit(rng, DIM)
    assert same_answer(memory.search(q, k=10, namespace_prefix=("org",)), model.exact(q, 10, prefix=("org",)))
    for ns in namespaces:
        hits = memory.search(q, k=2, namespace=ns)
        assert same_answer(hits, model.exact(q, 2, namespace=ns))
        assert {h.shard for h in hits} == {owner(namespace_name(ns), left)}


def test_a_restarted_directory_finds_its_cluster_again(make_cluster):
    import ray

    config, memory = make_cluster(shards=2)
    rng = np.random.default_rng(9)
    model = Model()
    fill(memory, model, [f"d{i}" for i in range(6)], rng)
    before = status(config.name)
    ray.kill(ray.get_actor(f"{config.name}:directory", namespace="tiered_recall"), no_restart=False)
    deadline = time.monotonic() + 120
    while True:
        try:
            after = status(config.name)
            break
        except Exception:
            assert time.monotonic() < deadline
            time.sleep(0.5)
    assert after["view"] == before["view"] and after["manifest_version"] >= before["manifest_version"]
    q = unit(rng, DIM)
    assert same_answer(memory.search(q, k=5), model.exact(q, 5))
    vectors = rng.standard_normal((1, DIM)).astype(np.float32)
    model.put("d1", memory.add(["after"], vectors=vectors, namespace="d1"), vectors)
    assert memory.count() == len(model.rows)


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


def test_the_command_line_starts_grows_shrinks_and_stops_a_cluster(ray_nodes, s3, tmp_path):
    from typer.testing import CliRunner

    from tiered_recall.cli import app

    name = "clitest"
    common = ["--address", ray_nodes.address, "--name", name]
    options = [f"--storage-option={k}={v}" for k, v in s3.options().items()]
    runner = CliRunner()
    try:
        up = runner.invoke(app, ["cluster", "up", *common, "--storage", s3.uri(name), *options, "--dim", "8",
                                 "--device", "none", "--shards", "2", "--local-root", str(tmp_path / "local")])
        assert up.exit_code == 0, up.output
        assert "shard-0" in up.output and "shard-1" in up.output and s3.secret_key not in up.output
        grown = runner.invoke(app, ["cluster", "add-shard", *common])
        assert grown.exit_code == 0 and "added shard-2" in grown.output, grown.output
        shown = runner.invoke(app, ["cluster", "status", *common, "--json"])
        assert shown.exit_code == 0 and '"shard-2"' in shown.output and s3.secret_key not in shown.output
        shrunk = runner.invoke(app, ["cluster", "remove-shard", "shard-0", *common])
        assert shrunk.exit_code == 0 and "removed shard-0" in shrunk.output, shrunk.output
        missing = runner.invoke(app, ["cluster", "status", "--address", ray_nodes.address, "--name", "nothing"])
        assert missing.exit_code != 0 and "cluster up --name nothing" in missing.output
    finally:
        stopped = runner.invoke(app, ["cluster", "down", *common])
    assert stopped.exit_code == 0, stopped.output
