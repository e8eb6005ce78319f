"""The coordinator: TieredMemory, which answers from the hot tier when a skip rule proves it may, else merges in the
cold tier; its parts each own their state (link, placement, rules, validate, records, store_folder, expiry);
AsyncTieredMemory, the same store for asyncio."""
from __future__ import annotations

from .async_memory import AsyncTieredMemory
from .memory import TieredMemory
from .presets import DEFAULT_PRESET, PRESET_EMBEDDER, PRESETS, Preset
from .records import Hit, Memory, SearchReport
from .stages import Stages

__all__ = ["TieredMemory", "AsyncTieredMemory", "Hit", "Memory", "SearchReport", "Preset", "PRESETS", "DEFAULT_PRESET",
           "PRESET_EMBEDDER", "Stages"]
