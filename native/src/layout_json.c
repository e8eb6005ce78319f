/* Prints the segment layout and libtrclient's call structs (sizes, field offsets, constants) as JSON for the
 * Python mirror's test. */
#include <stddef.h>
#include <stdio.h>

#include "tiered_recall/client.h"

#define FIELD(type, name) \
    printf("%s\"%s\": [%zu, %zu]", first ? "" : ", ", #name, offsetof(type, name), sizeof(((type *)0)->name)); \
    first = 0;
#define CONST(name) \
    printf("%s\"%s\": %lld", first ? "" : ", ", #name, (long long)(name)); \
    first = 0;

void tr_print_layout_json(void) {
    int first;
    printf("{\"layout_version\": %u, \"magic\": %llu,\n", TR_LAYOUT_VERSION, (unsigned long long)TR_MAGIC);
    printf(" \"tr_header\": {\"size\": %zu, \"fields\": {", sizeof(tr_header));
    first = 1;
    FIELD(tr_header, magic) FIELD(tr_header, layout_version) FIELD(tr_header, header_bytes)
    FIELD(tr_header, dim) FIELD(tr_header, dtype) FIELD(tr_header, backend) FIELD(tr_header, slot_count)
    FIELD(tr_header, capacity) FIELD(tr_header, segment_bytes) FIELD(tr_header, slot_bytes)
    FIELD(tr_header, slot_payload_bytes) FIELD(tr_header, max_k) FIELD(tr_header, max_upsert_rows)
    FIELD(tr_header, max_search_queries) FIELD(tr_header, ns_entries) FIELD(tr_header, clients_offset)
    FIELD(tr_header, ns_offset) FIELD(tr_header, slots_offset) FIELD(tr_header, codes) FIELD(tr_header, owner_pid)
    FIELD(tr_header, owner_uid) FIELD(tr_header, state) FIELD(tr_header, started_ns)
    FIELD(tr_header, heartbeat_ns) FIELD(tr_header, doorbell) FIELD(tr_header, server_sleeping)
    FIELD(tr_header, busy_clients) FIELD(tr_header, cores) FIELD(tr_header, awake_until_ns)
    FIELD(tr_header, hot_rows) FIELD(tr_header, requests) FIELD(tr_header, searches)
    FIELD(tr_header, queries) FIELD(tr_header, upserted_rows) FIELD(tr_header, deleted_rows)
    FIELD(tr_header, evicted_rows) FIELD(tr_header, errors) FIELD(tr_header, reclaimed_slots)
    FIELD(tr_header, service_ns_total) FIELD(tr_header, search_ns_total) FIELD(tr_header, namespaces)
    FIELD(tr_header, code_scans) FIELD(tr_header, code_fallbacks)
    FIELD(tr_header, latency_hist)
    printf("}},\n \"tr_slot\": {\"size\": %zu, \"fields\": {", sizeof(tr_slot));
    first = 1;
    FIELD(tr_slot, state) FIELD(tr_slot, client_waiting) FIELD(tr_slot, seq) FIELD(tr_slot, reply_seq)
    FIELD(tr_slot, owner_pid) FIELD(tr_slot, opcode) FIELD(tr_slot, flags) FIELD(tr_slot, k)
    FIELD(tr_slot, count) FIELD(tr_slot, status) FIELD(tr_slot, reply_count) FIELD(tr_slot, ns_hash)
    FIELD(tr_slot, claimed_ns) FIELD(tr_slot, service_ns) FIELD(tr_slot, message)
    printf("}},\n \"tr_ns_entry\": {\"size\": %zu, \"fields\": {", sizeof(tr_ns_entry));
    first = 1;
    FIELD(tr_ns_entry, ns_hash) FIELD(tr_ns_entry, hot_rows) FIELD(tr_ns_entry, total_rows)
    printf("}},\n \"tr_client_entry\": {\"size\": %zu, \"fields\": {", sizeof(tr_client_entry));
    first = 1;
    FIELD(tr_client_entry, pid) FIELD(tr_client_entry, activity)
    printf("}},\n \"tr_call_result\": {\"size\": %zu, \"fields\": {", sizeof(tr_call_result));
    first = 1;
    FIELD(tr_call_result, status) FIELD(tr_call_result, reply_count) FIELD(tr_call_result, service_ns)
    FIELD(tr_call_result, slot) FIELD(tr_call_result, message)
    printf("}},\n \"tr_search_call\": {\"size\": %zu, \"fields\": {", sizeof(tr_search_call));
    first = 1;
    FIELD(tr_search_call, base) FIELD(tr_search_call, queries) FIELD(tr_search_call, ids)
    FIELD(tr_search_call, scores) FIELD(tr_search_call, result) FIELD(tr_search_call, timeout_ns)
    FIELD(tr_search_call, spin_ns) FIELD(tr_search_call, yield_ns) FIELD(tr_search_call, ns_hash)
    FIELD(tr_search_call, pid) FIELD(tr_search_call, flags) FIELD(tr_search_call, k) FIELD(tr_search_call, nq)
    printf("}},\n \"constants\": {");
    first = 1;
    CONST(TR_HEADER_BYTES) CONST(TR_SLOT_HEADER_BYTES) CONST(TR_MESSAGE_BYTES) CONST(TR_MAX_CLIENTS)
    CONST(TR_LATENCY_BUCKETS) CONST(TR_MAX_DIM) CONST(TR_MAX_K) CONST(TR_AWAKE_AHEAD_MAX_NS) CONST(TR_NAME_MAX)
    CONST(TR_DTYPE_F32) CONST(TR_DTYPE_F16) CONST(TR_BACKEND_CPU) CONST(TR_BACKEND_CUDA)
    CONST(TR_CODES_OFF) CONST(TR_CODES_INT8) CONST(TR_CODES_ROW_ALIGN) CONST(TR_CODES_ROW_META_CPU)
    CONST(TR_CODES_ROW_META_CUDA)
    CONST(TR_SERVER_STARTING) CONST(TR_SERVER_READY) CONST(TR_SERVER_STOPPING)
    CONST(TR_SLOT_FREE) CONST(TR_SLOT_CLAIMED) CONST(TR_SLOT_REQUEST) CONST(TR_SLOT_BUSY)
    CONST(TR_SLOT_DONE) CONST(TR_SLOT_ABANDONED)
    CONST(TR_OP_PING) CONST(TR_OP_SEARCH) CONST(TR_OP_UPSERT) CONST(TR_OP_DELETE) CONST(TR_OP_CONTAINS)
    CONST(TR_OP_SET_TOTALS) CONST(TR_OP_CLEAR) CONST(TR_OP_LIST_IDS) CONST(TR_OP_MAX)
    CONST(TR_LIST_IDS_OFFSET)
    CONST(TR_FLAG_NS_FILTER) CONST(TR_FLAG_NORMALIZE) CONST(TR_FLAG_NO_TOUCH)
    CONST(TR_OK) CONST(TR_E_BAD_OPCODE) CONST(TR_E_BAD_K) CONST(TR_E_BAD_COUNT) CONST(TR_E_BAD_PAYLOAD)
    CONST(TR_E_NOT_FINITE) CONST(TR_E_FULL) CONST(TR_E_BAD_FLAGS) CONST(TR_E_NS_TABLE_FULL)
    CONST(TR_E_ZERO_VECTOR) CONST(TR_E_INTERNAL)
    CONST(TR_CALL_OK) CONST(TR_CALL_TIMEOUT) CONST(TR_CALL_DEAD) CONST(TR_CALL_NO_SLOT) CONST(TR_CALL_TOO_LARGE)
    CONST(TR_CALL_NOT_READY)
    printf("},\n \"segment_prefix\": \"%s\"}\n", TR_SEGMENT_PREFIX);
}
