"""Finds the files native/ compiles (the sidecar, the client library, the fused encoder, the compiled extensions)
where the package installed them, or in the folder TIERED_RECALL_BIN_DIR names, and loads the extensions."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sysconfig
import warnings
from pathlib import Path
from types import ModuleType

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


def installed_extension(name: str, directories: list[Path] | None = None) -> Path | None:
    """The compiled extension module `name` (any suffix this Python loads) in the first of `directories` (default:
    the candidate folders) that has it, or None."""
    for directory in candidate_dirs() if directories is None else directories:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = directory / f"{name}{suffix}"
            if path.exists():
                return path
    return None


def load_extension(path: Path, name: str, api: int, fallback: str) -> ModuleType | None:
    """The extension at `path` loaded as tiered_recall.`name`, or None with a RuntimeWarning naming the fix when it
    cannot load (built against another numpy, say) or its API constant is not `api` (another build of the package);
    fallback says what runs instead."""
    spec = importlib.util.spec_from_file_location(f"tiered_recall.{name}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:
        warnings.warn(f"{path} could not be loaded ({exc}): {fallback}; reinstall the package to rebuild it",
                      RuntimeWarning, stacklevel=3)
        return None
    if getattr(module, "API", None) != api:
        warnings.warn(f"{path} is from another version of the package (API {getattr(module, 'API', None)}, this one "
                      f"needs {api}): {fallback}; reinstall the package to rebuild it", RuntimeWarning, stacklevel=3)
        return None
    return module
