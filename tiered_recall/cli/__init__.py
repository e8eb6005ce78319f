"""The `tiered-recall` command line (commands.py), its output (output.py) and its demo (demo.py)."""
from __future__ import annotations

from .commands import app

__all__ = ["app", "main"]


def main() -> None:
    """The tiered-recall command's entry point."""
    app()
