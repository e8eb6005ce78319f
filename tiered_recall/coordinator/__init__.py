"""The coordinator: TieredMemory, a facade over its parts (search and planner, link, placement, validate, records,
store_folder, expiry), which answers from the hot tier when a skip rule proves it may, else merges in the cold tier;
AsyncTieredMemory, the same store for asyncio (imported when first asked for: asyncio is not free to import)."""
from __future__ import annotations

from .memory import TieredMemory
from .presets import DEFAULT_PRESET, PRESET_EMBEDDER, PRESETS, Preset
from .records import Hit, Memory, SearchReport
from .stages import Stages

__all__ = ["TieredMemory", "AsyncTieredMemory", "Hit", "Memory", "SearchReport", "Preset", "PRESETS", "DEFAULT_PRESET",
           "PRESET_EMBEDDER", "Stages"]


def __getattr__(name: str):
    if name == "AsyncTieredMemory":
        from .async_memory import AsyncTieredMemory

        return AsyncTieredMemory
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
