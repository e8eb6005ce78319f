"""The store's cross-process write lock: one process at a time changes the hot tier (applies the log's writes to it,
warms, repairs or promotes)."""
from __future__ import annotations

from pathlib import Path

from .file_lock import FileLock

LOCK_FILE = ".write.lock"


class StoreWriteLock(FileLock):
    """A FileLock on `<store>/.write.lock`, re-entrant within a thread (add -> reconnect -> warm).

    A logged write takes it only to apply the hot side of every write logged since the last application (its own
    and other processes', in log order: group_commit.py); a write that bypasses the log holds it from before its cold
    write until its hot side is done, so no other process applies records past its note meanwhile.
    `held(wait=False)` yields False at once when another holder has it: writers that find it held, promotions and
    repairs use that. A row read from the cold tier and put into the hot tier without the lock could land after
    the application of a newer write of the same id.
    """

    def __init__(self, store_path: str | Path) -> None:
        super().__init__(Path(store_path) / LOCK_FILE)
