"""The hot-tier client: HotTier over a sidecar's shared-memory segment, and starting or stopping the sidecar. It
imports no cold tier and no LanceDB, so it runs where only the GPU is (the import-linter contracts say so)."""
from __future__ import annotations

from .client import HotTier, SearchResult
from .layout import code_bytes_a_row
from .native import sidecar_executable
from .process import DetachedSidecar, SidecarProcess, sidecar_args, start_sidecar
from .segment import SHM_DIR, segment_path, validate_name

__all__ = ["HotTier", "SearchResult", "start_sidecar", "sidecar_args", "SidecarProcess", "DetachedSidecar",
           "segment_path", "validate_name", "sidecar_executable", "SHM_DIR", "code_bytes_a_row"]
