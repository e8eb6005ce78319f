"""The cross-tier consistency protocol, shared by the cold tier (which writes) and the coordinator (which keeps the
hot tier exact): write generations, the write-ahead log's format and its followers, the certificates of the hot
tier, the group commit of its side of writes, and the one file lock they all take (docs/skip-rules.md)."""
from .certificates import WHOLE_STORE, HotCertificates, Token, repair
from .file_lock import FileLock, exclusive, lock_held
from .generations import Bump, Snapshot, WriteGenerations, open_generations, slot_of
from .group_commit import LATECOMER_ROUNDS, HotSide, LoggedWrites, NewestRows
from .log_follower import LogFollower
from .log_format import HEADER_SIZE, Deleted, Header, Note, Rows, RowsDraft, decode_record, decode_rows, \
    encode_delete, encode_metadata, encode_note, encode_rows, log_generations, log_path, pack_header, parse_records, \
    read_all, read_header, read_position, write_position
from .write_lock import StoreWriteLock

__all__ = [
    "Bump", "Deleted", "FileLock", "HEADER_SIZE", "Header", "HotCertificates", "HotSide", "LATECOMER_ROUNDS",
    "LogFollower", "LoggedWrites", "NewestRows", "Note", "Rows", "RowsDraft", "Snapshot", "StoreWriteLock", "Token",
    "WHOLE_STORE", "WriteGenerations", "decode_record", "decode_rows", "encode_delete", "encode_metadata",
    "encode_note", "encode_rows", "exclusive", "lock_held", "log_generations", "log_path", "open_generations",
    "pack_header", "parse_records", "read_all", "read_header", "read_position", "repair", "slot_of",
    "write_position",
]
