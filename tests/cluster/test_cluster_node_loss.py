"""A node killed under load (the short set of the cluster's fault tests, run by default): no acknowledged write is
lost, no search answers wrong, and the lost node's shard serves again from object storage."""
from __future__ import annotations

import time

import numpy as np
import pytest

from tiered_recall.cluster import status
from tiered_recall.cluster.hashing import owner

from cluster_load import DIM, Load, fill, shard_on_a_worker
from exact import Model, same_answer, unit

pytestmark = pytest.mark.timeout(900)


def test_a_node_killed_under_load_loses_no_acknowledged_write_and_its_shard_serves_again(make_cluster, ray_nodes):
    config, memory = make_cluster(shards=3)
    rng = np.random.default_rng(1)
    model = Model()
    still = [f"still-{i}" for i in range(12)]
    fill(memory, model, still, rng)
    victim, node = shard_on_a_worker(config.name, ray_nodes)
    epoch = next(s["epoch"] for s in status(config.name)["shards"] if s["shard"] == victim)
    load = Load(memory, model, [f"busy-{i}" for i in range(12)], still)
    try:
        time.sleep(3)
        before = len(load.acknowledged)
        killed_at = time.monotonic()
        ray_nodes.kill(node)
        theirs = next(ns for ns in still if owner(ns, memory._session.view.ring) == victim)
        while True:  # its namespaces answer again once Ray restarted the shard elsewhere, from object storage
            now = next(s for s in status(config.name)["shards"] if s["shard"] == victim)
            if now["ready"] and now["epoch"] > epoch:
                memory.count(theirs)
                break
            assert time.monotonic() - killed_at < 120, now
            time.sleep(0.2)
        back_after = time.monotonic() - killed_at
        time.sleep(3)
    finally:
        load.stop()
        ray_nodes.add()  # the module's Ray keeps its three nodes
    print(f"{victim} served again {back_after:.1f} s after its node was killed; acknowledged writes: {before} "
          f"before, {len(load.acknowledged)} in all; failed calls: {len(load.failures)}; checked searches: "
          f"{load.checked}")
    assert back_after < 60
    assert load.wrong == [] and load.checked > 0  # a search waited or failed clearly, never a wrong answer
    assert len(load.acknowledged) > before
    acknowledged = sorted(load.acknowledged)
    found = memory.get(acknowledged)
    assert [i for i, m in zip(acknowledged, found) if m is None] == []  # every acknowledged write is there
    assert all(m.namespace == load.acknowledged[m.id] for m in found)
    q = unit(rng, DIM)
    for ns in still:
        assert same_answer(memory.search(q, k=3, namespace=ns), model.exact(q, 3, namespace=ns))
