/* The sidecar's request loop: finds published requests in the slot ring, checks and answers them. */
#ifndef TR_SERVER_H
#define TR_SERVER_H

#include <signal.h>
#include <stdint.h>

#include "backend.h"
#include "segment.h"
#include "store.h"

typedef struct tr_server_options {
    uint64_t idle_spin_ns;       /* keep polling this long after the last request before sleeping */
    uint64_t exit_when_orphaned_ns; /* exit when no client has been attached this long (0 = never) */
    int verbose;
    int ready_fd;                /* written "ready PID\n" and closed once serving (-1 = none) */
    uint64_t gather_ns;          /* the gather window (below; 0 = off) */
    int batched_always;          /* gather searches into batches on a backend without search_many too (tests) */
} tr_server_options;

typedef struct tr_server {
    tr_segment *seg;
    tr_header *h;           /* the shared header: counters and liveness are written here */
    tr_header geo;          /* private copy of the geometry, taken before serving: never re-read */
    tr_store store;
    const tr_backend_ops *ops;
    void *backend;
    tr_server_options opt;
    float *query_scratch;   /* normalised copies of queries / vectors */
    int64_t *id_scratch;    /* search results before they are written to the slot */
    uint32_t touch_queries, touch_k, touch_hits; /* a served search's LRU touches, done after its answer is out */
    float *score_scratch;
    int64_t *meta_scratch;  /* UPSERT ids, namespaces, created_at copied out of the slot */
    uint32_t *suspect_seq;  /* per slot: seq seen with a dead owner at the last sweep */
    uint8_t *suspect_sweeps; /* per slot: consecutive sweeps it was seen so (0 = not suspect) */
    uint64_t last_client_seen_ns;
    uint32_t *swept_seq;    /* per slot: seq at the last sweep */
    uint32_t *swept_activity; /* per client entry: its activity at the last sweep */
    uint32_t busy_clients;  /* client processes at work between the last two sweeps (slots used, or entries whose
                             * activity moved, whichever count is larger) */
    uint32_t cores;         /* online cores: the idle spin is kept only while the clients leave one free */
    struct search_batch *batch; /* searches being gathered for search_many (NULL: not batched) */
    struct search_batch *flight; /* the batch submitted to the backend, not yet published (or NULL) */
    struct search_batch *owned[3];     /* gathering, in flight, being published: all allocations */
    struct search_batch *free_list[3]; /* the ones in none of those roles */
    uint32_t n_free;
    /* gather window: after a batch of several requests was published, wait up to gather_ns for
     * its clients to come back (until gather_target requests are gathered) before launching, so
     * concurrent clients share one pass instead of alternating between two half batches
     * (--gather-us; 0 = off). */
    uint64_t gather_ns;
    uint64_t gather_until;  /* 0: no window open */
    uint32_t gather_target;
} tr_server;

int tr_server_init(tr_server *s, tr_segment *seg, const tr_backend_ops *ops, void *backend,
                   const tr_server_options *opt, char *err, size_t errlen);
/* Serves until *stop becomes non-zero (signal handler) or the sidecar is orphaned. */
int tr_server_run(tr_server *s, volatile sig_atomic_t *stop);
void tr_server_free(tr_server *s);

#endif
