"""The `tiered-recall` command line (commands.py), its output (output.py) and its demo (demo.py)."""
from __future__ import annotations

import atexit
import os
import sys
import threading

from .commands import app

__all__ = ["app", "main"]


def main() -> None:
    """The tiered-recall command's entry point. Once a command has returned (its stores closed, its output written),
    the process ends without the interpreter's teardown of every module, which takes longer than a search (LanceDB's
    and onnxruntime's runtimes going down): the atexit handlers still run, and a thread of the command's that is still
    running keeps the ordinary exit, which waits for it."""
    try:
        app()  # standalone mode: it always ends in SystemExit
    except SystemExit as exc:
        _exit_now(exc.code)


def _exit_now(code: object) -> None:
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): printed, status 1, as the interpreter does
        print(code, file=sys.stderr)
        status = 1
    running = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if running:
        sys.exit(status)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach it
            pass
    os._exit(status)
