"""Finds the files native/ compiles (the sidecar, the client library, the fused encoder, the compiled stages) where the package installed
them, or in the folder TIERED_RECALL_BIN_DIR names."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sysconfig
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent  # the _bin folder is beside tiered_recall/__init__.py


def candidate_dirs() -> list[Path]:
    """The folders looked in, first match wins: TIERED_RECALL_BIN_DIR, the package's _bin, an editable install's."""
    dirs = []
    override = os.environ.get("TIERED_RECALL_BIN_DIR")
    if override:
        dirs.append(Path(override))
    dirs.append(_PACKAGE_DIR / "_bin")
    # An editable install keeps compiled files in site-packages, not beside the sources.
    try:
        spec = importlib.util.find_spec("tiered_recall")
        for location in (spec.submodule_search_locations or []) if spec else []:
            dirs.append(Path(location) / "_bin")
    except (ImportError, ValueError):
        pass
    for key in ("purelib", "platlib"):
        dirs.append(Path(sysconfig.get_paths()[key]) / "tiered_recall" / "_bin")
    return dirs


def installed_file(filename: str) -> Path | None:
    """The first candidate folder's `filename`, or None where none has it."""
    for directory in candidate_dirs():
        path = directory / filename
        if path.exists():
            return path
    return None


def installed_extension(name: str) -> Path | None:
    """The first candidate folder's compiled extension module `name` (any suffix this Python loads), or None."""
    for directory in candidate_dirs():
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = directory / f"{name}{suffix}"
            if path.exists():
                return path
    return None
