"""AsyncTieredMemory: TieredMemory for asyncio code, each call run in a worker thread so the event loop never waits on
the store (docs/frameworks.md gives the measured cost of the hop and why searches are not run inline by default)."""
from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .memory import TieredMemory
from .records import Hit, Memory, SearchReport


class AsyncTieredMemory:
    """The same store, the same arguments and the same errors as TieredMemory, with awaitable methods.

    AsyncTieredMemory(path=None, *, workers=4, inline_search=False, **TieredMemory options), or
    AsyncTieredMemory.wrap(memory) over an open TieredMemory. Each call runs in one of `workers` threads
    (TieredMemory is thread-safe: its calls take its own lock where they must). inline_search=True runs search()
    in the event loop's thread instead: quicker when the hot tier answers (no thread hop), but a search the
    cold tier serves then holds the loop for its milliseconds.
    """

    def __init__(self, path: Any = None, *, workers: int = 4, inline_search: bool = False, **options: Any) -> None:
        self._init(TieredMemory(path, **options), workers, inline_search)

    @classmethod
    def wrap(cls, memory: TieredMemory, *, workers: int = 4, inline_search: bool = False) -> "AsyncTieredMemory":
        """An AsyncTieredMemory over an open TieredMemory (closing it closes that store)."""
        self = cls.__new__(cls)
        self._init(memory, workers, inline_search)
        return self

    def _init(self, memory: TieredMemory, workers: int, inline_search: bool) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            memory.close()
            from ..errors import InvalidInput

            raise InvalidInput(f"workers must be an int >= 1 (threads that run the store's calls), got {workers!r}")
        self.memory = memory
        self.inline_search = bool(inline_search)
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tiered-recall-async")

    async def _run(self, method, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(method, *args, **kwargs))

    async def add(self, texts: str | Sequence[str] | None = None, **kwargs: Any) -> list[int]:
        """TieredMemory.add, awaited."""
        return await self._run(self.memory.add, texts, **kwargs)

    async def search(self, query: str | np.ndarray, **kwargs: Any) -> list[Hit] | SearchReport:
        """TieredMemory.search, awaited (in the loop's thread with inline_search=True)."""
        if self.inline_search:
            return self.memory.search(query, **kwargs)
        return await self._run(self.memory.search, query, **kwargs)

    async def get(self, ids: Sequence[int] | int, **kwargs: Any) -> list[Memory | None]:
        """TieredMemory.get, awaited."""
        return await self._run(self.memory.get, ids, **kwargs)

    async def delete(self, ids: Sequence[int] | int) -> int:
        """TieredMemory.delete, awaited."""
        return await self._run(self.memory.delete, ids)

    async def count(self, namespace: Any = None) -> int:
        """TieredMemory.count, awaited."""
        return await self._run(self.memory.count, namespace)

    async def list_namespaces(self, **kwargs: Any) -> list[tuple[str, ...]]:
        """TieredMemory.list_namespaces, awaited."""
        return await self._run(self.memory.list_namespaces, **kwargs)

    async def namespaces(self) -> dict[str, dict[str, int]]:
        """TieredMemory.namespaces, awaited."""
        return await self._run(self.memory.namespaces)

    async def vectors(self, ids: Sequence[int] | int) -> list[np.ndarray | None]:
        """TieredMemory.vectors, awaited."""
        return await self._run(self.memory.vectors, ids)

    async def stats(self) -> dict:
        """TieredMemory.stats, awaited."""
        return await self._run(self.memory.stats)

    async def aclose(self) -> None:
        """Closes the store (in a worker thread: closing waits for the cold tier's background work) and the threads."""
        await self._run(self.memory.close)
        self._executor.shutdown(wait=True)

    async def __aenter__(self) -> "AsyncTieredMemory":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.memory!r})"
