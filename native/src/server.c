/* The sidecar's request loop: finds published requests in the slot ring, has them checked and answered (requests.c),
 * gathers searches into batches for a backend that answers many in one pass, publishes every answer in its own slot,
 * and sweeps the ring for clients that died.
 */
#define _GNU_SOURCE
#include "server.h"

#include "requests.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "platform.h"

#include <unistd.h>

#define SWEEP_INTERVAL_NS (100ull * 1000 * 1000)

/* Searches gathered in one pass over the ring (backends with search_many). */
#define TR_BATCH_MAX 64

struct search_batch {
    uint32_t n;
    size_t queries;          /* query scratch used (vectors) */
    int sync_done;           /* answered synchronously (or failed at submit): nothing to poll */
    int rc;                  /* non-zero: fails every request of the batch */
    uint64_t t_submit;
    tr_slot *slot[TR_BATCH_MAX];
    uint64_t t0[TR_BATCH_MAX];
    uint32_t flags[TR_BATCH_MAX];
    tr_search_request req[TR_BATCH_MAX];
    char err[TR_MESSAGE_BYTES];
};
typedef struct search_batch search_batch;

/* A client expects to send a request soon (tr_client_expect): keep polling. A deadline further ahead than
 * TR_AWAKE_AHEAD_MAX_NS (a stray write, or another clock) is brought back to that, so it always ends. */
static int awaited(tr_server *s, uint64_t now) {
    uint64_t until = __atomic_load_n(&s->h->awake_until_ns, __ATOMIC_ACQUIRE);
    if (until <= now) return 0;
    if (until - now > TR_AWAKE_AHEAD_MAX_NS) {
        uint64_t capped = now + TR_AWAKE_AHEAD_MAX_NS;
        __atomic_compare_exchange_n(&s->h->awake_until_ns, &until, capped, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED);
    }
    return 1;
}

int tr_server_init(tr_server *s, tr_segment *seg, const tr_backend_ops *ops, void *backend,
                   const tr_server_options *opt, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    s->seg = seg;
    s->h = seg->header;
    s->geo = *seg->header; /* private copy: clients can write the shared header, so never trust it */
    s->ops = ops;
    s->backend = backend;
    s->opt = *opt;
    tr_header *h = s->h;
    uint32_t max_vectors = h->max_upsert_rows > h->max_search_queries ? h->max_upsert_rows
                                                                      : h->max_search_queries;
    s->query_scratch = malloc((size_t)max_vectors * h->dim * sizeof(float));
    s->id_scratch = malloc((size_t)h->max_search_queries * h->max_k * sizeof(int64_t));
    s->score_scratch = malloc((size_t)h->max_search_queries * h->max_k * sizeof(float));
    s->suspect_seq = calloc(h->slot_count, sizeof(uint32_t));
    s->swept_seq = calloc(h->slot_count, sizeof(uint32_t));
    s->swept_activity = calloc(TR_MAX_CLIENTS, sizeof(uint32_t));
    s->suspect_sweeps = calloc(h->slot_count, sizeof(uint8_t));
    s->meta_scratch = malloc((size_t)h->max_upsert_rows * 3 * sizeof(int64_t));
    if (!s->query_scratch || !s->id_scratch || !s->score_scratch || !s->suspect_seq || !s->suspect_sweeps ||
        !s->swept_seq || !s->swept_activity || !s->meta_scratch) {
        snprintf(err, errlen, "out of memory for request scratch space");
        return -1;
    }
    if (ops->search_many || opt->batched_always) {
        /* three batches rotate: gathering, in flight, and the finished one being published */
        for (int i = 0; i < 3; i++) s->owned[i] = calloc(1, sizeof(search_batch));
        s->batch = s->owned[0];
        s->free_list[0] = s->owned[1];
        s->free_list[1] = s->owned[2];
        s->n_free = 2;
        if (!s->owned[0] || !s->owned[1] || !s->owned[2]) {
            snprintf(err, errlen, "out of memory for the search batch");
            return -1;
        }
    }
    s->gather_ns = opt->gather_ns;
    s->last_client_seen_ns = tr_now_ns();
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    s->cores = cores > 0 ? (uint32_t)cores : 1;
    return tr_store_init(&s->store, h->dim, h->capacity, h->max_upsert_rows, tr_ns_table(seg->base, h),
                         h->ns_entries, &h->namespaces, ops, backend, err, errlen);
}

void tr_server_free(tr_server *s) {
    tr_store_free(&s->store);
    free(s->query_scratch);
    free(s->id_scratch);
    free(s->score_scratch);
    free(s->suspect_seq);
    free(s->swept_seq);
    free(s->swept_activity);
    free(s->suspect_sweeps);
    free(s->meta_scratch);
    for (int i = 0; i < 3; i++) free(s->owned[i]);
}

/* Publishes a reply: status, DONE (or FREE when abandoned), and wakes a sleeping client. */
static void finish_slot(tr_server *s, tr_slot *slot, int status, uint64_t t0) {
    s->h->requests++;
    if (status != TR_OK) s->h->errors++;
    slot->status = status;
    slot->reply_seq = slot->seq;
    slot->service_ns = tr_now_ns() - t0;
    s->h->service_ns_total += slot->service_ns;
    uint32_t busy = TR_SLOT_BUSY;
    /* seq_cst pairs with the client's store of client_waiting: one of us sees the other. */
    if (!__atomic_compare_exchange_n(&slot->state, &busy, (uint32_t)TR_SLOT_DONE, 0, __ATOMIC_SEQ_CST,
                                     __ATOMIC_SEQ_CST)) {
        /* the client gave up (ABANDONED): nobody will read the answer */
        slot->owner_pid = 0;
        tr_store_release(&slot->state, (uint32_t)TR_SLOT_FREE);
        return;
    }
    tr_cache_demote(slot);
    if (__atomic_load_n(&slot->client_waiting, __ATOMIC_SEQ_CST)) tr_futex_wake(&slot->state, 1);
}

static void serve_slot(tr_server *s, tr_slot *slot) {
    uint64_t t0 = tr_now_ns();
    slot->message[0] = '\0';
    s->touch_queries = 0;
    finish_slot(s, slot, tr_handle_request(s, slot), t0);
    /* after the answer is out: the client does not wait for a search's LRU touches */
    for (uint32_t q = 0; q < s->touch_queries; q++)
        tr_store_touch_ids(&s->store, s->id_scratch + (size_t)q * s->touch_k, s->touch_hits);
}

/* Batched search (backends with search_many, e.g. CUDA): every SEARCH published when a pass over
 * the ring starts is checked and copied out as usual, then all of them are answered by one backend
 * call (one pass over the rows for all their queries); other requests are served in ring order,
 * after every search gathered or in flight before them has been answered.
 *
 * Pipeline (backends with search_submit/search_poll): a gathered batch is launched and the loop
 * goes on gathering the next one while the device works. When the batch in flight is done, the
 * gathered one is launched first and only then is the finished one published (DONE, futex wakes,
 * LRU touches), so the device is not idle while the host publishes. Results are written by the
 * backend straight into each request's result area in the slot (tr_search_request.ids_out). */

/* Launches the gathered batch; it becomes the batch in flight (s->flight). */
static void submit_batch(tr_server *s) {
    search_batch *b = s->batch;
    b->rc = 0;
    b->sync_done = 1;
    b->err[0] = '\0';
    for (uint32_t i = 0; i < b->n; i++) b->req[i].status = TR_OK;
    b->t_submit = tr_now_ns();
    if (s->ops->search_submit && s->ops->search_poll) {
        b->rc = s->ops->search_submit(s->backend, b->req, b->n, b->err, sizeof b->err);
        b->sync_done = b->rc != 0; /* a failed submit leaves nothing outstanding */
    } else if (s->ops->search_many) {
        b->rc = s->ops->search_many(s->backend, b->req, b->n, b->err, sizeof b->err);
    } else { /* --test-batched-server on a backend without search_many: one call per request */
        for (uint32_t i = 0; i < b->n; i++) {
            tr_search_request *r = &b->req[i];
            r->status = s->ops->search(s->backend, r->queries, r->count, r->k, r->filter_ns, r->ns_hash,
                                       r->ids_out, r->scores_out, &r->hits, b->err, sizeof b->err);
        }
    }
    s->flight = b;
    /* the queries were consumed: the scratch can take the next batch. At most the finished batch
     * being published is in use besides this one, so a free batch is left. */
    s->batch = s->free_list[--s->n_free];
    s->batch->n = 0;
    s->batch->queries = 0;
}

/* Publishes every answer of a finished batch and returns the batch to the spare position. */
static void publish_batch(tr_server *s, search_batch *b) {
    tr_header *h = s->h;
    uint64_t dt = tr_now_ns() - b->t_submit;
    for (uint32_t i = 0; i < b->n; i++) {
        tr_slot *slot = b->slot[i];
        tr_search_request *r = &b->req[i];
        int status = b->rc ? b->rc : r->status;
        const int touch = status == TR_OK && !(b->flags[i] & TR_FLAG_NO_TOUCH);
        if (status == TR_OK) {
            tr_record_latency(h, dt);
            h->searches++;
            h->queries += r->count;
            /* the ids are in the client's slot, which is the client's again once it is DONE: a private copy
             * (count <= max_search_queries and k <= max_k, what id_scratch holds) */
            if (touch) memcpy(s->id_scratch, r->ids_out, (size_t)r->count * r->k * sizeof(int64_t));
            slot->reply_count = r->hits;
        } else {
            memcpy(slot->message, b->err, TR_MESSAGE_BYTES);
            slot->message[TR_MESSAGE_BYTES - 1] = '\0';
        }
        finish_slot(s, slot, status, b->t0[i]);
        if (touch) { /* after the answer is out: the client does not wait for its LRU touches */
            const uint32_t hits = r->hits < r->k ? r->hits : r->k;
            for (uint32_t q = 0; q < r->count; q++) tr_store_touch_ids(&s->store, s->id_scratch + (size_t)q * r->k, hits);
        }
    }
    b->n = 0;
    b->queries = 0;
    s->free_list[s->n_free++] = b;
}

/* Moves the pipeline on: when the batch in flight is done (block: wait for it), launches the
 * gathered batch and then publishes the finished one; with nothing in flight, launches the
 * gathered batch. Returns 1 while a batch is still in flight. */
static int advance_batches(tr_server *s, int block) {
    if (s->flight) {
        search_batch *f = s->flight;
        if (!f->sync_done) {
            int rc = s->ops->search_poll(s->backend, block, f->err, sizeof f->err);
            if (rc == 1) return 1;
            if (rc < 0) f->rc = rc;
        }
        s->flight = NULL;
        if (!block && s->gather_ns && f->n > 1) {
            /* several clients: publish first so they can come back, then gather them (and the
             * ones already gathered) into one batch for at most gather_ns (serve_ready_batched
             * launches it once the window closes or the target is reached) */
            uint32_t target = f->n + s->batch->n;
            if (target > TR_BATCH_MAX) target = TR_BATCH_MAX;
            publish_batch(s, f);
            s->gather_target = target;
            s->gather_until = tr_now_ns() + s->gather_ns;
            return 0;
        }
        if (s->batch->n) submit_batch(s); /* the device starts on it while we publish f */
        publish_batch(s, f);
    } else if (s->batch->n) {
        if (!block && s->gather_until && s->batch->n < s->gather_target && tr_now_ns() < s->gather_until)
            return 0; /* window still open */
        s->gather_until = 0;
        submit_batch(s);
    }
    return s->flight != NULL;
}

/* Answers everything gathered or in flight (before a non-search request, and before exiting). */
static void drain_batches(tr_server *s) {
    if (!s->batch) return;
    while (advance_batches(s, 1) || s->batch->n) {
    }
}

static int serve_ready_batched(tr_server *s) {
    const tr_header *g = &s->geo;
    const size_t query_cap = (size_t)(g->max_upsert_rows > g->max_search_queries ? g->max_upsert_rows
                                                                                   : g->max_search_queries);
    int served = 0;
    for (uint32_t i = 0; i < g->slot_count; i++) {
        tr_slot *slot = tr_slot_at(s->seg->base, g, i);
        uint32_t st = tr_load_acquire(&slot->state);
        if (st != TR_SLOT_REQUEST) continue;
        if (!tr_cas(&slot->state, &st, (uint32_t)TR_SLOT_BUSY)) continue;
        served++;
        if (slot->opcode != TR_OP_SEARCH) {
            /* in ring order after the searches before it; also frees the query scratch */
            drain_batches(s);
            serve_slot(s, slot);
            continue;
        }
        uint64_t t0 = tr_now_ns();
        slot->message[0] = '\0';
        slot->reply_count = 0;
        /* read once: the client could rewrite its slot while it is being served */
        uint32_t flags = slot->flags, count = slot->count, k = slot->k;
        uint64_t ns_hash = slot->ns_hash;
        int rc = tr_check_search(s, slot, flags, count, k);
        if (rc == TR_OK && (s->batch->n == TR_BATCH_MAX || s->batch->queries + count > query_cap)) {
            /* full: launch what is gathered (after the batch in flight), then gather anew */
            while (s->batch->n) advance_batches(s, 1);
        }
        search_batch *b = s->batch;
        float *q = s->query_scratch + b->queries * g->dim;
        if (rc == TR_OK) rc = tr_take_vectors_into(s, slot, tr_slot_payload(slot), count, flags & TR_FLAG_NORMALIZE, q);
        if (rc != TR_OK) {
            finish_slot(s, slot, rc, t0);
            continue;
        }
        unsigned char *out = tr_slot_payload(slot) + TR_SEARCH_RESULT_OFFSET(count, g->dim);
        tr_search_request *r = &b->req[b->n];
        memset(r, 0, sizeof *r);
        r->queries = q;
        r->count = count;
        r->k = k;
        r->filter_ns = (flags & TR_FLAG_NS_FILTER) != 0;
        r->ns_hash = ns_hash;
        r->ids_out = (int64_t *)out;
        r->scores_out = (float *)(out + (size_t)count * k * sizeof(int64_t));
        b->slot[b->n] = slot;
        b->t0[b->n] = t0;
        b->flags[b->n] = flags;
        b->n++;
        b->queries += count;
    }
    advance_batches(s, 0);
    return served;
}

/* One pass over the ring; returns how many requests were served. */
static int serve_ready(tr_server *s) {
    if (s->batch) return serve_ready_batched(s);
    int served = 0;
    for (uint32_t i = 0; i < s->geo.slot_count; i++) {
        tr_slot *slot = tr_slot_at(s->seg->base, &s->geo, i);
        uint32_t st = tr_load_acquire(&slot->state);
        if (st != TR_SLOT_REQUEST) continue;
        if (!tr_cas(&slot->state, &st, (uint32_t)TR_SLOT_BUSY)) continue;
        serve_slot(s, slot);
        served++;
    }
    return served;
}

/* Frees slots held by clients that died; counts live clients. */
static void sweep(tr_server *s, uint64_t now) {
    tr_header *h = s->h;
    __atomic_store_n(&h->heartbeat_ns, now, __ATOMIC_RELEASE);
    uint32_t used = 0;
    for (uint32_t i = 0; i < s->geo.slot_count; i++) {
        tr_slot *slot = tr_slot_at(s->seg->base, &s->geo, i);
        uint32_t st = tr_load_acquire(&slot->state);
        int32_t owner = slot->owner_pid;
        uint32_t seq = slot->seq;
        /* a client claims the slot of its pid first, so the slots used since the last sweep count the busy
         * client processes */
        used += seq != s->swept_seq[i];
        s->swept_seq[i] = seq;
        int held = st == TR_SLOT_CLAIMED || st == TR_SLOT_DONE;
        if (!held || (owner != 0 && tr_pid_alive(owner))) {
            s->suspect_sweeps[i] = 0;
            continue;
        }
        /* Seen on consecutive sweeps with the same dead owner and seq: truly abandoned. Owner 0
         * means a client died between its CAS and writing its pid (or between clearing its pid
         * and freeing the slot): a live client spends nanoseconds there, so wait ~1 s. */
        uint8_t needed = owner == 0 ? 10 : 2;
        if (s->suspect_sweeps[i] == 0 || s->suspect_seq[i] != seq) {
            s->suspect_seq[i] = seq;
            s->suspect_sweeps[i] = 1;
        } else if (++s->suspect_sweeps[i] >= needed) {
            if (tr_cas(&slot->state, &st, (uint32_t)TR_SLOT_FREE)) {
                slot->owner_pid = 0;
                h->reclaimed_slots++;
            }
            s->suspect_sweeps[i] = 0;
        }
    }
    tr_client_entry *clients = tr_clients(s->seg->base, &s->geo);
    int live = 0;
    uint32_t active = 0; /* entries whose client moved its activity on since the last sweep */
    for (uint32_t i = 0; i < TR_MAX_CLIENTS; i++) {
        int32_t pid = __atomic_load_n(&clients[i].pid, __ATOMIC_ACQUIRE);
        uint32_t activity = __atomic_load_n(&clients[i].activity, __ATOMIC_RELAXED);
        active += pid != 0 && activity != s->swept_activity[i];
        s->swept_activity[i] = activity;
        if (pid == 0) continue;
        if (tr_pid_alive(pid)) {
            live++;
        } else {
            __atomic_compare_exchange_n(&clients[i].pid, &pid, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
        }
    }
    if (live) s->last_client_seen_ns = now;
    /* a process that sends requests and moves its activity on is counted by both: the larger count stands */
    if (active > used) used = active;
    s->busy_clients = used;
    __atomic_store_n(&h->busy_clients, used, __ATOMIC_RELAXED);
    __atomic_store_n(&h->cores, s->cores, __ATOMIC_RELAXED);
}

int tr_server_run(tr_server *s, volatile sig_atomic_t *stop) {
    tr_header *h = s->h;
    /* the orphan timer starts when clients can attach (backend start-up can be slow, e.g. under
     * compute-sanitizer), not when the server was initialised */
    s->last_client_seen_ns = tr_now_ns();
    tr_store_release(&h->state, (uint32_t)TR_SERVER_READY);
    if (s->opt.ready_fd >= 0) {
        char line[64];
        int n = snprintf(line, sizeof line, "ready %d\n", (int)getpid());
        if (write(s->opt.ready_fd, line, (size_t)n) != n) { /* the starter gave up: keep serving */ }
        close(s->opt.ready_fd);
        s->opt.ready_fd = -1;
    }
    uint64_t last_busy = tr_now_ns(), last_sweep = 0;
    uint32_t passes = 0;
    int busy_since_clock = 0;
    while (!*stop) {
        int served = serve_ready(s);
        const int busy = served || s->flight || (s->batch && s->batch->n);
        busy_since_clock |= busy;
        /* The clock is read every 64th pass (the sweep and the idle timer need milliseconds, not nanoseconds): a
         * clock read costs tens of ns (more on a VM), and a pass that reads it sees the next request, or the
         * device's answer, that much later. */
        if (++passes & 63u) {
            if (!busy) tr_cpu_relax();
            continue;
        }
        uint64_t now = tr_now_ns();
        if (busy_since_clock) last_busy = now;
        busy_since_clock = 0;
        if (now - last_sweep >= SWEEP_INTERVAL_NS) { /* also under load: heartbeat and dead clients */
            sweep(s, now);
            last_sweep = now;
            if (s->opt.exit_when_orphaned_ns && now - s->last_client_seen_ns > s->opt.exit_when_orphaned_ns) {
                if (s->opt.verbose) fprintf(stderr, "tr-sidecar: no client attached; exiting\n");
                drain_batches(s);
                return 0;
            }
        }
        /* Idle is counted from the last moment the server had work in hand, not from the last request it took:
         * a search longer than idle_spin_ns (4M x 768 rows take ~1.5 ms on the GPU) would otherwise let the
         * server go to sleep, and stop the persistent kernel, before its client could send the next one. */
        if (busy) continue; /* in flight or gathering: keep polling */
        /* The idle spin keeps the next request's latency low while the clients leave a core free; once there are
         * as many busy client processes as cores, a spinning server takes a core from them (their own work, and the
         * writes they wait on), so it sleeps on the doorbell at once. While it spins it hands the core to any
         * other runnable task at each clock read (the yield returns at once when there is none). */
        if (awaited(s, now) && s->busy_clients < s->cores) {
            /* A client is embedding a query to search with (tr_client_expect): this thread stays awake for its
             * request, and the backend lets go of what it holds for the next request at once (the CUDA backend's
             * persistent kernel would hold the GPU from the client's own kernels). */
            if (s->ops->idle) s->ops->idle(s->backend);
            sched_yield();
            continue;
        }
        if (now - last_busy < s->opt.idle_spin_ns && s->busy_clients < s->cores) {
            sched_yield();
            continue;
        }
        if (s->ops->idle) s->ops->idle(s->backend);
        /* Sleep on the doorbell. seq_cst pairs with the client's bump: either the client sees
         * server_sleeping and wakes us, or our scan below sees its request. */
        __atomic_store_n(&h->server_sleeping, 1, __ATOMIC_SEQ_CST);
        uint32_t bell = __atomic_load_n(&h->doorbell, __ATOMIC_SEQ_CST);
        /* a client's expect after the check above rang the bell before this read, or finds server_sleeping set */
        const int expected = awaited(s, tr_now_ns()) && s->busy_clients < s->cores;
        if (!serve_ready(s) && !s->flight && !(s->batch && s->batch->n) && !expected)
            tr_futex_wait(&h->doorbell, bell, SWEEP_INTERVAL_NS);
        else last_busy = tr_now_ns();
        __atomic_store_n(&h->server_sleeping, 0, __ATOMIC_SEQ_CST);
    }
    drain_batches(s); /* no client is left waiting on an answer that was computed */
    return 0;
}
