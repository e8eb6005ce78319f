"""ctypes mirror of native/include/tiered_recall/layout.h and client.h; tests/native/test_layout.py checks it against the
sidecar's JSON."""
from __future__ import annotations

import ctypes as C

MAGIC = 0x004C4C4143455254
LAYOUT_VERSION = 6
HEADER_BYTES = 1024
SLOT_HEADER_BYTES = 256
MESSAGE_BYTES = 160
MAX_CLIENTS = 1024
LATENCY_BUCKETS = 64
MAX_DIM = 8192
MAX_K = 256
AWAKE_AHEAD_MAX_NS = 50_000_000  # the furthest ahead of the sidecar's clock a client's awake_until_ns reaches
NAME_MAX = 200
SEGMENT_PREFIX = "tiered-recall."

DTYPE_F32 = 1
DTYPE_F16 = 2
BACKEND_CPU = 1
BACKEND_CUDA = 2
CODES_OFF = 0
CODES_INT8 = 1
CODES_ROW_ALIGN = 64  # a row's codes, dim rounded up to this many bytes ...
CODES_ROW_META_CPU = 12  # ... and its scale and bounds, on the CPU backend
CODES_ROW_META_CUDA = 8  # ... and on the CUDA backend


def code_bytes_a_row(dim: int, backend: str) -> int:
    """What the int8 codes of one hot row take beside it on `backend` ("cpu" or "cuda")."""
    meta = CODES_ROW_META_CUDA if backend == "cuda" else CODES_ROW_META_CPU
    return (dim + CODES_ROW_ALIGN - 1) // CODES_ROW_ALIGN * CODES_ROW_ALIGN + meta

SERVER_STARTING = 0
SERVER_READY = 1
SERVER_STOPPING = 2

SLOT_FREE = 0
SLOT_CLAIMED = 1
SLOT_REQUEST = 2
SLOT_BUSY = 3
SLOT_DONE = 4
SLOT_ABANDONED = 5

OP_PING = 1
OP_SEARCH = 2
OP_UPSERT = 3
OP_DELETE = 4
OP_CONTAINS = 5
OP_SET_TOTALS = 6
OP_CLEAR = 7
OP_LIST_IDS = 8
OP_MAX = 8
LIST_IDS_OFFSET = 8  # ids of a LIST_IDS reply start here, after the next cursor

FLAG_NS_FILTER = 1 << 0
FLAG_NORMALIZE = 1 << 1
FLAG_NO_TOUCH = 1 << 2

OK = 0
E_BAD_OPCODE = -1
E_BAD_K = -2
E_BAD_COUNT = -3
E_BAD_PAYLOAD = -4
E_NOT_FINITE = -5
E_FULL = -6
E_BAD_FLAGS = -7
E_NS_TABLE_FULL = -8
E_ZERO_VECTOR = -9
E_INTERNAL = -10

# Return codes of libtrclient's calls (client.h), not part of the segment.
CALL_OK = 0
CALL_TIMEOUT = 1
CALL_DEAD = 2
CALL_NO_SLOT = 3
CALL_TOO_LARGE = 4
CALL_NOT_READY = 5


def align64(n: int) -> int:
    """n rounded up to a multiple of 64 (TR_ALIGN64: every payload part starts on a cache line)."""
    return (n + 63) & ~63


def search_result_offset(count: int, dim: int) -> int:
    """Where a SEARCH reply starts in the payload, after `count` queries of `dim` float32."""
    return align64(count * dim * 4)


def upsert_vectors_offset(count: int) -> int:
    """Where an UPSERT's vectors start, after `count` ids, namespace hashes and created_at (8 bytes each)."""
    return align64(count * 24)


def upsert_reply_offset(count: int, dim: int) -> int:
    """Where an UPSERT reply (the evicted ids) starts, after the rows' vectors."""
    return align64(upsert_vectors_offset(count) + count * dim * 4)


def contains_reply_offset(count: int) -> int:
    """Where a CONTAINS reply (one byte per id) starts, after `count` ids."""
    return align64(count * 8)


class Header(C.Structure):
    """tr_header: the segment's fixed header (identity and geometry, liveness, doorbell, counters, latency
    histogram)."""

    _fields_ = [
        ("magic", C.c_uint64),
        ("layout_version", C.c_uint32),
        ("header_bytes", C.c_uint32),
        ("dim", C.c_uint32),
        ("dtype", C.c_uint32),
        ("backend", C.c_uint32),
        ("slot_count", C.c_uint32),
        ("capacity", C.c_uint64),
        ("segment_bytes", C.c_uint64),
        ("slot_bytes", C.c_uint32),
        ("slot_payload_bytes", C.c_uint32),
        ("max_k", C.c_uint32),
        ("max_upsert_rows", C.c_uint32),
        ("max_search_queries", C.c_uint32),
        ("ns_entries", C.c_uint32),
        ("clients_offset", C.c_uint64),
        ("ns_offset", C.c_uint64),
        ("slots_offset", C.c_uint64),
        ("codes", C.c_uint32),
        ("_reserved0", C.c_uint8 * 28),
        ("owner_pid", C.c_int32),
        ("owner_uid", C.c_uint32),
        ("state", C.c_uint32),
        ("_reserved1", C.c_uint32),
        ("started_ns", C.c_uint64),
        ("heartbeat_ns", C.c_uint64),
        ("_reserved2", C.c_uint8 * 32),
        ("doorbell", C.c_uint32),
        ("server_sleeping", C.c_uint32),
        ("busy_clients", C.c_uint32),
        ("cores", C.c_uint32),
        ("awake_until_ns", C.c_uint64),
        ("_reserved3", C.c_uint8 * 40),
        ("hot_rows", C.c_uint64),
        ("requests", C.c_uint64),
        ("searches", C.c_uint64),
        ("queries", C.c_uint64),
        ("upserted_rows", C.c_uint64),
        ("deleted_rows", C.c_uint64),
        ("evicted_rows", C.c_uint64),
        ("errors", C.c_uint64),
        ("reclaimed_slots", C.c_uint64),
        ("service_ns_total", C.c_uint64),
        ("search_ns_total", C.c_uint64),
        ("namespaces", C.c_uint64),
        ("code_scans", C.c_uint64),
        ("code_fallbacks", C.c_uint64),
        ("_reserved4", C.c_uint8 * 144),
        ("latency_hist", C.c_uint64 * LATENCY_BUCKETS),
    ]


class Slot(C.Structure):
    """tr_slot: one request slot's control block; its payload follows it."""

    _fields_ = [
        ("state", C.c_uint32),
        ("client_waiting", C.c_uint32),
        ("seq", C.c_uint32),
        ("reply_seq", C.c_uint32),
        ("owner_pid", C.c_int32),
        ("opcode", C.c_uint32),
        ("flags", C.c_uint32),
        ("k", C.c_uint32),
        ("count", C.c_uint32),
        ("status", C.c_int32),
        ("reply_count", C.c_uint32),
        ("_reserved0", C.c_uint32),
        ("ns_hash", C.c_uint64),
        ("claimed_ns", C.c_uint64),
        ("service_ns", C.c_uint64),
        ("_reserved1", C.c_uint8 * 24),
        ("message", C.c_char * MESSAGE_BYTES),
    ]


class NsEntry(C.Structure):
    """tr_ns_entry: hot and total rows of one namespace hash (open addressing, 0 = empty)."""

    _fields_ = [
        ("ns_hash", C.c_uint64),
        ("hot_rows", C.c_uint64),
        ("total_rows", C.c_uint64),
        ("_reserved", C.c_uint64),
    ]


class ClientEntry(C.Structure):
    """tr_client_entry: the pid of one attached client (0 = free), and its activity (bumped at each operation on its
    store: the sidecar's sweep counts the entries that moved as busy clients)."""

    _fields_ = [("pid", C.c_int32), ("activity", C.c_uint32)]


class CallResult(C.Structure):
    """tr_call_result of client.h."""

    _fields_ = [
        ("status", C.c_int32),
        ("reply_count", C.c_uint32),
        ("service_ns", C.c_uint64),
        ("slot", C.c_uint32),
        ("_reserved", C.c_uint32),
        ("message", C.c_char * MESSAGE_BYTES),
    ]


class SearchCall(C.Structure):
    """tr_search_call of client.h: one search, passed to tr_client_search by one pointer."""

    _fields_ = [
        ("base", C.c_void_p),
        ("queries", C.c_void_p),
        ("ids", C.c_void_p),
        ("scores", C.c_void_p),
        ("result", C.c_void_p),
        ("timeout_ns", C.c_int64),
        ("spin_ns", C.c_int64),
        ("yield_ns", C.c_int64),
        ("ns_hash", C.c_uint64),
        ("pid", C.c_int32),
        ("flags", C.c_uint32),
        ("k", C.c_uint32),
        ("nq", C.c_uint32),
    ]


STRUCTS = {"tr_header": Header, "tr_slot": Slot, "tr_ns_entry": NsEntry, "tr_client_entry": ClientEntry,
           "tr_call_result": CallResult, "tr_search_call": SearchCall}

# Constant names as the C header spells them, for the mirror test.
CONSTANTS = {
    "TR_HEADER_BYTES": HEADER_BYTES, "TR_SLOT_HEADER_BYTES": SLOT_HEADER_BYTES,
    "TR_MESSAGE_BYTES": MESSAGE_BYTES, "TR_MAX_CLIENTS": MAX_CLIENTS,
    "TR_LATENCY_BUCKETS": LATENCY_BUCKETS, "TR_MAX_DIM": MAX_DIM, "TR_MAX_K": MAX_K,
    "TR_AWAKE_AHEAD_MAX_NS": AWAKE_AHEAD_MAX_NS,
    "TR_NAME_MAX": NAME_MAX, "TR_DTYPE_F32": DTYPE_F32, "TR_DTYPE_F16": DTYPE_F16,
    "TR_BACKEND_CPU": BACKEND_CPU, "TR_BACKEND_CUDA": BACKEND_CUDA,
    "TR_CODES_OFF": CODES_OFF, "TR_CODES_INT8": CODES_INT8, "TR_CODES_ROW_ALIGN": CODES_ROW_ALIGN,
    "TR_CODES_ROW_META_CPU": CODES_ROW_META_CPU, "TR_CODES_ROW_META_CUDA": CODES_ROW_META_CUDA,
    "TR_SERVER_STARTING": SERVER_STARTING, "TR_SERVER_READY": SERVER_READY,
    "TR_SERVER_STOPPING": SERVER_STOPPING, "TR_SLOT_FREE": SLOT_FREE,
    "TR_SLOT_CLAIMED": SLOT_CLAIMED, "TR_SLOT_REQUEST": SLOT_REQUEST, "TR_SLOT_BUSY": SLOT_BUSY,
    "TR_SLOT_DONE": SLOT_DONE, "TR_SLOT_ABANDONED": SLOT_ABANDONED, "TR_OP_PING": OP_PING,
    "TR_OP_SEARCH": OP_SEARCH, "TR_OP_UPSERT": OP_UPSERT, "TR_OP_DELETE": OP_DELETE,
    "TR_OP_CONTAINS": OP_CONTAINS, "TR_OP_SET_TOTALS": OP_SET_TOTALS, "TR_OP_CLEAR": OP_CLEAR,
    "TR_OP_LIST_IDS": OP_LIST_IDS, "TR_LIST_IDS_OFFSET": LIST_IDS_OFFSET, "TR_OP_MAX": OP_MAX,
    "TR_FLAG_NS_FILTER": FLAG_NS_FILTER, "TR_FLAG_NORMALIZE": FLAG_NORMALIZE,
    "TR_FLAG_NO_TOUCH": FLAG_NO_TOUCH, "TR_OK": OK, "TR_E_BAD_OPCODE": E_BAD_OPCODE,
    "TR_E_BAD_K": E_BAD_K, "TR_E_BAD_COUNT": E_BAD_COUNT, "TR_E_BAD_PAYLOAD": E_BAD_PAYLOAD,
    "TR_E_NOT_FINITE": E_NOT_FINITE, "TR_E_FULL": E_FULL, "TR_E_BAD_FLAGS": E_BAD_FLAGS,
    "TR_E_NS_TABLE_FULL": E_NS_TABLE_FULL, "TR_E_ZERO_VECTOR": E_ZERO_VECTOR,
    "TR_E_INTERNAL": E_INTERNAL, "TR_CALL_OK": CALL_OK, "TR_CALL_TIMEOUT": CALL_TIMEOUT, "TR_CALL_DEAD": CALL_DEAD,
    "TR_CALL_NO_SLOT": CALL_NO_SLOT, "TR_CALL_TOO_LARGE": CALL_TOO_LARGE, "TR_CALL_NOT_READY": CALL_NOT_READY,
}
