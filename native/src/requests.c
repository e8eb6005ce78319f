/* One request of the slot ring, checked and answered: the opcode, flags, k and count against the header's limits,
 * every vector copied out and checked (finite; normalised when asked), then the store or the backend does the work.
 * Nothing a client wrote is trusted, and a bad request gets an error in its own slot (server.c publishes it). */
#define _GNU_SOURCE
#include "requests.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "platform.h"

int tr_reply_error(tr_slot *slot, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(slot->message, TR_MESSAGE_BYTES, fmt, ap);
    va_end(ap);
    return status;
}

/* Index of v's first NaN or infinite value (d if none). */
static uint32_t first_not_finite(const float *v, uint32_t d) {
    for (uint32_t j = 0; j < d; j++)
        if (!isfinite(v[j])) return j;
    return d;
}

#define TAKE_PREFETCH_BYTES (16u * 1024u) /* a few queries' worth; past that the hardware prefetcher has the stream */

/* Copies count vectors out of the slot, checks they are finite, normalises when asked. Per vector:
 * exponent bits (all ones: NaN or inf) OR-ed and, when normalising, squares summed in 8 independent lanes: an isfinite
 * branch and one double sum per element would be one dependent chain, paid on the server's thread by every search. */
int tr_take_vectors_into(tr_server *s, tr_slot *slot, const unsigned char *src, uint32_t count,
                           int normalise, float *dst) {
    uint32_t d = s->geo.dim;
    const size_t bytes = (size_t)count * d * sizeof(float);
    /* The client has just written these lines, so they sit in its core's cache (or, demoted, in the shared one),
     * and a copy that reads them in order waits on them a few at a time. Asked for all at once (into L2: its miss
     * queue is the deep one), they are in flight together. With the client's prefetch for write and the
     * finiteness-only check below, this copy is most of what a search of an empty tier costs beyond a ping. */
    for (size_t off = 0; off < bytes && off < TAKE_PREFETCH_BYTES; off += 64) __builtin_prefetch(src + off, 0, 2);
    memcpy(dst, src, bytes);
    for (uint32_t i = 0; i < count; i++) {
        float *v = dst + (size_t)i * d;
        uint32_t special = 0;
        double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        uint32_t j = 0;
        if (!normalise) { /* the finiteness check alone: integer ORs, which vectorise (no squares to sum) */
            const uint32_t *bits = (const uint32_t *)v;
            for (; j < d; j++) special |= (~bits[j] & 0x7f800000u) == 0u; /* j = d: no sums below */
        }
        for (; j + 8 <= d; j += 8) {
            for (int u = 0; u < 8; u++) {
                uint32_t bits;
                memcpy(&bits, &v[j + u], sizeof bits);
                special |= ~bits & 0x7f800000u ? 0u : 1u;
                lane[u] += (double)v[j + u] * v[j + u];
            }
        }
        for (; j < d; j++) {
            special |= isfinite(v[j]) ? 0u : 1u;
            lane[0] += (double)v[j] * v[j];
        }
        if (special)
            return tr_reply_error(slot, TR_E_NOT_FINITE, "vector %u has a NaN or infinite value at "
                               "%u: clean the input (np.nan_to_num) or drop the row", i, first_not_finite(v, d));
        if (!normalise) continue;
        double norm = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
        if (norm == 0.0)
            return tr_reply_error(slot, TR_E_ZERO_VECTOR, "vector %u is all zeros and cannot be "
                               "normalised: drop it", i);
        float inv = (float)(1.0 / sqrt(norm));
        for (uint32_t j2 = 0; j2 < d; j2++) v[j2] *= inv;
    }
    return TR_OK;
}

static int take_vectors(tr_server *s, tr_slot *slot, const unsigned char *src, uint32_t count,
                        int normalise) {
    return tr_take_vectors_into(s, slot, src, count, normalise, s->query_scratch);
}

/* The checks of a SEARCH request that come before its vectors are read. */
int tr_check_search(tr_server *s, tr_slot *slot, uint32_t flags, uint32_t count, uint32_t k) {
    const tr_header *g = &s->geo;
    if (flags & ~TR_FLAGS_KNOWN)
        return tr_reply_error(slot, TR_E_BAD_FLAGS, "unknown flags 0x%x", flags & ~TR_FLAGS_KNOWN);
    if (k < 1 || k > g->max_k)
        return tr_reply_error(slot, TR_E_BAD_K, "k=%u is out of range: use 1 <= k <= %u", k, g->max_k);
    if (count < 1 || count > g->max_search_queries ||
        TR_SEARCH_BYTES(count, g->dim, k) > g->slot_payload_bytes)
        return tr_reply_error(slot, TR_E_BAD_COUNT, "%u queries at k=%u do not fit one request "
                           "(at most %u at k=%u): send fewer", count, k, g->max_search_queries, g->max_k);
    return TR_OK;
}

void tr_record_latency(tr_header *h, uint64_t ns) {
    uint32_t b = ns ? 63u - (uint32_t)__builtin_clzll(ns) : 0;
    h->latency_hist[b]++;
    h->search_ns_total += ns;
}

static int handle_search(tr_server *s, tr_slot *slot, unsigned char *p, uint32_t flags, uint32_t count,
                         uint32_t k) {
    tr_header *h = s->h;
    int rc = tr_check_search(s, slot, flags, count, k);
    if (rc) return rc;
    rc = take_vectors(s, slot, p, count, flags & TR_FLAG_NORMALIZE);
    if (rc) return rc;
    uint64_t t0 = tr_now_ns();
    uint32_t hits = 0;
    rc = s->ops->search(s->backend, s->query_scratch, count, k, (flags & TR_FLAG_NS_FILTER) != 0, slot->ns_hash,
                        s->id_scratch, s->score_scratch, &hits, slot->message, TR_MESSAGE_BYTES);
    if (rc) return rc;
    tr_record_latency(h, tr_now_ns() - t0);
    h->searches++;
    h->queries += count;
    unsigned char *out = p + TR_SEARCH_RESULT_OFFSET(count, s->geo.dim);
    memcpy(out, s->id_scratch, (size_t)count * k * sizeof(int64_t));
    memcpy(out + (size_t)count * k * sizeof(int64_t), s->score_scratch, (size_t)count * k * sizeof(float));
    if (!(flags & TR_FLAG_NO_TOUCH)) { /* id_scratch keeps the ids until serve_slot has answered */
        s->touch_queries = count;
        s->touch_k = k;
        s->touch_hits = hits;
    }
    slot->reply_count = hits;
    return TR_OK;
}

static int handle_upsert(tr_server *s, tr_slot *slot, unsigned char *p, uint32_t flags, uint32_t count) {
    tr_header *h = s->h;
    const tr_header *g = &s->geo;
    if (count < 1 || count > g->max_upsert_rows)
        return tr_reply_error(slot, TR_E_BAD_COUNT, "%u rows in one upsert: send 1..%u per request", count,
                           g->max_upsert_rows);
    int rc = take_vectors(s, slot, p + TR_UPSERT_VECTORS_OFFSET(count), count, flags & TR_FLAG_NORMALIZE);
    if (rc) return rc;
    /* Private copies: the store reads ids and namespaces more than once, and a client may
     * rewrite the payload while it is being served. */
    memcpy(s->meta_scratch, p, 24ull * count);
    const int64_t *ids = s->meta_scratch;
    const uint64_t *ns = (const uint64_t *)(s->meta_scratch + count);
    const int64_t *created = s->meta_scratch + 2ull * count;
    int64_t *evicted = (int64_t *)(p + TR_UPSERT_REPLY_OFFSET(count, g->dim));
    uint32_t n_evicted = 0;
    rc = tr_store_upsert(&s->store, ids, ns, created, s->query_scratch, count, evicted, &n_evicted, slot->message,
                         TR_MESSAGE_BYTES);
    h->hot_rows = s->store.rows;
    h->evicted_rows += n_evicted;
    if (rc) return rc;
    h->upserted_rows += count;
    slot->reply_count = n_evicted;
    return TR_OK;
}

/* DELETE and CONTAINS: ids (8 bytes each), then a 64-aligned u8 reply per id: both must fit the payload. */
static int handle_ids(tr_server *s, tr_slot *slot, unsigned char *p, uint32_t op, uint32_t count) {
    uint64_t limit = (s->geo.slot_payload_bytes - 64u) / 9u;
    if (count < 1 || count > limit)
        return tr_reply_error(slot, TR_E_BAD_COUNT, "%u ids in one request: send 1..%llu", count,
                           (unsigned long long)limit);
    const int64_t *ids = (const int64_t *)p;
    if (op == TR_OP_CONTAINS) {
        slot->reply_count = tr_store_contains(&s->store, ids, count, p + TR_CONTAINS_REPLY_OFFSET(count));
        return TR_OK;
    }
    uint32_t deleted = 0;
    int rc = tr_store_delete(&s->store, ids, count, &deleted, slot->message, TR_MESSAGE_BYTES);
    s->h->hot_rows = s->store.rows;
    s->h->deleted_rows += deleted;
    slot->reply_count = deleted;
    return rc;
}

static int handle_list_ids(tr_server *s, tr_slot *slot, unsigned char *p, uint32_t flags, uint32_t count) {
    uint64_t limit = (s->geo.slot_payload_bytes - TR_LIST_IDS_OFFSET) / 8u;
    if (count < 1 || count > limit)
        return tr_reply_error(slot, TR_E_BAD_COUNT, "%u ids in one listing: ask for 1..%llu", count,
                           (unsigned long long)limit);
    uint64_t cursor;
    memcpy(&cursor, p, sizeof cursor);
    slot->reply_count = tr_store_list_ids(&s->store, &cursor, (flags & TR_FLAG_NS_FILTER) != 0, slot->ns_hash,
                                          (int64_t *)(p + TR_LIST_IDS_OFFSET), count);
    memcpy(p, &cursor, sizeof cursor);
    return TR_OK;
}

int tr_handle_request(tr_server *s, tr_slot *slot) {
    unsigned char *p = tr_slot_payload(slot);
    uint32_t op = slot->opcode, flags = slot->flags, count = slot->count, k = slot->k;
    slot->reply_count = 0;
    if (op < 1 || op > TR_OP_MAX)
        return tr_reply_error(slot, TR_E_BAD_OPCODE, "unknown opcode %u: client and sidecar versions "
                           "differ? restart the sidecar with the installed version", op);
    if (flags & ~TR_FLAGS_KNOWN)
        return tr_reply_error(slot, TR_E_BAD_FLAGS, "unknown flags 0x%x", flags & ~TR_FLAGS_KNOWN);
    switch (op) {
    case TR_OP_PING:
        return TR_OK;
    case TR_OP_SEARCH:
        return handle_search(s, slot, p, flags, count, k);
    case TR_OP_UPSERT:
        return handle_upsert(s, slot, p, flags, count);
    case TR_OP_DELETE:
    case TR_OP_CONTAINS:
        return handle_ids(s, slot, p, op, count);
    case TR_OP_SET_TOTALS: {
        uint64_t limit = s->geo.slot_payload_bytes / 16u;
        if (count < 1 || count > limit)
            return tr_reply_error(slot, TR_E_BAD_COUNT, "%u namespaces in one request: send 1..%llu",
                               count, (unsigned long long)limit);
        return tr_store_set_totals(&s->store, (const uint64_t *)p, (const uint64_t *)(p + 8ull * count),
                                   count, slot->message, TR_MESSAGE_BYTES);
    }
    case TR_OP_LIST_IDS:
        return handle_list_ids(s, slot, p, flags, count);
    case TR_OP_CLEAR: {
        uint32_t removed = 0;
        int rc = tr_store_clear(&s->store, &removed, slot->message, TR_MESSAGE_BYTES);
        s->h->hot_rows = s->store.rows;
        slot->reply_count = removed;
        return rc;
    }
    }
    return tr_reply_error(slot, TR_E_BAD_OPCODE, "unknown opcode %u", op);
}
