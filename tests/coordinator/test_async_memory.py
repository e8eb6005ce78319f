"""AsyncTieredMemory: the same answers and errors as TieredMemory, awaited, with the event loop free meanwhile."""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from tiered_recall import AsyncTieredMemory, InvalidInput, TieredMemory

pytestmark = pytest.mark.lancedb
DIM = 8


def test_async_calls_give_the_sync_answers_and_errors(tmp_path):
    x = np.eye(DIM, dtype=np.float32)

    async def main():
        async with AsyncTieredMemory(tmp_path / "s", dim=DIM, embedder=None, device="none") as memory:
            ids = await memory.add(["a", "b", "c"], vectors=x[:3], namespace=("users", "alice"))
            hits = await memory.search(x[1], k=2, namespace=("users", "alice"))
            assert hits[0].id == ids[1] and len(hits) == 2
            assert (await memory.get([ids[2]]))[0].text == "c"
            assert await memory.count(("users", "alice")) == 3
            assert await memory.list_namespaces() == [("users", "alice")]
            assert await memory.delete([ids[0]]) == 1
            with pytest.raises(InvalidInput, match="k must be"):
                await memory.search(x[0], k=0)
            return ids

    ids = asyncio.run(main())
    with TieredMemory(tmp_path / "s", dim=DIM, embedder=None, device="none") as memory:
        assert memory.count() == 2 and memory.get([ids[0]]) == [None]


def test_the_event_loop_runs_while_a_call_works(tmp_path):
    async def main():
        memory = AsyncTieredMemory(tmp_path / "s", dim=DIM, embedder=None, device="none")
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())
        rows = np.random.default_rng(0).standard_normal((2000, DIM)).astype(np.float32)
        t0 = time.perf_counter()
        await memory.add([f"m{i}" for i in range(2000)], vectors=rows, namespace="n")
        took = time.perf_counter() - t0
        task.cancel()
        await memory.aclose()
        return ticks, took

    ticks, took = asyncio.run(main())
    assert ticks >= 3 and took > 0.003, (ticks, took)  # the loop went on ticking while the add ran in its thread
