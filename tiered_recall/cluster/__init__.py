"""Past one host: a cluster of shards on Ray, each a TieredMemory whose cold tier lives in object storage, memories
sharded by namespace (docs/cluster.md). ClusterMemory and AsyncClusterMemory have TieredMemory's methods."""
from __future__ import annotations

from .async_client import AsyncClusterMemory
from .client import ClusterMemory
from .config import ClusterConfig, make_config
from .launch import add_shard, down, remove_shard, start_local_ray, status, stop_local_ray, up

__all__ = ["ClusterMemory", "AsyncClusterMemory", "ClusterConfig", "make_config", "up", "down", "status", "add_shard",
           "remove_shard", "start_local_ray", "stop_local_ray"]
