"""An unsupported Python gets the project's own message (needs 3.10+), not an error from a dependency."""
from __future__ import annotations

import glob
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MESSAGE = "tiered-recall needs Python 3.10 or newer"


def _import_on(python: str, prelude: str = "") -> subprocess.CompletedProcess:
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); {prelude}import tiered_recall"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)


def test_an_older_version_is_refused_with_the_projects_message() -> None:
    done = _import_on(sys.executable, "sys.version_info = (3, 9, 18, 'final', 0); ")
    assert done.returncode != 0
    assert MESSAGE in done.stderr and "ImportError" in done.stderr


# Python 3.7 and later parse the package's first lines (from __future__ import annotations), so they reach the check.
_OLD_PYTHONS = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.[7-9].*/bin/python3")))


@pytest.mark.skipif(not _OLD_PYTHONS, reason="no Python older than 3.10 under pyenv on this machine")
@pytest.mark.parametrize("python", _OLD_PYTHONS)
def test_a_real_older_python_gets_the_projects_message(python: str) -> None:
    done = _import_on(python)
    assert done.returncode != 0
    assert MESSAGE in done.stderr, done.stderr
