"""Write generations: shared counters that every write to the cold tier bumps before it is acknowledged.

A reader in any process tells in a few memory loads whether what it learnt of a namespace (the hot tier's
rows and counts, say) is still current: it keeps the counters it saw and compares them later. The counters live
in one small file beside the table (`generations`), mapped by every process that opens the store.

Layout (little-endian u64 words, `SLOTS` a power of two):
  word 0     magic "TRGEN01\\0"
  word 1     format version (low 32 bits) and slot count (high 32 bits)
  word 8     writes: bumped by every write, whichever namespaces it touched
  word 9     unplaced: bumped by a write whose namespaces are not known (a delete or upsert by id without the
             in-memory mirror, which alone knows each id's namespace cheaply)
  word 16+s  the generation of slot s: bumped by every write that touched a namespace whose hash falls in slot s
A namespace's slot is its 64-bit hash (tiered_recall.namespaces.namespace_hash) modulo SLOTS; namespaces that
share a slot share its generation, which only ever makes a reader ask the disk once more than it needed to.
Bumps take the file's lock (file_lock.FileLock: an flock, and a mutex for the threads of one process); reads take
nothing: each word is one aligned 8-byte load and store.
"""
from __future__ import annotations

import mmap
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from ..errors import StorageError
from ..namespaces import namespace_hash
from .file_lock import FileLock

FILE_NAME = "generations"
MAGIC = int.from_bytes(b"TRGEN01\0", "little")
VERSION = 1
SLOTS = 1 << 16
WORD_WRITES = 8
WORD_UNPLACED = 9
FIRST_SLOT_WORD = 16
FILE_BYTES = 8 * (FIRST_SLOT_WORD + SLOTS)


def slot_of(ns_hash: int) -> int:
    """The generation slot of a namespace hash."""
    return int(ns_hash) & (SLOTS - 1)


@dataclass(frozen=True)
class Bump:
    """What one write did to the counters: every value is the one just before this write's bump (each went up by
    exactly one). namespaces: the namespaces it touched, or None when they were not known (unplaced bumped)."""

    namespaces: tuple[str, ...] | None
    slots: np.ndarray  # (m,) int64, unique
    slot_before: np.ndarray  # (m,) uint64
    writes_before: int
    unplaced_before: int | None
    # Where the write is in the write-ahead log (set by the writer): the (generation, offset) just past the record
    # that carries it (a logged add or delete, with this bump inside), or, for an add that bypassed the log, where
    # its "changed" note begins.
    record_end: tuple[int, int] | None = None
    note_at: tuple[int, int] | None = None

    def fields(self) -> list:
        """The bump as plain JSON values, for the log record that carries the write."""
        return [None if self.namespaces is None else list(self.namespaces), [int(s) for s in self.slots],
                [int(b) for b in self.slot_before], int(self.writes_before),
                None if self.unplaced_before is None else int(self.unplaced_before)]

    @classmethod
    def of_fields(cls, fields: list) -> "Bump":
        """fields()' inverse."""
        names, slots, before, writes, unplaced = fields
        return cls(None if names is None else tuple(names), np.array(slots, dtype=np.int64),
                   np.array(before, dtype=np.uint64), int(writes), unplaced)


@dataclass(frozen=True)
class Snapshot:
    """Every counter at one moment (the slot generations copied), for a reader that certifies many slots at once."""

    writes: int
    unplaced: int
    slots: np.ndarray  # (SLOTS,) uint64


class WriteGenerations:
    """The store's generation counters. writable=False maps an existing file read-only (None is returned by
    `open` where there is no file yet and the folder cannot be written)."""

    def __init__(self, folder: str | os.PathLike, *, writable: bool = True) -> None:
        path = os.path.join(os.fspath(folder), FILE_NAME)
        self.path = path
        self.writable = writable
        try:
            fd = os.open(path, (os.O_RDWR | os.O_CREAT) if writable else os.O_RDONLY, 0o600)
        except OSError as exc:
            raise StorageError(f"cold tier: cannot open the write generations at {path}: {exc}") from exc
        self._bump_lock = FileLock(path) if writable else None
        try:
            if writable:
                with self._bump_lock.held():
                    if os.fstat(fd).st_size < FILE_BYTES:
                        head = np.zeros(FIRST_SLOT_WORD, dtype="<u8")
                        head[0], head[1] = MAGIC, VERSION | (SLOTS << 32)
                        os.ftruncate(fd, FILE_BYTES)
                        os.pwrite(fd, head.tobytes(), 0)
            if os.fstat(fd).st_size < FILE_BYTES:
                raise StorageError(f"cold tier: the write generations at {path} are truncated: remove the file "
                                   "while no process has the store open")
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            self._mm = mmap.mmap(fd, FILE_BYTES, mmap.MAP_SHARED, prot)
        except BaseException:
            os.close(fd)
            if self._bump_lock is not None:
                self._bump_lock.close()
            raise
        self._fd = fd
        self._words = memoryview(self._mm).cast("Q")
        self._array = np.frombuffer(self._mm, dtype="<u8")
        if self._words[0] != MAGIC or self._words[1] != VERSION | (SLOTS << 32):
            self.close()
            raise StorageError(f"cold tier: {path} is not a generations file of this version: remove it while no "
                               "process has the store open (every process then starts from a fresh count)")

    @property
    def words(self) -> memoryview:
        """The counters as u64 words (the layout above), for a reader that compares many of them in a few loads
        (certificates.py); never written through."""
        return self._words

    @property
    def slot_words(self) -> np.ndarray:
        """The slot generations, (SLOTS,) u64 (words FIRST_SLOT_WORD on); never written through."""
        return self._array[FIRST_SLOT_WORD:]

    # ---- reads: lock-free, one load each ----
    def writes(self) -> int:
        """The store's count of writes (word 8)."""
        return self._words[WORD_WRITES]

    def unplaced(self) -> int:
        """The count of writes whose namespaces were not known (word 9)."""
        return self._words[WORD_UNPLACED]

    def snapshot(self) -> Snapshot:
        """writes and unplaced first, then the slots: a slot copied later is never older than the writes read."""
        writes, unplaced = self.writes(), self.unplaced()
        return Snapshot(writes, unplaced, self._array[FIRST_SLOT_WORD:].copy())

    # ---- writes ----
    @contextmanager
    def _locked(self) -> Iterator[None]:
        if self._bump_lock is None:
            raise StorageError(f"cold tier: {self.path} is open read-only")
        with self._bump_lock.held():
            yield

    def bump(self, namespaces: Iterable[str] | None) -> Bump:
        """Counts one write that touched these namespaces (None: not known, so every slot is suspect)."""
        names = None if namespaces is None else tuple(sorted(set(namespaces)))
        slots = np.unique(np.array([slot_of(namespace_hash(ns)) for ns in names or ()], dtype=np.int64))
        words = self._words
        with self._locked():
            writes = words[WORD_WRITES]
            words[WORD_WRITES] = writes + 1
            unplaced = None
            if names is None:
                unplaced = words[WORD_UNPLACED]
                words[WORD_UNPLACED] = unplaced + 1
            before = self._array[FIRST_SLOT_WORD + slots].copy()
            self._array[FIRST_SLOT_WORD + slots] = before + np.uint64(1)
        return Bump(names, slots, before, int(writes), unplaced)

    def close(self) -> None:
        """Unmaps and closes the file; closing again does nothing."""
        if getattr(self, "_mm", None) is None:
            return
        self._words.release()
        del self._array
        self._mm.close()
        self._mm = None
        os.close(self._fd)
        if self._bump_lock is not None:
            self._bump_lock.close()


def open_generations(folder: str | os.PathLike, *, read_only: bool) -> WriteGenerations | None:
    """The store's counters; read-only where the store is, and None where the file does not exist and cannot be
    made (a read-only store that no writer of this version has opened yet: no hot tier can be certified)."""
    if not read_only:
        return WriteGenerations(folder)
    if not os.path.exists(os.path.join(os.fspath(folder), FILE_NAME)):
        return None
    return WriteGenerations(folder, writable=False)
