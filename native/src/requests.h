/* One request of the slot ring, checked and answered (requests.c); the loop that finds them, batches searches and
 * publishes the answers is server.c. */
#ifndef TR_REQUESTS_H
#define TR_REQUESTS_H

#include <stdint.h>

#include "server.h"

/* Writes the message into the slot and returns status (a negative tr_status). */
int tr_reply_error(tr_slot *slot, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Copies count vectors out of the slot's payload at src into dst, checks they are finite, normalises when asked. */
int tr_take_vectors_into(tr_server *s, tr_slot *slot, const unsigned char *src, uint32_t count, int normalise,
                         float *dst);
/* The checks of a SEARCH request that come before its vectors are read. */
int tr_check_search(tr_server *s, tr_slot *slot, uint32_t flags, uint32_t count, uint32_t k);
/* Counts a search's backend time in the header's latency histogram. */
void tr_record_latency(tr_header *h, uint64_t ns);
/* Checks and answers one request in place; returns its status. A served search leaves its LRU touches in s. */
int tr_handle_request(tr_server *s, tr_slot *slot);

#endif
