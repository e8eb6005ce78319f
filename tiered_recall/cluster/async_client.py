"""AsyncClusterMemory: ClusterMemory for asyncio code, each call run in a worker thread (as AsyncTieredMemory does),
so the event loop never waits on a shard."""
from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import InvalidInput
from .client import ClusterMemory


class AsyncClusterMemory:
    """The same cluster, arguments, results and errors as ClusterMemory, with awaitable methods.

    AsyncClusterMemory(address=None, *, workers=8, **ClusterMemory options), or AsyncClusterMemory.wrap(memory)."""

    def __init__(self, address: str | None = None, *, workers: int = 8, **options: Any) -> None:
        self._init(ClusterMemory(address, **options), workers)

    @classmethod
    def wrap(cls, memory: ClusterMemory, *, workers: int = 8) -> "AsyncClusterMemory":
        """An AsyncClusterMemory over an open ClusterMemory (closing it closes that client)."""
        self = cls.__new__(cls)
        self._init(memory, workers)
        return self

    def _init(self, memory: ClusterMemory, workers: int) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            memory.close()
            raise InvalidInput(f"workers must be an int >= 1 (threads that run the calls), got {workers!r}")
        self.memory = memory
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tiered-recall-cluster")

    async def _run(self, method, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(method, *args, **kwargs))

    async def add(self, texts: Any = None, **kwargs: Any) -> list[int]:
        """ClusterMemory.add, awaited."""
        return await self._run(self.memory.add, texts, **kwargs)

    async def search(self, query: Any, **kwargs: Any) -> Any:
        """ClusterMemory.search, awaited."""
        return await self._run(self.memory.search, query, **kwargs)

    async def get(self, ids: Any, **kwargs: Any) -> list:
        """ClusterMemory.get, awaited."""
        return await self._run(self.memory.get, ids, **kwargs)

    async def delete(self, ids: Any) -> int:
        """ClusterMemory.delete, awaited."""
        return await self._run(self.memory.delete, ids)

    async def count(self, namespace: Any = None) -> int:
        """ClusterMemory.count, awaited."""
        return await self._run(self.memory.count, namespace)

    async def list_namespaces(self, **kwargs: Any) -> list[tuple[str, ...]]:
        """ClusterMemory.list_namespaces, awaited."""
        return await self._run(self.memory.list_namespaces, **kwargs)

    async def namespaces(self) -> dict[str, dict[str, int]]:
        """ClusterMemory.namespaces, awaited."""
        return await self._run(self.memory.namespaces)

    async def vectors(self, ids: Any) -> list:
        """ClusterMemory.vectors, awaited."""
        return await self._run(self.memory.vectors, ids)

    async def stats(self) -> dict:
        """ClusterMemory.stats, awaited."""
        return await self._run(self.memory.stats)

    async def aclose(self) -> None:
        """Closes the client (in a worker thread) and its threads."""
        await self._run(self.memory.close)
        self._executor.shutdown(wait=True)

    async def __aenter__(self) -> "AsyncClusterMemory":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncClusterMemory({self.memory!r})"
