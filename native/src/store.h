/* Row bookkeeping of the hot tier: which row holds which id, LRU order, per-namespace counts. */
#ifndef TR_STORE_H
#define TR_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "tiered_recall/layout.h"

typedef struct tr_store {
    uint32_t dim;
    uint64_t capacity;
    uint64_t rows;
    int64_t *ids;      /* row -> id */
    uint64_t *ns;      /* row -> namespace hash */
    int64_t *created;  /* row -> created_at_us */
    int64_t *lru_prev; /* row -> row, toward most recent (-1 = none) */
    int64_t *lru_next; /* row -> row, toward least recent */
    int64_t lru_head;  /* most recently used */
    int64_t lru_tail;  /* least recently used: evicted first */
    uint64_t map_mask; /* id -> row, open addressing */
    int64_t *map_keys;
    int64_t *map_rows; /* -1 empty, -2 deleted */
    uint64_t map_deleted; /* deleted markers; the map is rebuilt when they pile up */
    tr_ns_entry *ns_table; /* in the shared segment */
    uint32_t ns_entries;
    uint64_t *namespaces; /* header counter */
    const tr_backend_ops *ops;
    void *backend;
    uint64_t *scratch_rows; /* max_upsert_rows */
} tr_store;

int tr_store_init(tr_store *s, uint32_t dim, uint64_t capacity, uint32_t max_upsert_rows,
                  tr_ns_entry *ns_table, uint32_t ns_entries, uint64_t *namespaces_counter,
                  const tr_backend_ops *ops, void *backend, char *err, size_t errlen);
void tr_store_free(tr_store *s);

/* Inserts or replaces `count` rows (vectors already unit-normalised). Rows evicted to make room
 * are written to evicted (capacity count) and counted in *n_evicted. */
int tr_store_upsert(tr_store *s, const int64_t *ids, const uint64_t *ns, const int64_t *created,
                    const float *vectors, uint32_t count, int64_t *evicted, uint32_t *n_evicted,
                    char *err, size_t errlen);
int tr_store_delete(tr_store *s, const int64_t *ids, uint32_t count, uint32_t *deleted, char *err,
                    size_t errlen);
uint32_t tr_store_contains(tr_store *s, const int64_t *ids, uint32_t count, uint8_t *present);
/* Up to `max` ids of rows at positions >= *cursor (only namespace `ns` when filtered), in row
 * order; *cursor becomes the position after the last row examined (>= rows: no more). */
uint32_t tr_store_list_ids(const tr_store *s, uint64_t *cursor, int filtered, uint64_t ns, int64_t *out,
                           uint32_t max);
int tr_store_clear(tr_store *s, uint32_t *removed, char *err, size_t errlen);
/* Marks ids (search results) as recently used. */
void tr_store_touch_ids(tr_store *s, const int64_t *ids, uint32_t count);
/* Sets the coordinator's total row count for namespaces. */
int tr_store_set_totals(tr_store *s, const uint64_t *ns, const uint64_t *totals, uint32_t count,
                        char *err, size_t errlen);

#endif
