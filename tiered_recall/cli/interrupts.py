"""Ctrl-C during a long command (ingest): the first asks it to stop at its next safe point, the second ends the
process at once with exit status 130.

Python runs a signal handler only when the main thread is between bytecodes, and an ingest's main thread spends
seconds at a time in native code (embedding a batch, LanceDB writing it), so a second Ctrl-C raised as
KeyboardInterrupt waited for that call to return. Here the signal is seen by a watcher thread through the
interpreter's wakeup fd, which the C-level handler writes as the signal arrives, whatever the main thread is
doing. Ending the process mid-batch leaves the store consistent: every add is all-or-nothing and durable when it
returns (the write-ahead log), so the batch being written is either stored whole or not at all, and running the
same command again stores what is missing.
"""
from __future__ import annotations

import os
import signal
import threading
from types import TracebackType

from .output import note

INTERRUPTED_EXIT_CODE = 130  # what a shell reports for a command ended by SIGINT (128 + 2)


class StopOnCtrlC:
    """A context in which the first SIGINT sets `stopping` (and says so) and the second exits the process at once.

    first_note / second_note: the lines printed on stderr for each."""

    def __init__(self, *, first_note: str, second_note: str) -> None:
        self.stopping = threading.Event()
        self.first_note = first_note
        self.second_note = second_note
        self._previous_handler: object = None
        self._previous_fd = -1
        self._pipe: tuple[int, int] | None = None
        self._watcher: threading.Thread | None = None

    def __enter__(self) -> "StopOnCtrlC":
        if threading.current_thread() is not threading.main_thread():
            return self  # signals reach the main thread only: a command run from another thread keeps Python's ways
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)  # the interpreter's signal handler must never block on it
        self._pipe = (read_end, write_end)
        self._previous_handler = signal.signal(signal.SIGINT, _nothing_in_the_main_thread)
        self._previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        self._watcher = threading.Thread(target=self._watch, args=(read_end,), name="tiered-recall-ctrl-c",
                                         daemon=True)
        self._watcher.start()
        return self

    def _watch(self, read_end: int) -> None:
        count = 0
        while True:
            try:
                data = os.read(read_end, 64)
            except OSError:
                return
            if not data:
                return  # the context ended and closed the pipe
            for number in data:
                if number != signal.SIGINT:
                    continue
                count += 1
                if count == 1:
                    self.stopping.set()
                    note(self.first_note)
                else:
                    # os.write, not the console: the main thread may hold the console's lock, and nothing after
                    # this line runs.
                    os.write(2, (self.second_note + "\n").encode())
                    os._exit(INTERRUPTED_EXIT_CODE)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._pipe is None:
            return
        signal.set_wakeup_fd(self._previous_fd)
        signal.signal(signal.SIGINT, self._previous_handler)  # type: ignore[arg-type]
        read_end, write_end = self._pipe
        os.close(write_end)  # the watcher reads the end of the pipe and returns
        assert self._watcher is not None
        self._watcher.join()
        os.close(read_end)
        self._pipe = None


def _nothing_in_the_main_thread(signum: int, frame: object) -> None:
    """The Python-level SIGINT handler while a StopOnCtrlC is active: the watcher thread acts on the signal (the C
    handler wrote it to the wakeup fd), so the main thread carries on undisturbed."""
