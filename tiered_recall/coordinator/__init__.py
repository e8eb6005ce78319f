"""The coordinator: TieredMemory, a facade over its parts (search and planner, link, placement, validate, records,
store_folder, expiry), which answers from the hot tier when a skip rule proves it may, else merges in the cold tier;
AsyncTieredMemory, the same store for asyncio. Each is imported when first asked for, so that a command line that
only checks its arguments (coordinator.validate) loads neither tier."""
from __future__ import annotations

import importlib

_WHERE = {"TieredMemory": ".memory", "AsyncTieredMemory": ".async_memory", "Hit": ".records", "Memory": ".records",
          "SearchReport": ".records", "Preset": ".presets", "PRESETS": ".presets", "DEFAULT_PRESET": ".presets",
          "PRESET_EMBEDDER": ".presets", "Stages": ".stages"}

__all__ = ["TieredMemory", "AsyncTieredMemory", "Hit", "Memory", "SearchReport", "Preset", "PRESETS", "DEFAULT_PRESET",
           "PRESET_EMBEDDER", "Stages"]


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # found once: later reads take it from the module's namespace
    return value
