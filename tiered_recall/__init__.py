"""tiered-recall: a two-tier memory store for LLM agents (hot tier in a GPU/CPU sidecar, LanceDB on disk)."""
from __future__ import annotations

import sys

if sys.version_info < (3, 10):  # pip checks requires-python too; this covers a copy put on sys.path by hand
    raise ImportError(f"tiered-recall needs Python 3.10 or newer; this is Python {sys.version.split()[0]}: "
                      "install it into a Python 3.10+ environment")

from .errors import (  # noqa: E402
    ClusterUnavailable,
    HotTierFull,
    IncompatibleLayout,
    InvalidInput,
    ReadOnlyStore,
    SidecarError,
    ShardUnavailable,
    SidecarUnavailable,
    StorageError,
    TieredRecallError,
)

__version__ = "0.1.0"

__all__ = [
    "TieredMemory", "AsyncTieredMemory", "Hit", "Memory", "SearchReport", "Preset", "PRESETS", "Stages", "ingest",
    "IngestSummary",
    "TieredRecallError", "InvalidInput", "SidecarUnavailable", "IncompatibleLayout", "HotTierFull",
    "SidecarError", "StorageError", "ReadOnlyStore", "ShardUnavailable", "ClusterUnavailable", "__version__",
]


def __getattr__(name: str):
    # Imported on first use: the hot-tier client and benchmarks stay free of lancedb and wordllama.
    if name in ("TieredMemory", "AsyncTieredMemory", "Hit", "Memory", "SearchReport", "Preset", "PRESETS", "Stages"):
        from . import coordinator

        return getattr(coordinator, name)
    if name in ("ingest", "IngestSummary"):
        import importlib

        module = importlib.import_module(".ingest", __name__)  # a callable module: tiered_recall.ingest(paths, ...)
        return module if name == "ingest" else module.IngestSummary
    raise AttributeError(f"module 'tiered_recall' has no attribute {name!r}")
