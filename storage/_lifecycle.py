"""Whether a cold store is still open: one flag every part of the store checks, set once by ColdStore.close()."""
from __future__ import annotations

from ..errors import StorageError


class Lifecycle:
    """The open/closed flag of one cold store."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.closed = False

    def ensure_open(self) -> None:
        """Raises StorageError once the store is closed."""
        if self.closed:
            raise StorageError(f"cold store at {self.path} is closed; open a new ColdStore")

    def mark_closed(self) -> None:
        """Marks the store closed; every later ensure_open() raises."""
        self.closed = True
