"""Where shards run: one per GPU on GPU nodes, a configured number on each node without one; and the Ray options that
give each shard its resources, its name and its restart policy."""
from __future__ import annotations

from typing import Any

from .config import ClusterConfig

GPU, CPU = "gpu", "cpu"
# Requests a shard runs at once (searches, adds that then share a group commit); the store takes its own locks.
SHARD_CONCURRENCY = 64


def alive_nodes() -> list[dict[str, Any]]:
    """Ray's alive nodes: {"node": id, "cpus": n, "gpus": n}."""
    import ray

    out = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        resources = node.get("Resources") or {}
        out.append({"node": node["NodeID"], "cpus": float(resources.get("CPU", 0)),
                    "gpus": int(resources.get("GPU", 0))})
    return out


def initial_layout(nodes: list[dict[str, Any]], config: ClusterConfig, shards: int | None) -> list[dict[str, Any]]:
    """The shards to start: [{"kind": "gpu" | "cpu", "node": a node to start on, or None}], one per GPU first (when
    the shards' device may be CUDA), then shards_per_cpu_node on each node without a GPU that has the CPUs (on every
    node, when there are no GPU shards); `shards` caps (or, cycling over the CPU nodes, extends) that count."""
    gpu = [{"kind": GPU, "node": n["node"]} for n in nodes for _ in range(n["gpus"])] \
        if config.device in ("auto", "cuda") else []
    # With GPU shards, the GPU nodes' CPUs serve them (their sidecars' hosts, their clients); without, every node's.
    cpu_nodes = [n for n in nodes if (n["gpus"] == 0 or not gpu) and n["cpus"] > 0
                 and n["cpus"] >= config.cpus_per_shard]
    cpu = [{"kind": CPU, "node": n["node"]} for _ in range(config.shards_per_cpu_node) for n in cpu_nodes]
    layout = gpu + cpu
    if shards is None:
        return layout
    if shards <= len(layout):
        return layout[:shards]
    extra = [{"kind": CPU, "node": cpu_nodes[i % len(cpu_nodes)]["node"] if cpu_nodes else None}
             for i in range(shards - len(layout))]
    return layout + extra


def shard_options(config: ClusterConfig, name: str, namespace: str, kind: str, node: str | None) -> dict[str, Any]:
    """The Ray actor options of a shard: a GPU (num_gpus=1) or CPUs on a node (a soft preference: when that node is
    gone, Ray starts it on another), detached under its name, restarted without end."""
    options: dict[str, Any] = {"name": name, "namespace": namespace, "lifetime": "detached", "max_restarts": -1,
                               "max_task_retries": 0, "max_concurrency": SHARD_CONCURRENCY,
                               "num_cpus": config.cpus_per_shard}
    if kind == GPU:
        options["num_gpus"] = 1
    elif node is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node, soft=True)
    return options
