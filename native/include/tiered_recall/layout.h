/* The shared-memory layout of a tiered-recall hot-tier segment: the single source of truth.
 *
 * Everything a client and the sidecar agree on lives here once: magic, version, the header,
 * the request slots, the per-namespace table, opcodes, flags, states and error codes.
 * The Python mirror (tiered_recall/_layout.py) is checked against `tr-sidecar --print-layout`
 * by a test, so the two sides cannot drift.
 *
 * Segment (one file in /dev/shm, created O_EXCL, mode 0600):
 *
 *   offset 0                 tr_header            (TR_HEADER_BYTES, fixed)
 *   header.clients_offset    tr_client_entry[TR_MAX_CLIENTS]   attached client pids
 *   header.ns_offset         tr_ns_entry[ns_entries]           per-namespace hot/total rows
 *   header.slots_offset      slot_count x (tr_slot + payload)  the request ring
 *
 * Every offset is a multiple of 64 (a cache line). All integers are little-endian host order.
 */
#ifndef TIERED_RECALL_LAYOUT_H
#define TIERED_RECALL_LAYOUT_H

#include <stdint.h>
#include <stddef.h>

#ifdef __cplusplus
#define TR_STATIC_ASSERT static_assert
#else
#define TR_STATIC_ASSERT _Static_assert
#endif

/* "TRECALL\0" read as a little-endian u64. */
#define TR_MAGIC 0x004C4C4143455254ULL
/* Bump on any change to a struct, constant or payload formula below, or to libtrclient's call interface
 * (tiered_recall/client.h). */
#define TR_LAYOUT_VERSION 6u

#define TR_CACHELINE 64u
#define TR_HEADER_BYTES 1024u
#define TR_SLOT_HEADER_BYTES 256u
#define TR_MESSAGE_BYTES 160u
#define TR_MAX_CLIENTS 1024u
#define TR_LATENCY_BUCKETS 64u /* bucket b counts service times in [2^b, 2^(b+1)) ns */

#define TR_MAX_DIM 8192u
#define TR_MAX_K 256u
/* The furthest ahead (of the server's clock) a client's awake_until_ns keeps the server polling. */
#define TR_AWAKE_AHEAD_MAX_NS 50000000ull
#define TR_MIN_SLOT_PAYLOAD_BYTES (256u * 1024u)
#define TR_NAME_MAX 200u /* segment name characters after the prefix */
#define TR_SEGMENT_PREFIX "tiered-recall."

/* Element type of the hot vectors (clients always send float32). */
enum tr_dtype { TR_DTYPE_F32 = 1, TR_DTYPE_F16 = 2 };

/* Which backend serves the segment. */
enum tr_backend_kind { TR_BACKEND_CPU = 1, TR_BACKEND_CUDA = 2 };

/* header.codes: whether the backend keeps 8-bit codes beside the rows and scans them first (--codes), re-scoring
 * from the rows only those whose bound can reach the top k (docs/gpu-backend.md, docs/tuning.md). */
enum tr_codes { TR_CODES_OFF = 0, TR_CODES_INT8 = 1 };
/* What a hot row's codes take beside it, for a memory budget (TieredMemory(hot_capacity_bytes=...)): the codes, dim
 * rounded up to TR_CODES_ROW_ALIGN bytes, and the row's scale and bounds: three floats on the CPU (tr_code_row), two on
 * CUDA (the scale and bound_r, as a float2). */
#define TR_CODES_ROW_ALIGN 64
#define TR_CODES_ROW_META_CPU 12
#define TR_CODES_ROW_META_CUDA 8

/* header.state */
enum tr_server_state { TR_SERVER_STARTING = 0, TR_SERVER_READY = 1, TR_SERVER_STOPPING = 2 };

/* slot.state: FREE -> CLAIMED (client CAS) -> REQUEST (client, release) -> BUSY (server CAS)
 * -> DONE (server, release) -> FREE (client). A client that gives up on a BUSY slot marks it
 * ABANDONED; the server frees it once it has answered. */
enum tr_slot_state {
    TR_SLOT_FREE = 0,
    TR_SLOT_CLAIMED = 1,
    TR_SLOT_REQUEST = 2,
    TR_SLOT_BUSY = 3,
    TR_SLOT_DONE = 4,
    TR_SLOT_ABANDONED = 5,
};

/* slot.opcode. Payload formats (count = slot.count, d = header.dim, k = slot.k):
 *   PING      in: nothing.                                  out: nothing.
 *   SEARCH    in: f32 queries[count][d] at 0.               out: i64 ids[count][k] at
 *             TR_SEARCH_RESULT_OFFSET(count, d), then f32 scores[count][k]; reply_count = hits per
 *             query (min(k, matching rows)); best first, ties by smaller id.
 *   UPSERT    in: i64 ids[count] at 0, u64 ns[count] at 8*count, i64 created_at_us[count] at
 *             16*count, f32 vectors[count][d] at TR_UPSERT_VECTORS_OFFSET(count).
 *             out: i64 evicted_ids[reply_count] at TR_UPSERT_REPLY_OFFSET(count, d).
 *   DELETE    in: i64 ids[count] at 0.                      out: reply_count = rows deleted.
 *   CONTAINS  in: i64 ids[count] at 0.                      out: u8 present[count] at
 *             TR_CONTAINS_REPLY_OFFSET(count); reply_count = number present.
 *   SET_TOTALS in: u64 ns[count] at 0, u64 total_rows[count] at 8*count (total rows of each
 *             namespace over both tiers, as the coordinator knows it). out: nothing.
 *   CLEAR     in: nothing.                                  out: reply_count = rows removed.
 *   LIST_IDS  in: u64 cursor at 0 (a row position; 0 starts), count = the most ids wanted.
 *             out: u64 next cursor at 0 (>= hot rows: done), i64 ids[reply_count] at 8; with
 *             NS_FILTER only rows whose namespace hash == slot.ns_hash. Rows move when others
 *             are deleted, so a listing is exact only while no other request writes meanwhile.
 */
enum tr_opcode {
    TR_OP_PING = 1,
    TR_OP_SEARCH = 2,
    TR_OP_UPSERT = 3,
    TR_OP_DELETE = 4,
    TR_OP_CONTAINS = 5,
    TR_OP_SET_TOTALS = 6,
    TR_OP_CLEAR = 7,
    TR_OP_LIST_IDS = 8,
};
#define TR_OP_MAX 8u

/* slot.flags */
enum tr_flags {
    TR_FLAG_NS_FILTER = 1u << 0, /* SEARCH, LIST_IDS: only rows whose namespace hash == slot.ns_hash */
    TR_FLAG_NORMALIZE = 1u << 1, /* SEARCH/UPSERT: the sidecar unit-normalises the vectors */
    TR_FLAG_NO_TOUCH = 1u << 2,  /* SEARCH: do not refresh LRU recency of the rows returned */
};
#define TR_FLAGS_KNOWN (TR_FLAG_NS_FILTER | TR_FLAG_NORMALIZE | TR_FLAG_NO_TOUCH)

/* slot.status (reply). Negative is an error; slot.message says what and how to fix it. */
enum tr_status {
    TR_OK = 0,
    TR_E_BAD_OPCODE = -1,
    TR_E_BAD_K = -2,
    TR_E_BAD_COUNT = -3,
    TR_E_BAD_PAYLOAD = -4,
    TR_E_NOT_FINITE = -5,
    TR_E_FULL = -6,
    TR_E_BAD_FLAGS = -7,
    TR_E_NS_TABLE_FULL = -8,
    TR_E_ZERO_VECTOR = -9,
    TR_E_INTERNAL = -10,
};

/* Payload offsets, shared by both sides. */
#define TR_ALIGN64(x) ((((uint64_t)(x)) + 63u) & ~(uint64_t)63u)
#define TR_SEARCH_RESULT_OFFSET(count, dim) TR_ALIGN64((uint64_t)(count) * (dim) * 4u)
#define TR_SEARCH_BYTES(count, dim, k) \
    (TR_SEARCH_RESULT_OFFSET(count, dim) + (uint64_t)(count) * (k) * 12u)
#define TR_UPSERT_VECTORS_OFFSET(count) TR_ALIGN64((uint64_t)(count) * 24u)
#define TR_UPSERT_REPLY_OFFSET(count, dim) \
    TR_ALIGN64(TR_UPSERT_VECTORS_OFFSET(count) + (uint64_t)(count) * (dim) * 4u)
#define TR_UPSERT_BYTES(count, dim) (TR_UPSERT_REPLY_OFFSET(count, dim) + (uint64_t)(count) * 8u)
#define TR_CONTAINS_REPLY_OFFSET(count) TR_ALIGN64((uint64_t)(count) * 8u)
#define TR_LIST_IDS_OFFSET 8u

/* Fixed-size segment header. Byte budget (1024):
 *   0..127    identity and geometry, written once before state becomes READY
 *   128..191  liveness: pid, heartbeat, state
 *   192..255  the doorbell line clients write to wake the server
 *   256..511  counters
 *   512..1023 service-time histogram (64 x u64)
 */
typedef struct tr_header {
    /* identity and geometry */
    uint64_t magic;
    uint32_t layout_version;
    uint32_t header_bytes;
    uint32_t dim;
    uint32_t dtype;
    uint32_t backend;
    uint32_t slot_count;
    uint64_t capacity;
    uint64_t segment_bytes;
    uint32_t slot_bytes;         /* TR_SLOT_HEADER_BYTES + slot_payload_bytes */
    uint32_t slot_payload_bytes;
    uint32_t max_k;
    uint32_t max_upsert_rows;    /* rows one UPSERT request may carry */
    uint32_t max_search_queries; /* queries one SEARCH request may carry at k = max_k */
    uint32_t ns_entries;         /* power of two */
    uint64_t clients_offset;
    uint64_t ns_offset;
    uint64_t slots_offset;
    uint32_t codes;              /* tr_codes */
    uint8_t reserved0[128 - 100];
    /* liveness */
    int32_t owner_pid;
    uint32_t owner_uid;
    uint32_t state;       /* tr_server_state */
    uint32_t reserved1;
    uint64_t started_ns;  /* CLOCK_REALTIME */
    uint64_t heartbeat_ns; /* CLOCK_MONOTONIC, refreshed at least every 100 ms */
    uint8_t reserved2[192 - 160];
    /* doorbell: clients bump it after publishing a request; the server sleeps on it */
    uint32_t doorbell;
    uint32_t server_sleeping;
    /* written by the server at each sweep: the client processes at work since the last sweep (they sent requests,
     * or moved their tr_client_entry's activity on), and the machine's cores. Advisory (a stray write changes how
     * a store waits or which exact path a search takes, never what it gets): with more of the first than the
     * second, a process that blocks waits milliseconds for a core, so a store's writes leave their hot side to the
     * searches instead of blocking (HotTier.crowded); with as many, a CPU sidecar's scan takes a core from a
     * client, so a store answers small scopes from its own exact copy (HotTier.no_spare_core;
     * tiered_recall/hot/client.py). */
    uint32_t busy_clients;
    uint32_t cores;
    /* CLOCK_MONOTONIC: a client expects to send a request before then (a text search while it embeds its query,
     * tr_client_expect): an idle server keeps polling until then (at most TR_AWAKE_AHEAD_MAX_NS past its own
     * clock) instead of going to sleep, and a sleeping one is woken, so the request finds it awake; its backend
     * lets go of the device meanwhile (a CUDA server stops its persistent kernel, which would hold the GPU from
     * the client's embedding). Advisory, like busy_clients: it changes how soon an answer comes, never what it is;
     * the server keeps to its rule of not polling while the clients take every core. */
    uint64_t awake_until_ns;
    uint8_t reserved3[256 - 216];
    /* counters, written by the server only */
    uint64_t hot_rows;
    uint64_t requests;
    uint64_t searches;
    uint64_t queries;
    uint64_t upserted_rows;
    uint64_t deleted_rows;
    uint64_t evicted_rows;
    uint64_t errors;
    uint64_t reclaimed_slots;
    uint64_t service_ns_total;
    uint64_t search_ns_total;
    uint64_t namespaces;   /* namespaces in the ns table */
    uint64_t code_scans;     /* queries answered by the scan of the codes and its re-rank */
    uint64_t code_fallbacks; /* ... of them, queries whose candidates were too many: answered by the full scan */
    uint8_t reserved4[512 - 368];
    uint64_t latency_hist[TR_LATENCY_BUCKETS]; /* SEARCH service time */
} tr_header;

/* One request slot's control block; the payload (header.slot_payload_bytes) follows it. */
typedef struct tr_slot {
    uint32_t state;          /* tr_slot_state, atomic */
    uint32_t client_waiting; /* 1 while the client sleeps on `state` (futex) */
    uint32_t seq;            /* request sequence, bumped by the client per request */
    uint32_t reply_seq;      /* the seq the reply answers */
    int32_t owner_pid;       /* client that claimed the slot */
    uint32_t opcode;
    uint32_t flags;
    uint32_t k;
    uint32_t count;
    int32_t status;          /* tr_status */
    uint32_t reply_count;
    uint32_t reserved0;
    uint64_t ns_hash;
    uint64_t claimed_ns;     /* CLOCK_MONOTONIC when claimed */
    uint64_t service_ns;     /* time the server spent on the request */
    uint8_t reserved1[96 - 72];
    char message[TR_MESSAGE_BYTES]; /* NUL-terminated error text */
} tr_slot;

/* Per-namespace row counts, open addressing on ns_hash (0 = empty; linear probing). */
typedef struct tr_ns_entry {
    uint64_t ns_hash;
    uint64_t hot_rows;   /* rows of this namespace in the hot tier (server) */
    uint64_t total_rows; /* rows over both tiers (coordinator, via SET_TOTALS) */
    uint64_t reserved;
} tr_ns_entry;

/* Attached clients (pid 0 = free); lets the sidecar notice when its last client is gone. */
typedef struct tr_client_entry {
    int32_t pid;
    /* bumped by the client at each operation on its store, whether or not it sends the sidecar a request (a search
     * the store answers without it, a write whose hot side it leaves to others): the sweep counts the entries it
     * moved on as client processes at work (busy_clients). Advisory, like busy_clients. */
    uint32_t activity;
} tr_client_entry;

TR_STATIC_ASSERT(sizeof(tr_header) == TR_HEADER_BYTES, "tr_header must stay 1024 bytes");
TR_STATIC_ASSERT(offsetof(tr_header, codes) == 96, "codes after the geometry");
TR_STATIC_ASSERT(offsetof(tr_header, owner_pid) == 128, "liveness block starts at 128");
TR_STATIC_ASSERT(offsetof(tr_header, doorbell) == 192, "doorbell line starts at 192");
TR_STATIC_ASSERT(offsetof(tr_header, awake_until_ns) == 208, "awake_until_ns in the doorbell line");
TR_STATIC_ASSERT(offsetof(tr_header, hot_rows) == 256, "counters start at 256");
TR_STATIC_ASSERT(offsetof(tr_header, latency_hist) == 512, "histogram starts at 512");
TR_STATIC_ASSERT(sizeof(tr_slot) == TR_SLOT_HEADER_BYTES, "tr_slot must stay 256 bytes");
TR_STATIC_ASSERT(offsetof(tr_slot, message) == 96, "message at 96");
TR_STATIC_ASSERT(sizeof(tr_ns_entry) == 32, "tr_ns_entry must stay 32 bytes");
TR_STATIC_ASSERT(sizeof(tr_client_entry) == 8, "tr_client_entry must stay 8 bytes");

static inline tr_slot *tr_slot_at(void *base, const tr_header *h, uint32_t index) {
    return (tr_slot *)((char *)base + h->slots_offset + (uint64_t)index * h->slot_bytes);
}
static inline unsigned char *tr_slot_payload(tr_slot *slot) {
    return (unsigned char *)slot + TR_SLOT_HEADER_BYTES;
}
static inline tr_ns_entry *tr_ns_table(void *base, const tr_header *h) {
    return (tr_ns_entry *)((char *)base + h->ns_offset);
}
/* The namespace table's probe starts at tr_mix64(ns_hash) & (ns_entries - 1) and steps by one
 * (tiered_recall/hot/segment.py's mix64 is the same function; the server's id map uses it too). */
static inline uint64_t tr_mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}
/* Where namespace hash h (not 0) is in a table of `entries` (a power of two) entries: the index of its entry, else of
 * the empty entry where it would go; `entries` when the table is full without it. The server's store.c and the CPU
 * backend both probe through it. */
static inline uint32_t tr_ns_probe(const tr_ns_entry *table, uint32_t entries, uint64_t h) {
    const uint64_t mask = (uint64_t)entries - 1;
    uint64_t i = tr_mix64(h) & mask;
    for (uint32_t probes = 0; probes < entries; probes++) {
        const uint64_t cur = __atomic_load_n(&table[i].ns_hash, __ATOMIC_ACQUIRE);
        if (cur == h || cur == 0) return (uint32_t)i;
        i = (i + 1) & mask;
    }
    return entries;
}
/* The hot rows of one namespace as the table holds them (0 when it has no entry); a hash of 0 is read as 1, as the
 * server stores it. */
static inline uint64_t tr_ns_hot_rows(void *base, const tr_header *h, uint64_t ns_hash) {
    const tr_ns_entry *table = tr_ns_table(base, h);
    if (ns_hash == 0) ns_hash = 1;
    const uint32_t i = tr_ns_probe(table, h->ns_entries, ns_hash);
    if (i == h->ns_entries || __atomic_load_n(&table[i].ns_hash, __ATOMIC_ACQUIRE) != ns_hash) return 0;
    return __atomic_load_n(&table[i].hot_rows, __ATOMIC_ACQUIRE);
}
static inline tr_client_entry *tr_clients(void *base, const tr_header *h) {
    return (tr_client_entry *)((char *)base + h->clients_offset);
}

#endif /* TIERED_RECALL_LAYOUT_H */
