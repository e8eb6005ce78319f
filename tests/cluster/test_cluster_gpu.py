"""A shard on a GPU node takes the GPU (num_gpus=1) and serves from its CUDA hot tier, through the cluster as through
a TieredMemory (the GPU machine: benchmarks/gpu_cluster.sh runs it; object storage is a folder there)."""
from __future__ import annotations

import shutil
import tempfile

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.lancedb]


def test_a_gpu_shard_serves_from_its_cuda_hot_tier(tmp_path):
    from tiered_recall.cluster import ClusterMemory, down, make_config, status, up
    from tiered_recall.testing.cluster_parts import RayNodes

    temp = tempfile.mkdtemp(prefix="trray-", dir="/tmp")
    nodes = RayNodes(workers=0, head_cpus=4, head_gpus=1, temp_dir=temp)
    try:
        config = make_config(str(tmp_path / "storage"), name="gpu", dim=64, device="auto", hot_capacity=4096,
                             local_root=str(tmp_path / "local"))
        up(config)
        try:
            assert [s["shard"] for s in status("gpu")["shards"]] == ["shard-0"]
            with ClusterMemory(nodes.address, name="gpu", colocated=False) as memory:
                rng = np.random.default_rng(0)
                vectors = rng.standard_normal((500, 64)).astype(np.float32)
                ids = memory.add([f"m{i}" for i in range(500)], vectors=vectors, namespace="g")
                stats = memory.stats()["shards"]["shard-0"]["memory"]
                assert stats["hot_backend"] == "cuda"
                q = vectors[7] / np.linalg.norm(vectors[7])
                hits = memory.search(q, k=5, namespace="g")
                assert hits[0].id == ids[7] and hits[0].shard == "shard-0"
                assert memory.search(q, k=5, namespace="g", explain=True).rule == "complete"
                assert all(h.tier == "hot" for h in hits)
        finally:
            down("gpu")
    finally:
        nodes.close()
        shutil.rmtree(temp, ignore_errors=True)
