"""AsyncClusterMemory: ClusterMemory for asyncio code, each call run in a worker thread (AsyncTieredMemory's
mechanism over a ClusterMemory), so the event loop never waits on a shard."""
from __future__ import annotations

from typing import Any

from ..coordinator import AsyncTieredMemory
from .client import ClusterMemory


class AsyncClusterMemory(AsyncTieredMemory):
    """The same cluster, arguments, results and errors as ClusterMemory, with awaitable methods.

    AsyncClusterMemory(address=None, *, workers=8, **ClusterMemory options), or AsyncClusterMemory.wrap(memory)."""

    def __init__(self, address: str | None = None, *, workers: int = 8, **options: Any) -> None:
        self._init(ClusterMemory(address, **options), workers, False)

    @classmethod
    def wrap(cls, memory: ClusterMemory, *, workers: int = 8) -> "AsyncClusterMemory":
        """An AsyncClusterMemory over an open ClusterMemory (closing it closes that client)."""
        return super().wrap(memory, workers=workers)
