/* libtrclient: the client half of the slot protocol (claim, publish, wait), called from Python via ctypes.
 *
 * Python cannot do atomics or futexes on shared memory, so one call here does a whole request:
 * claim a free slot with a CAS, copy the input in, publish with release ordering, ring the
 * doorbell, spin briefly, poll with sched_yield for a while if asked, sleep on the slot's futex,
 * copy the output out, free the slot.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "platform.h"
#include "tiered_recall/client.h"

#define LIVENESS_CHECK_NS (20ull * 1000 * 1000)
#define CLAIM_PREFETCH_BYTES (16u * 1024u) /* a few queries' worth; past that the stores stream anyway */

static int server_alive(const tr_header *h) {
    uint32_t state = tr_load_acquire(&h->state);
    if (state != TR_SERVER_READY) return 0;
    return tr_pid_alive(h->owner_pid);
}

uint32_t tr_client_abi_version(void) { return TR_LAYOUT_VERSION; }

int tr_client_register(void *base, int32_t pid) {
    tr_header *h = base;
    tr_client_entry *clients = tr_clients(base, h);
    for (uint32_t i = 0; i < TR_MAX_CLIENTS; i++) {
        int32_t expected = 0;
        if (__atomic_compare_exchange_n(&clients[i].pid, &expected, pid, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            return (int)i;
    }
    return -1;
}

/* Frees the one entry tr_client_register returned: a process may hold several attachments. */
void tr_client_unregister(void *base, int32_t index, int32_t pid) {
    tr_header *h = base;
    if (index < 0 || (uint32_t)index >= TR_MAX_CLIENTS) return;
    tr_client_entry *clients = tr_clients(base, h);
    int32_t expected = pid;
    __atomic_compare_exchange_n(&clients[index].pid, &expected, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

/* A request is coming within `within_ns` (a text search while it embeds its query): the server stays awake until
 * then (layout.h: awake_until_ns; at most TR_AWAKE_AHEAD_MAX_NS ahead). Only ever moves the deadline later; wakes a
 * sleeping server, as a request does. */
void tr_client_expect(void *base, uint64_t within_ns) {
    tr_header *h = base;
    if (within_ns > TR_AWAKE_AHEAD_MAX_NS) within_ns = TR_AWAKE_AHEAD_MAX_NS;
    const uint64_t until = tr_now_ns() + within_ns;
    uint64_t seen = __atomic_load_n(&h->awake_until_ns, __ATOMIC_RELAXED);
    while (seen < until &&
           !__atomic_compare_exchange_n(&h->awake_until_ns, &seen, until, 1, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
    }
    __atomic_fetch_add(&h->doorbell, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&h->server_sleeping, __ATOMIC_SEQ_CST)) tr_futex_wake(&h->doorbell, 1);
}

static void release_slot(tr_slot *slot) {
    slot->owner_pid = 0;
    tr_store_release(&slot->state, (uint32_t)TR_SLOT_FREE);
}

/* Gives up on a published request without racing the server. */
static void abandon(tr_slot *slot) {
    for (;;) {
        uint32_t st = tr_load_acquire(&slot->state);
        if (st == TR_SLOT_REQUEST) {
            if (tr_cas(&slot->state, &st, (uint32_t)TR_SLOT_FREE)) return;
        } else if (st == TR_SLOT_BUSY) {
            if (tr_cas(&slot->state, &st, (uint32_t)TR_SLOT_ABANDONED)) return;
        } else {
            release_slot(slot);
            return;
        }
    }
}

/* Claims a slot, publishes the request and waits for the answer. On TR_CALL_OK the slot is
 * still held (state DONE) and *out_slot points at it: the caller copies the reply out, then
 * calls release_slot. */
static int request(void *base, int32_t pid, uint32_t opcode, uint32_t flags, uint32_t k, uint32_t count,
                   uint64_t ns_hash, const void *in, uint64_t in_bytes, int64_t timeout_ns, int64_t spin_ns,
                   int64_t yield_ns, tr_call_result *result, tr_slot **out_slot) {
    tr_header *h = base;
    memset(result, 0, offsetof(tr_call_result, message));
    result->message[0] = '\0';
    if (in_bytes > h->slot_payload_bytes) return TR_CALL_TOO_LARGE;
    /* Only the state word here: a liveness check is a kill() and a /proc read, too dear per request.
     * A sidecar that died without leaving READY is caught by the checks while waiting. */
    if (tr_load_acquire(&h->state) != TR_SERVER_READY) return TR_CALL_NOT_READY;
    const uint64_t start = tr_now_ns();
    const uint64_t deadline = start + (uint64_t)(timeout_ns > 0 ? timeout_ns : 0);

    /* Claim: start at a pid-dependent slot so concurrent clients rarely collide. */
    const uint32_t n = h->slot_count;
    uint32_t index = (uint32_t)pid % n;
    tr_slot *slot = NULL;
    uint64_t next_check = start + LIVENESS_CHECK_NS;
    for (uint32_t tries = 0;; tries++) {
        tr_slot *s = tr_slot_at(base, h, index);
        uint32_t free_state = TR_SLOT_FREE;
        if (tr_load_relaxed(&s->state) == TR_SLOT_FREE && tr_cas(&s->state, &free_state, (uint32_t)TR_SLOT_CLAIMED)) {
            slot = s;
            break;
        }
        index = (index + 1) % n;
        if (tries % n == n - 1) {
            uint64_t now = tr_now_ns();
            if (now >= deadline) return TR_CALL_NO_SLOT;
            if (now >= next_check) {
                if (!server_alive(h)) return TR_CALL_DEAD;
                next_check = now + LIVENESS_CHECK_NS;
            }
            usleep(20);
        }
    }
    result->slot = index;
    slot->owner_pid = pid;
    slot->claimed_ns = start;
    slot->opcode = opcode;
    slot->flags = flags;
    slot->k = k;
    slot->count = count;
    slot->ns_hash = ns_hash;
    slot->status = 0;
    slot->reply_count = 0;
    slot->client_waiting = 0;
    slot->seq = slot->seq + 1;
    if (in_bytes) {
        /* The server read these lines on the slot's last request, so its core holds copies, and each store here
         * must take its line back: asked for together first, the lines come back in parallel, not one per store
         * as the stores drain. Then they are pushed towards the shared cache, where the server reads them next
         * (server.c: take_vectors_to has the figures). */
        unsigned char *payload = tr_slot_payload(slot);
        for (uint64_t off = 0; off < in_bytes && off < CLAIM_PREFETCH_BYTES; off += 64)
            tr_prefetch_for_write(payload + off);
        memcpy(payload, in, in_bytes);
        for (uint64_t off = 0; off < in_bytes && off < CLAIM_PREFETCH_BYTES; off += 64) tr_cache_demote(payload + off);
    }
    tr_store_release(&slot->state, (uint32_t)TR_SLOT_REQUEST);
    tr_cache_demote(slot);
    __atomic_fetch_add(&h->doorbell, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&h->server_sleeping, __ATOMIC_SEQ_CST)) tr_futex_wake(&h->doorbell, 1);

    /* Wait: spin for spin_ns, then poll with sched_yield for yield_ns more (the core stays awake for others'
     * work: a client that sleeps and is woken by the server's futex call pays the wake-up of an idle core, tens
     * of us in a VM), then sleep on the slot's state word in short naps so a dead sidecar is noticed well
     * within the timeout. */
    const uint64_t spin_until = start + (uint64_t)(spin_ns > 0 ? spin_ns : 0);
    const uint64_t yield_until = spin_until + (uint64_t)(yield_ns > 0 ? yield_ns : 0);
    int spinning = 1;
    for (uint32_t polls = 1;; polls++) {
        uint32_t st = tr_load_acquire(&slot->state);
        if (st == TR_SLOT_DONE) break;
        /* While spinning, the clock is read every 32nd poll: a clock read costs tens of ns (more on a VM), and a
         * poll that reads it sees the answer that much later. */
        if (spinning && (polls & 31u)) {
            tr_cpu_relax();
            continue;
        }
        uint64_t now = tr_now_ns();
        if (now < spin_until) {
            tr_cpu_relax();
            continue;
        }
        spinning = 0;
        if (now >= deadline) {
            abandon(slot);
            return server_alive(h) ? TR_CALL_TIMEOUT : TR_CALL_DEAD;
        }
        if (now >= next_check) {
            if (!server_alive(h)) {
                abandon(slot);
                return TR_CALL_DEAD;
            }
            next_check = now + LIVENESS_CHECK_NS;
        }
        if (now < yield_until) {
            sched_yield();
            continue;
        }
        __atomic_store_n(&slot->client_waiting, 1, __ATOMIC_SEQ_CST);
        st = __atomic_load_n(&slot->state, __ATOMIC_SEQ_CST);
        if (st != TR_SLOT_DONE) {
            uint64_t nap = deadline - now;
            if (nap > LIVENESS_CHECK_NS) nap = LIVENESS_CHECK_NS;
            tr_futex_wait(&slot->state, st, nap);
        }
        __atomic_store_n(&slot->client_waiting, 0, __ATOMIC_RELAXED);
    }
    result->status = slot->status;
    result->reply_count = slot->reply_count;
    result->service_ns = slot->service_ns;
    if (slot->status != TR_OK) {
        memcpy(result->message, slot->message, TR_MESSAGE_BYTES);
        result->message[TR_MESSAGE_BYTES - 1] = '\0';
    }
    *out_slot = slot;
    return TR_CALL_OK;
}

int tr_client_call(void *base, int32_t pid, uint32_t opcode, uint32_t flags, uint32_t k, uint32_t count,
                   uint64_t ns_hash, const void *in, uint64_t in_bytes, void *out, uint64_t out_offset,
                   uint64_t out_bytes, int64_t timeout_ns, int64_t spin_ns, int64_t yield_ns,
                   tr_call_result *result) {
    tr_header *h = base;
    if (out_offset + out_bytes > h->slot_payload_bytes) return TR_CALL_TOO_LARGE;
    tr_slot *slot = NULL;
    int rc = request(base, pid, opcode, flags, k, count, ns_hash, in, in_bytes, timeout_ns, spin_ns, yield_ns, result,
                     &slot);
    if (rc != TR_CALL_OK) return rc;
    if (result->status == TR_OK && out_bytes) memcpy(out, tr_slot_payload(slot) + out_offset, out_bytes);
    release_slot(slot);
    return TR_CALL_OK;
}

/* One search, results straight into the caller's ids (nq x k) and scores (nq x k) arrays. */
int tr_client_search(const tr_search_call *c) {
    tr_header *h = c->base;
    uint64_t in_bytes = (uint64_t)c->nq * h->dim * sizeof(float);
    if (TR_SEARCH_BYTES(c->nq, h->dim, c->k) > h->slot_payload_bytes) return TR_CALL_TOO_LARGE;
    tr_slot *slot = NULL;
    int rc = request(c->base, c->pid, TR_OP_SEARCH, c->flags, c->k, c->nq, c->ns_hash, c->queries, in_bytes,
                     c->timeout_ns, c->spin_ns, c->yield_ns, c->result, &slot);
    if (rc != TR_CALL_OK) return rc;
    if (c->result->status == TR_OK) {
        const unsigned char *out = tr_slot_payload(slot) + TR_SEARCH_RESULT_OFFSET(c->nq, h->dim);
        memcpy(c->ids, out, (size_t)c->nq * c->k * sizeof(int64_t));
        memcpy(c->scores, out + (size_t)c->nq * c->k * sizeof(int64_t), (size_t)c->nq * c->k * sizeof(float));
    }
    release_slot(slot);
    return TR_CALL_OK;
}
