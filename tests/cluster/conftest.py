"""Cluster fixtures: a real S3-compatible server (moto's server mode, signed requests checked) and a Ray cluster of a
head and two nodes on this machine, one of each per test module; each test's own tiered-recall clusters (own name,
own storage prefix, own node-local folders) are stopped at its end, even when it fails."""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

pytest.importorskip("ray")

from tiered_recall.testing.cluster_parts import RayNodes, S3Server  # noqa: E402

pytestmark = pytest.mark.lancedb
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The long cluster tests (node kills, outages, moves under load: minutes on two cores) run when asked for
    (`-m slow`, or TR_CLUSTER_SLOW=1); the default run keeps the short set."""
    markexpr = config.getoption("-m") or ""
    if ("slow" in markexpr and "not slow" not in markexpr) or os.environ.get("TR_CLUSTER_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="a long cluster test: run it with -m slow (or TR_CLUSTER_SLOW=1)")
    for item in items:
        if "slow" in item.keywords and HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("moto")
    server = S3Server()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def ray_temp_dir():
    # Ray's socket paths must stay short: a folder of its own straight under /tmp.
    folder = tempfile.mkdtemp(prefix="trray-", dir="/tmp")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_nodes(ray_temp_dir):
    nodes = RayNodes(workers=2, cpus=2, head_cpus=2, temp_dir=ray_temp_dir)
    try:
        yield nodes
    finally:
        nodes.close()


@pytest.fixture
def make_cluster(ray_nodes, s3, tmp_path):
    """make_cluster(shards=3, **settings) -> (ClusterConfig, ClusterMemory): a cluster of this test's own on the
    module's Ray and S3 server; stopped (and its clients closed) when the test ends."""
    from tiered_recall.cluster import ClusterMemory, down, make_config, up

    started: list[str] = []
    clients: list = []

    def make(shards: int | None = 3, client: bool = True, **settings):
        name = settings.pop("name", f"t{uuid.uuid4().hex[:10]}")
        settings.setdefault("dim", 8)
        settings.setdefault("device", "none")
        settings.setdefault("local_root", str(tmp_path / "local"))
        config = make_config(s3.uri(name), name=name, storage_options=s3.options(), **settings)
        started.append(name)
        up(config, shards=shards)
        memory = None
        if client:
            memory = ClusterMemory(ray_nodes.address, name=name)
            clients.append(memory)
        return config, memory

    try:
        yield make
    finally:
        for memory in clients:
            memory.close()
        for name in started:
            try:
                down(name)
            except Exception:  # a cluster whose start failed has nothing to stop
                pass
