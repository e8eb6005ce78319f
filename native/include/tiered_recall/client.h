/* libtrclient's call interface: its return codes and the structs Python passes to it by pointer (mirrored in
 * tiered_recall/_layout.py and checked against it by tests/test_layout.py, like layout.h). */
#ifndef TIERED_RECALL_CLIENT_H
#define TIERED_RECALL_CLIENT_H

#include <stdint.h>

#include "tiered_recall/layout.h"

/* tr_client_call / tr_client_search return codes (the sidecar's own status is in result->status). */
enum {
    TR_CALL_OK = 0,
    TR_CALL_TIMEOUT = 1,    /* the sidecar did not answer in time */
    TR_CALL_DEAD = 2,       /* the sidecar process is gone */
    TR_CALL_NO_SLOT = 3,    /* every slot stayed busy until the timeout */
    TR_CALL_TOO_LARGE = 4,  /* input or output does not fit a slot's payload */
    TR_CALL_NOT_READY = 5,  /* the segment is not (or no longer) served */
};

typedef struct tr_call_result {
    int32_t status;
    uint32_t reply_count;
    uint64_t service_ns;
    uint32_t slot;
    uint32_t reserved;
    char message[TR_MESSAGE_BYTES];
} tr_call_result;

/* One search, passed by one pointer: ctypes converts each argument of a call separately, so a search with twelve
 * arguments pays that twelve times in Python before it reaches C; one pointer to a struct the caller keeps
 * (changing only k, flags and namespace between calls) pays it once. */
typedef struct tr_search_call {
    void *base;             /* the mapped segment */
    const float *queries;   /* nq x dim float32 */
    int64_t *ids;           /* out: nq x k */
    float *scores;          /* out: nq x k */
    tr_call_result *result; /* out */
    int64_t timeout_ns;
    int64_t spin_ns;        /* busy-poll this long for the answer, */
    int64_t yield_ns;       /* then poll with sched_yield this long, then sleep on the slot's futex */
    uint64_t ns_hash;
    int32_t pid;
    uint32_t flags;
    uint32_t k;
    uint32_t nq;
} tr_search_call;

#endif
