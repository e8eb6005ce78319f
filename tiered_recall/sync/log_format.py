"""The write-ahead log's format, which its writer (the cold tier) and its readers (both tiers) share: the files of
its generations, their headers, the records (logged adds, deletes and notes, each carrying the write generations it
bumped), and log positions kept in shared words.

- Files <folder>/<gen, 16 digits>.wal, one generation current (the highest). Each starts with a header: the
  generation, the one before it, and the LanceDB table versions just before (pre_version) and just after
  (base_version) the commit that moved the previous generation's records into the table, and where the records
  copied from the previous generation at its rotation came from ("carried"). Then records: [magic, length, crc32] +
  payload. storage/_wal.py says how the writer appends, flushes and rotates; log_follower.py how a reader follows.
- Records are logged adds (rows) and logged deletes (ids; a payload whose dim field is 0), in the order they were
  acknowledged, and two notes that change no rows: "changed" (a write that bypassed the log committed table version
  V: readers whose mirror is older reload) and "benign" (table versions a compaction or index build made, checked to
  keep every row).
"""
from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from .generations import Bump

FILE_MAGIC = b"TRWAL01\0"
# magic, gen, prev_gen, pre_version, base_version, carried_from, carried_len, crc32 of the fields before
_HEADER = struct.Struct("<8sQQqqQQI")
HEADER_SIZE = _HEADER.size
REC_MAGIC = b"TRR1"
_REC = struct.Struct("<4sII")  # magic, payload length, crc32 of the payload
_PAYLOAD_HEAD = struct.Struct("<II")  # rows, dim
_MAX_PAYLOAD = 1 << 30
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


def encode_metadata(metadata: dict | None) -> str:
    """A memory's metadata as the compact JSON text a record and the table keep (None: "{}"); ValueError or TypeError
    when it is not JSON (NaN and infinities included)."""
    return json.dumps({} if metadata is None else metadata, ensure_ascii=False, allow_nan=False,
                      separators=(",", ":"))


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


def pack_header(h: Header) -> bytes:
    """The bytes of a log generation's header (read_header's inverse), its checksum last."""
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


def log_path(folder: str, gen: int) -> str:
    """The file of generation `gen` of the log in `folder`."""
    return os.path.join(folder, f"{gen:016d}{SUFFIX}")


def log_generations(folder: str) -> list[int]:
    """The generations of the log in `folder` on disk, oldest first."""
    out = []
    for name in os.listdir(folder):
        if name.endswith(SUFFIX) and name[:-len(SUFFIX)].isdigit():
            out.append(int(name[:-len(SUFFIX)]))
    return sorted(out)


def record_end(offset: int, payload: bytes) -> int:
    """The offset just past a record whose payload starts after its head at `offset`."""
    return offset + _REC.size + len(payload)
