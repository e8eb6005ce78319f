"""Write-ahead log of the cold tier: adds are durable once fsynced here; a flusher moves them into LanceDB in batches."""
from __future__ import annotations

import fcntl
import json
import mmap
import os
import struct
import threading
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ._generations import Bump

# How the log works (_writer.py appends and flushes, _follower.py reads; docs/cold-tier.md tells it in prose):
# - Files _wal/<gen>.wal, one generation current (the highest). Each starts with a header: the generation, the one
#   before it, and the LanceDB table versions just before (pre_version) and just after (base_version) the commit
#   that moved the previous generation's records into the table. Then records: [magic, length, crc32] + payload.
# - Two cross-process locks (flock, plus a mutex for the threads of one process), taken in this order:
#   the flush lock (.flush.lock) for a whole flush and for every LanceDB write that changes rows; the append lock
#   (.lock) for appends, for a flush's look at the log and its rotation, and for the whole of a write that bypasses
#   the log (delete, large add). Such a write flushes the log first and runs while it is empty, so records in a
#   generation are always newer than every row change committed since that generation began (a flush of its own
#   records aside). A reader loading table version V applies the records of the newest generation whose
#   base_version <= V and of all later ones, and has a consistent view without taking any lock.
# - Records are logged adds (rows) and logged deletes (ids; a payload whose dim field is 0), in the order they were
#   acknowledged. A flush commits the last operation of each id (delete, or upsert of its newest row), so a delete
#   reaches every process through the log like an add, and a row deleted after it was logged never comes back.
#   Two notes change no rows and are skipped by a flush (which still rotates them away): "changed" (a write that
#   bypassed the log committed table version V: readers whose mirror is older reload) and "benign" (table versions
#   a compaction or index build made, checked to keep every row: readers need not check them again). The versions
#   in (pre_version, base_version] of a header are the flush's own commits and compactions (direct writes wait for
#   the flush lock), so a reader that applied the generation's records knows every one of them.
# - A flush takes the records present (up to offset E), commits them (upsert by id: replay is idempotent) while
#   appends go on, then rotates: the new generation starts with a copy of the records appended since E ("carried";
#   the header says E and how many bytes), so no record is ever only in a file that is no longer current. Killed
#   before the rotation, the records are flushed again by the next flusher; killed mid-append, the torn record (bad
#   checksum or short) was never acknowledged and is cut off by the next writer.
# - Old generations stay a while (readers that fell behind follow them), then are deleted oldest first.

FILE_MAGIC = b"TRWAL01\0"
# magic, gen, prev_gen, pre_version, base_version, carried_from, carried_len, crc32 of the fields before
_HEADER = struct.Struct("<8sQQqqQQI")
HEADER_SIZE = _HEADER.size
REC_MAGIC = b"TRR1"
_REC = struct.Struct("<4sII")  # magic, payload length, crc32 of the payload
_PAYLOAD_HEAD = struct.Struct("<II")  # rows, dim
_MAX_PAYLOAD = 1 << 30
LOCK_NAME = ".lock"
FLUSH_LOCK_NAME = ".flush.lock"
SYNC_LOCK_NAME = ".sync.lock"  # its first two words hold the (generation, offset) made durable; the lock, their moves
SUFFIX = ".wal"


@dataclass(frozen=True)
class Header:
    """The header of one log generation: its number, the one before, and the table versions around the commit of the
    previous generation's records (see the notes above)."""

    gen: int
    prev_gen: int
    pre_version: int  # table version just before the commit of prev_gen's records (-1: none)
    base_version: int  # table version holding every record of the generations before this one (-1: none yet)
    carried_from: int = 0  # offset in prev_gen where the records copied to the start of this one began
    carried_len: int = 0  # bytes of those records (prev_gen's records past carried_from, appended during the flush)


@dataclass
class Rows:
    """One logged add: (n,) ids/created_at_us, (n, dim) vectors, n-lists of the text columns."""
    ids: np.ndarray
    vectors: np.ndarray
    created_at_us: np.ndarray
    namespaces: list
    sessions: list
    roles: list
    texts: list
    metadata_json: list
    bump: Bump | None = field(default=None, compare=False)  # the write generations it bumped (None: not logged)
    gen: int = field(default=0, compare=False)  # where the follower read it (LogFollower.poll sets these)
    offset: int = field(default=0, compare=False)
    end: int = field(default=0, compare=False)


@dataclass
class Deleted:
    """One logged delete: (n,) ids."""
    ids: np.ndarray
    bump: Bump | None = field(default=None, compare=False)
    gen: int = field(default=0, compare=False)
    offset: int = field(default=0, compare=False)
    end: int = field(default=0, compare=False)


@dataclass
class Note:
    """A record that changes no rows: kind "changed" (versions: [the table version a direct write committed]) or
    "benign" (versions a compaction or index build made that keep every row)."""
    kind: str
    versions: np.ndarray
    gen: int = field(default=0, compare=False)
    offset: int = field(default=0, compare=False)
    end: int = field(default=0, compare=False)


# The dim field of the payload head tells the record kinds apart (rows always have dim >= 1); an older reader
# fails loudly on the others (a short buffer) instead of taking them for a torn tail and cutting them off.
_DIM_DELETE = 0
_DIM_NOTES = {"changed": 0xFFFFFFFF, "benign": 0xFFFFFFFE}
_NOTE_OF_DIM = {v: k for k, v in _DIM_NOTES.items()}


def _encode_ids(values: np.ndarray, dim: int, trailer: bytes = b"") -> bytes:
    values = np.ascontiguousarray(values, "<i8")
    payload = _PAYLOAD_HEAD.pack(int(values.shape[0]), dim) + values.tobytes() + trailer
    return _REC.pack(REC_MAGIC, len(payload), zlib.crc32(payload)) + payload


def _json_bytes(value) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def encode_delete(ids: np.ndarray, bump: Bump | None = None) -> bytes:
    """A logged delete of ids as one record (magic, length, crc32, payload); the write generations it bumped, when
    given, follow the ids as JSON (a process that applies the log to the hot tier certifies with them)."""
    return _encode_ids(ids, _DIM_DELETE, b"" if bump is None else _json_bytes(bump.fields()))


def encode_note(kind: str, versions) -> bytes:
    """A note of `kind` ("changed" or "benign") over table versions as one record."""
    return _encode_ids(np.asarray(versions, np.int64).reshape(-1), _DIM_NOTES[kind])


def decode_record(payload: bytes) -> "Rows | Deleted | Note":
    """The Rows, Deleted or Note a record's payload holds (told apart by its dim field)."""
    n, dim = _PAYLOAD_HEAD.unpack_from(payload, 0)
    if dim == _DIM_DELETE or dim in _NOTE_OF_DIM:
        values = np.frombuffer(payload, "<i8", n, _PAYLOAD_HEAD.size).astype(np.int64)
        if dim != _DIM_DELETE:
            return Note(_NOTE_OF_DIM[dim], values)
        trailer = payload[_PAYLOAD_HEAD.size + 8 * n:]
        return Deleted(values, Bump.of_fields(json.loads(trailer.decode("utf-8"))) if trailer else None)
    return decode_rows(payload)


def lock_held(fd: int) -> bool:
    """Whether some thread or process holds an exclusive flock on the file `fd` is open on (`fd` must be an open
    file of its own, not the one the holder locks through). A shared lock is taken and dropped at once."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def encode_rows(rows: Rows) -> bytes:
    """A logged add as one record: ids, created_at_us and vectors as little-endian arrays, then the text columns as
    JSON, and after them the write generations the add bumped (when it did)."""
    return RowsDraft(rows).record(rows.bump)


class RowsDraft:
    """A logged add encoded up to its bump, which is known only under the append lock: record(bump) then costs a
    short JSON list and one crc32, so the writer encodes the rows before it takes the lock (encode_rows' format)."""

    def __init__(self, rows: Rows) -> None:
        n, dim = rows.vectors.shape
        columns = _json_bytes([rows.namespaces, rows.sessions, rows.roles, rows.texts, rows.metadata_json])
        self._head = b"".join([_PAYLOAD_HEAD.pack(n, dim), np.ascontiguousarray(rows.ids, "<i8").tobytes(),
                               np.ascontiguousarray(rows.created_at_us, "<i8").tobytes(),
                               np.ascontiguousarray(rows.vectors, "<f4").tobytes(), columns[:-1]])  # without its "]"
        self._head_crc = zlib.crc32(self._head)

    def record(self, bump: Bump | None) -> bytes:
        """The whole record, with `bump` (None: the add bumped nothing) as the JSON list's last item."""
        tail = b"]" if bump is None else b"," + _json_bytes(bump.fields()) + b"]"
        length = len(self._head) + len(tail)
        return b"".join([_REC.pack(REC_MAGIC, length, zlib.crc32(tail, self._head_crc)), self._head, tail])


def decode_rows(payload: bytes) -> Rows:
    """The Rows of an add record's payload (encode_rows' inverse)."""
    n, dim = _PAYLOAD_HEAD.unpack_from(payload, 0)
    at = _PAYLOAD_HEAD.size
    ids = np.frombuffer(payload, "<i8", n, at).astype(np.int64)
    at += 8 * n
    created = np.frombuffer(payload, "<i8", n, at).astype(np.int64)
    at += 8 * n
    vectors = np.frombuffer(payload, "<f4", n * dim, at).astype(np.float32).reshape(n, dim)
    at += 4 * n * dim
    columns = json.loads(payload[at:].decode("utf-8"))
    bump = Bump.of_fields(columns[5]) if len(columns) > 5 else None
    return Rows(ids, vectors, created, *columns[:5], bump=bump)


def read_position(words: memoryview, at: int) -> tuple[int, int]:
    """A log position (generation, offset) kept in two words of a shared mapping (words[at], words[at + 1]), read
    without a lock: generation, offset, generation again (aligned 8-byte loads), so a pair torn by a move to a new
    generation is never taken; (0, 0) when no pair holds still. write_position writes the offset first."""
    for _ in range(8):
        gen = words[at]
        offset = words[at + 1]
        if words[at] == gen:
            return gen, offset
    return 0, 0


def write_position(words: memoryview, at: int, position: tuple[int, int]) -> None:
    """Stores a position for read_position (one writer at a time): the offset first, so a reader that sees the new
    offset with the old generation reads a position lower than either, never higher."""
    words[at + 1] = int(position[1])
    words[at] = int(position[0])


def parse_records(data: bytes, base: int) -> tuple[list[tuple[int, bytes]], int]:
    """Whole, intact records at the front of `data` (read from file offset `base`): [(offset, payload)], and the
    offset just past the last one. Stops at the first short or corrupt record (a torn tail, or one being written)."""
    out = []
    at = 0
    view = memoryview(data)
    while at + _REC.size <= len(data):
        magic, length, crc = _REC.unpack_from(data, at)
        end = at + _REC.size + length
        if magic != REC_MAGIC or length > _MAX_PAYLOAD or end > len(data):
            break
        payload = bytes(view[at + _REC.size:end])
        if zlib.crc32(payload) != crc:
            break
        out.append((base + at, payload))
        at = end
    return out, base + at


def read_header(fd: int) -> Header:
    """The Header at the start of the log file fd is open on; ValueError when it is short or fails its checksum."""
    raw = os.pread(fd, HEADER_SIZE, 0)
    if len(raw) != HEADER_SIZE:
        raise ValueError("short log header")
    magic, gen, prev_gen, pre, base, carried_from, carried_len, crc = _HEADER.unpack(raw)
    if magic != FILE_MAGIC or zlib.crc32(raw[:-4]) != crc:
        raise ValueError("bad log header")
    return Header(gen, prev_gen, pre, base, carried_from, carried_len)


def _pack_header(h: Header) -> bytes:
    raw = _HEADER.pack(FILE_MAGIC, h.gen, h.prev_gen, h.pre_version, h.base_version, h.carried_from,
                       h.carried_len, 0)[:-4]
    return raw + struct.pack("<I", zlib.crc32(raw))


def read_all(fd: int, start: int) -> bytes:
    """The bytes of the file fd is open on from offset `start` to its current end."""
    size = os.fstat(fd).st_size
    if size <= start:
        return b""
    chunks = []
    at = start
    while at < size:
        chunk = os.pread(fd, min(size - at, 64 << 20), at)
        if not chunk:
            break
        chunks.append(chunk)
        at += len(chunk)
    return b"".join(chunks)


class _FileLock:
    """An exclusive flock on one file, across processes and threads, re-entrant within a thread: the first
    entry takes the flock, the last exit drops it."""

    def __init__(self, path: str) -> None:
        self.mutex = threading.RLock()
        self._depth = 0
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    @property
    def fd(self) -> int:
        return self._fd

    @contextmanager
    def held(self, *, wait: bool = True) -> Iterator[bool]:
        """Holds the lock for the with block, yielding True; with wait=False yields False at once when another
        process or thread holds it."""
        if not self.mutex.acquire(blocking=wait):
            yield False
            return
        try:
            self._depth += 1
            try:
                if self._depth == 1:
                    try:
                        fcntl.flock(self._fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        yield False
                        return
                try:
                    yield True
                finally:
                    if self._depth == 1:
                        fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                self._depth -= 1
        finally:
            self.mutex.release()

    def close(self) -> None:
        os.close(self._fd)


class WriteAheadLog:
    """The log folder of one store, as seen by one process: the writer side (under `locked()`) and file helpers."""

    def __init__(self, folder: str, *, retention_s: float = 120.0, keep_generations: int = 8, read_only: bool = False):
        self.folder = folder
        self.retention_s = retention_s
        self.keep_generations = keep_generations
        self.read_only = read_only
        self._wfd: int | None = None
        self._wgen = 0
        self._wend = 0  # end of the last intact record of the current generation (valid under the lock)
        self._closed = False
        self._append_lock = self._flush_lock = self._sync_lock = None
        self._flush_probe_fd: int | None = None
        probe = os.path.join(folder, FLUSH_LOCK_NAME)
        if read_only:  # a follower only: no lock files are made, nothing is appended, flushed or pruned
            if os.path.exists(probe):
                self._flush_probe_fd = os.open(probe, os.O_RDONLY)
            return
        os.makedirs(folder, mode=0o700, exist_ok=True)
        self._append_lock = _FileLock(os.path.join(folder, LOCK_NAME))
        self._flush_lock = _FileLock(probe)
        self._sync_lock = _FileLock(os.path.join(folder, SYNC_LOCK_NAME))
        if os.fstat(self._sync_lock.fd).st_size < mmap.PAGESIZE:
            os.ftruncate(self._sync_lock.fd, mmap.PAGESIZE)
        self._synced_map = mmap.mmap(self._sync_lock.fd, mmap.PAGESIZE)
        self._synced_words = memoryview(self._synced_map).cast("Q")
        self._flush_probe_fd = os.open(probe, os.O_RDWR)  # for flush_in_progress()
        with self.locked():
            if not self.generations():
                self._write_generation(Header(1, 0, -1, -1))

    # ---- files ----------------------------------------------------------------------------------
    def path_of(self, gen: int) -> str:
        """The file of generation `gen` (<folder>/<gen, 16 digits>.wal)."""
        return os.path.join(self.folder, f"{gen:016d}{SUFFIX}")

    def generations(self) -> list[int]:
        """The generations on disk, oldest first."""
        out = []
        for name in os.listdir(self.folder):
            if name.endswith(SUFFIX) and name[:-len(SUFFIX)].isdigit():
                out.append(int(name[:-len(SUFFIX)]))
        return sorted(out)

    def open_gen(self, gen: int) -> int:
        """A read-only fd on generation `gen` (FileNotFoundError once it was deleted)."""
        return os.open(self.path_of(gen), os.O_RDONLY)

    def _write_generation(self, header: Header, carried: bytes = b"") -> None:
        tmp = os.path.join(self.folder, f".{header.gen:016d}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            data = _pack_header(header) + carried
            if os.write(fd, data) != len(data):
                raise OSError(28, "No space left on device: short write of a new log generation")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, self.path_of(header.gen))
        dfd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    # ---- the lock -------------------------------------------------------------------------------
    def flushing(self):
        """The flush lock: exclusive across processes and threads (re-entrant); take it before locked()."""
        if self._flush_lock is None:
            raise RuntimeError("a read-only log takes no locks: nothing may write through it")
        return self._flush_lock.held()

    def locked(self):
        """The append lock: exclusive across processes and threads (re-entrant within one thread)."""
        if self._append_lock is None:
            raise RuntimeError("a read-only log takes no locks: nothing may write through it")
        return self._append_lock.held()

    def _refresh_locked(self) -> None:
        """Point the writer at the current generation and cut a torn tail left by a writer that died."""
        if self._wfd is not None and not os.path.exists(self.path_of(self._wgen + 1)):
            current = self._wgen
        else:
            gens = self.generations()
            current = gens[-1]
            if self._wfd is not None:
                os.close(self._wfd)
            self._wfd = os.open(self.path_of(current), os.O_RDWR)
            self._wgen = current
            self._wend = HEADER_SIZE
        size = os.fstat(self._wfd).st_size
        if size != self._wend:
            _, end = parse_records(read_all(self._wfd, self._wend), self._wend)
            self._wend = end
            if size > end:  # bytes past the last intact record: a dead writer's unacknowledged add
                os.ftruncate(self._wfd, end)
                os.fsync(self._wfd)

    # ---- writer side (call under locked()) ------------------------------------------------------
    def append(self, record: bytes) -> tuple[int, int]:
        """Append one encoded record and make it durable (fdatasync) before returning; returns the (generation,
        offset) just past it."""
        end, fd = self.write(record)
        try:
            self.sync(fd)  # under the append lock: no record after this one to share the sync with
        finally:
            os.close(fd)
        return end

    def write(self, record: bytes) -> tuple[tuple[int, int], int]:
        """Append one encoded record, not yet durable: ((generation, offset) just past it, an fd of its own on the
        generation for sync(), which the caller closes). Group commit: the caller syncs after it lets go of the
        lock, so one fdatasync makes every record written before it durable, and the writers waiting for the lock
        meanwhile append theirs."""
        self._refresh_locked()
        try:
            written = os.pwrite(self._wfd, record, self._wend)
            if written != len(record):
                raise OSError(28, f"No space left on device: short write to the log ({written} of {len(record)} bytes)")
        except BaseException:
            try:  # not acknowledged, so not kept: a later flush must not commit it
                os.ftruncate(self._wfd, self._wend)
            except OSError:
                pass  # the next writer cuts it (a short record fails its checksum)
            raise
        self._wend += len(record)
        return (self._wgen, self._wend), os.dup(self._wfd)

    def sync(self, fd: int, end: tuple[int, int] | None = None) -> None:
        """Makes what was written to the log file fd is open on durable, up to `end` at least (fdatasync). Group
        commit across processes: an fdatasync covers every record written to the file before it began, and a writer
        whose record an earlier one covered returns without its own (the sync lock file holds the position made
        durable: a hint, so it is not synced itself). The fdatasync takes no lock: a writer descheduled while it
        held one would make every other writer wait for a core (the kernel merges concurrent fdatasyncs of a file);
        the sync lock covers only the move of the position, and a writer that finds it taken leaves the position to
        the holder (a later writer then syncs once more than it had to)."""
        if end is None or self._sync_lock is None:
            os.fdatasync(fd)
            return
        if self._synced() >= tuple(end):
            return
        covered = (end[0], os.fstat(fd).st_size)  # written before the fdatasync begins: durable when it returns
        os.fdatasync(fd)
        with self._sync_lock.held(wait=False) as got:
            if got and self._synced() < covered:  # never moved back: the position only grows
                write_position(self._synced_words, 0, covered)

    def _synced(self) -> tuple[int, int]:
        """The (generation, offset) up to which the log is known to be durable (the sync lock file's first two
        words, mapped)."""
        return read_position(self._synced_words, 0)

    def end_locked(self) -> tuple[int, int]:
        """The (generation, offset) past the last intact record (call under locked())."""
        self._refresh_locked()
        return self._wgen, self._wend

    def pending(self) -> tuple[int, list[tuple[int, bytes]], int]:
        """The current generation, its intact records and the offset past them (for a flush)."""
        self._refresh_locked()
        records, end = parse_records(read_all(self._wfd, HEADER_SIZE), HEADER_SIZE)
        return self._wgen, records, end

    def has_pending_locked(self) -> bool:
        """True when the current generation holds a record (call under locked())."""
        self._refresh_locked()
        return self._wend > HEADER_SIZE

    def rotate(self, gen: int, flushed_to: int, pre_version: int, base_version: int) -> Header:
        """Start a new generation after generation `gen`'s records up to offset `flushed_to` were committed at
        `base_version`; the records appended past `flushed_to` meanwhile are copied to its start."""
        self._refresh_locked()
        if self._wgen != gen or self._wend < flushed_to:
            raise RuntimeError(f"log generation {gen} changed during its flush (now {self._wgen}); another flusher "
                               "ran without the flush lock")
        carried = os.pread(self._wfd, self._wend - flushed_to, flushed_to) if self._wend > flushed_to else b""
        header = Header(gen + 1, gen, int(pre_version), int(base_version), int(flushed_to), len(carried))
        self._write_generation(header, carried)
        self._refresh_locked()
        self._prune_locked()
        os.utime(self._flush_probe_fd)  # seconds_since_flush(), for every process
        return header

    def _prune_locked(self) -> None:
        gens = self.generations()
        old = gens[:-self.keep_generations] if len(gens) > self.keep_generations else []
        now = time.time()
        for gen in old:  # oldest first: a reader still holding a file finds every later one present
            path = self.path_of(gen)
            try:
                if now - os.stat(path).st_mtime < self.retention_s:
                    break
                os.unlink(path)
            except FileNotFoundError:
                continue

    # ---- reader helpers (no lock) ---------------------------------------------------------------
    def pending_bytes(self) -> int:
        """Bytes of records in the current generation (a cheap, lock-free look: 0 means nothing to flush)."""
        gens = self.generations()
        try:
            return max(0, os.stat(self.path_of(gens[-1])).st_size - HEADER_SIZE)
        except (FileNotFoundError, IndexError):
            return 0

    def seconds_since_flush(self) -> float:
        """Seconds since any process last rotated the log after a flush (the flush lock file's time); large when not
        known."""
        try:
            return time.time() - os.fstat(self._flush_probe_fd).st_mtime
        except (OSError, TypeError):
            return float("inf")

    def flush_in_progress(self) -> bool:
        """Whether a flush or a write that bypasses the log holds the flush lock now (this process's included)."""
        return self._flush_probe_fd is not None and lock_held(self._flush_probe_fd)

    def close(self) -> None:
        """Closes the log's files and locks; closing again does nothing."""
        if self._closed:
            return
        self._closed = True
        if self._flush_probe_fd is not None:
            os.close(self._flush_probe_fd)
        if self._append_lock is None:
            return
        with self._append_lock.mutex:
            if self._wfd is not None:
                os.close(self._wfd)
                self._wfd = None
            self._append_lock.close()
            self._flush_lock.close()
            self._synced_words.release()
            self._synced_map.close()
            self._sync_lock.close()


class LogFollower:
    """One process's read position in the log: new records and generation changes, in order, without the lock."""

    def __init__(self, wal: WriteAheadLog):
        self.wal = wal
        self.gen = 0
        self.fd: int | None = None
        self.offset = 0
        self._paths = (0, "", "")  # (gen, its file, the next generation's file): built once per generation

    def _files(self) -> tuple[str, str]:
        """The files of the generation being read and of the next one (a poll looks at both)."""
        if self._paths[0] != self.gen:
            self._paths = (self.gen, self.wal.path_of(self.gen), self.wal.path_of(self.gen + 1))
        return self._paths[1], self._paths[2]

    def close(self) -> None:
        """Closes the fd of the generation being read (start_at opens one again)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def start_at(self, gen: int) -> Header:
        """Position at the first record of `gen` (FileNotFoundError when that generation was deleted)."""
        fd = self.wal.open_gen(gen)
        try:
            header = read_header(fd)
        except Exception:
            os.close(fd)
            raise
        self.close()
        self.fd, self.gen, self.offset = fd, gen, HEADER_SIZE
        return header

    def seek(self, gen: int, offset: int) -> None:
        """Position at `offset` of generation `gen`, a record boundary (FileNotFoundError once it was deleted)."""
        if gen != self.gen or self.fd is None:
            self.start_at(gen)
        self.offset = max(int(offset), HEADER_SIZE)

    @property
    def position(self) -> tuple[int, int]:
        """(generation, offset) of the next record this follower reads."""
        return self.gen, self.offset

    def bytes_between(self, start: tuple[int, int], end: tuple[int, int]) -> float:
        """Bytes of records a follower at `start` reads before it reaches `end` (both record boundaries): the rest
        of start's generation and the records of the next one up to `end`, less the ones carried into it, which were
        read once already. Infinite when `end` lies more than one generation later, or a header it needs is gone."""
        if end[0] == start[0]:
            return float(max(0, end[1] - start[1]))
        if end[0] != start[0] + 1:
            return float("inf")
        try:
            fd = self.wal.open_gen(end[0])
        except FileNotFoundError:
            return float("inf")
        try:
            header = read_header(fd)
        except (OSError, ValueError):  # a header cut short or damaged: the follower's poll reports it
            return float("inf")
        finally:
            os.close(fd)
        # start's generation ends at carried_from + carried_len, and the next one begins with those carried_len bytes
        # again: (carried_from + carried_len - start) + (end - HEADER_SIZE - carried_len)
        return float(max(0, header.carried_from - start[1] + end[1] - HEADER_SIZE))

    def has_more(self) -> bool:
        """True when the log holds records past this position, or a later generation (a cheap look: no read);
        False before the follower was positioned."""
        if self.fd is None:
            return False
        return os.fstat(self.fd).st_size > self.offset or os.path.exists(self._files()[1])

    def poll(self) -> list:
        """Events since the last poll: ("rows", Rows), ("deleted", Deleted) or ("note", Note) for each new record (with
        the generation and offset it was read at), ("rotated", Header) when a new generation begins, ("gap", None) when generations
        were deleted before this process read them (reload from LanceDB)."""
        events: list = []
        while True:
            # Look for the next generation before reading: once it exists this one takes no more appends, so the
            # read below then gets all of it (a torn tail is a dead writer's garbage and was not flushed either).
            current, following = self._files()
            rotated = os.path.exists(following)
            if os.fstat(self.fd).st_size > self.offset:
                records, self.offset = parse_records(read_all(self.fd, self.offset), self.offset)
                for at, p in records:
                    rec = decode_record(p)
                    rec.gen, rec.offset, rec.end = self.gen, at, at + _REC.size + len(p)
                    kind = "rows" if isinstance(rec, Rows) else "deleted" if isinstance(rec, Deleted) else "note"
                    events.append((kind, rec))
            if not rotated:
                if not os.path.exists(current):
                    events.append(("gap", None))  # ours and (oldest first) every later one were deleted
                return events
            ended_at = self.offset
            try:
                header = self.start_at(self.gen + 1)
            except FileNotFoundError:
                events.append(("gap", None))
                return events
            if ended_at != header.carried_from + header.carried_len:
                events.append(("gap", None))  # cannot line the copied records up with what was read: reload
                return events
            self.offset = HEADER_SIZE + header.carried_len  # those records were read from the previous generation
            events.append(("rotated", header))
