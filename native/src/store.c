/* Row bookkeeping of the hot tier: id -> row map, LRU list, dense rows, per-namespace counts. */
#include "store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAP_EMPTY (-1)
#define MAP_DELETED (-2)


int tr_store_init(tr_store *s, uint32_t dim, uint64_t capacity, uint32_t max_upsert_rows,
                  tr_ns_entry *ns_table, uint32_t ns_entries, uint64_t *namespaces_counter,
                  const tr_backend_ops *ops, void *backend, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    s->dim = dim;
    s->capacity = capacity;
    s->lru_head = s->lru_tail = -1;
    uint64_t map_size = 16;
    while (map_size < capacity * 2) map_size <<= 1;
    s->map_mask = map_size - 1;
    size_t cap = capacity ? capacity : 1;
    s->ids = malloc(cap * sizeof(int64_t));
    s->ns = malloc(cap * sizeof(uint64_t));
    s->created = malloc(cap * sizeof(int64_t));
    s->lru_prev = malloc(cap * sizeof(int64_t));
    s->lru_next = malloc(cap * sizeof(int64_t));
    s->map_keys = malloc(map_size * sizeof(int64_t));
    s->map_rows = malloc(map_size * sizeof(int64_t));
    s->scratch_rows = malloc((max_upsert_rows ? max_upsert_rows : 1) * sizeof(uint64_t));
    if (!s->ids || !s->ns || !s->created || !s->lru_prev || !s->lru_next || !s->map_keys ||
        !s->map_rows || !s->scratch_rows) {
        snprintf(err, errlen, "cannot allocate bookkeeping for %llu rows: lower --capacity",
                 (unsigned long long)capacity);
        tr_store_free(s);
        return TR_E_INTERNAL;
    }
    for (uint64_t i = 0; i < map_size; i++) s->map_rows[i] = MAP_EMPTY;
    s->ns_table = ns_table;
    s->ns_entries = ns_entries;
    s->namespaces = namespaces_counter;
    s->ops = ops;
    s->backend = backend;
    return 0;
}

void tr_store_free(tr_store *s) {
    free(s->ids); free(s->ns); free(s->created); free(s->lru_prev); free(s->lru_next);
    free(s->map_keys); free(s->map_rows); free(s->scratch_rows);
    memset(s, 0, sizeof *s);
}

/* ---- id map ---- */

static int64_t map_find_slot(const tr_store *s, int64_t id) {
    uint64_t i = tr_mix64((uint64_t)id) & s->map_mask;
    for (;;) {
        int64_t r = s->map_rows[i];
        if (r == MAP_EMPTY) return -1;
        if (r >= 0 && s->map_keys[i] == id) return (int64_t)i;
        i = (i + 1) & s->map_mask;
    }
}

static int64_t map_get(const tr_store *s, int64_t id) {
    int64_t slot = map_find_slot(s, id);
    return slot < 0 ? -1 : s->map_rows[slot];
}

static void map_rebuild(tr_store *s) {
    s->map_deleted = 0;
    for (uint64_t i = 0; i <= s->map_mask; i++) s->map_rows[i] = MAP_EMPTY;
    for (uint64_t r = 0; r < s->rows; r++) {
        uint64_t i = tr_mix64((uint64_t)s->ids[r]) & s->map_mask;
        while (s->map_rows[i] != MAP_EMPTY) i = (i + 1) & s->map_mask;
        s->map_keys[i] = s->ids[r];
        s->map_rows[i] = (int64_t)r;
    }
}

static void map_put(tr_store *s, int64_t id, int64_t row) {
    uint64_t i = tr_mix64((uint64_t)id) & s->map_mask;
    int64_t first_deleted = -1;
    for (;;) {
        int64_t r = s->map_rows[i];
        if (r == MAP_EMPTY) break;
        if (r == MAP_DELETED) {
            if (first_deleted < 0) first_deleted = (int64_t)i;
        } else if (s->map_keys[i] == id) {
            s->map_rows[i] = row;
            return;
        }
        i = (i + 1) & s->map_mask;
    }
    if (first_deleted >= 0) {
        i = (uint64_t)first_deleted;
        s->map_deleted--;
    }
    s->map_keys[i] = id;
    s->map_rows[i] = row;
}

static void map_remove(tr_store *s, int64_t id) {
    int64_t slot = map_find_slot(s, id);
    if (slot >= 0) {
        s->map_rows[slot] = MAP_DELETED;
        s->map_deleted++;
    }
}

/* Deleted markers lengthen probes (and a map with no empty entry would never end a probe). */
static void map_maybe_rebuild(tr_store *s) {
    if (s->map_deleted > (s->map_mask + 1) / 4) map_rebuild(s);
}

/* ---- LRU list ---- */

static void lru_unlink(tr_store *s, int64_t r) {
    int64_t p = s->lru_prev[r], n = s->lru_next[r];
    if (p >= 0) s->lru_next[p] = n; else s->lru_head = n;
    if (n >= 0) s->lru_prev[n] = p; else s->lru_tail = p;
}

static void lru_push_front(tr_store *s, int64_t r) {
    s->lru_prev[r] = -1;
    s->lru_next[r] = s->lru_head;
    if (s->lru_head >= 0) s->lru_prev[s->lru_head] = r;
    s->lru_head = r;
    if (s->lru_tail < 0) s->lru_tail = r;
}

static void lru_touch(tr_store *s, int64_t r) {
    if (s->lru_head == r) return;
    lru_unlink(s, r);
    lru_push_front(s, r);
}

/* Row src moves to dst: patch the list neighbours to point at dst. */
static void lru_move(tr_store *s, int64_t dst, int64_t src) {
    int64_t p = s->lru_prev[src], n = s->lru_next[src];
    s->lru_prev[dst] = p;
    s->lru_next[dst] = n;
    if (p >= 0) s->lru_next[p] = dst; else s->lru_head = dst;
    if (n >= 0) s->lru_prev[n] = dst; else s->lru_tail = dst;
}

/* ---- namespace table ---- */

static tr_ns_entry *ns_find(tr_store *s, uint64_t h, int create) {
    if (h == 0) h = 1; /* 0 marks an empty entry; namespace_hash() never returns 0 */
    const uint32_t i = tr_ns_probe(s->ns_table, s->ns_entries, h);
    if (i == s->ns_entries) return NULL; /* full */
    tr_ns_entry *e = &s->ns_table[i];
    if (__atomic_load_n(&e->ns_hash, __ATOMIC_ACQUIRE) == h) return e;
    if (!create) return NULL;
    e->hot_rows = 0;
    e->total_rows = 0;
    __atomic_store_n(&e->ns_hash, h, __ATOMIC_RELEASE);
    (*s->namespaces)++;
    return e;
}

static void ns_add(tr_store *s, uint64_t h, int64_t delta) {
    tr_ns_entry *e = ns_find(s, h, 1);
    if (e) __atomic_store_n(&e->hot_rows, e->hot_rows + (uint64_t)delta, __ATOMIC_RELEASE);
}

/* ---- rows ---- */

/* Removes row r by moving the last row into it, keeping rows dense for the scan. */
static int remove_row(tr_store *s, int64_t r, char *err, size_t errlen) {
    int64_t last = (int64_t)s->rows - 1;
    ns_add(s, s->ns[r], -1);
    map_remove(s, s->ids[r]);
    lru_unlink(s, r);
    if (r != last) {
        int rc = s->ops->move_row(s->backend, (uint64_t)r, (uint64_t)last, err, errlen);
        if (rc) return rc;
        s->ids[r] = s->ids[last];
        s->ns[r] = s->ns[last];
        s->created[r] = s->created[last];
        lru_move(s, r, last);
        map_put(s, s->ids[r], r);
    }
    s->rows--;
    map_maybe_rebuild(s);
    return s->ops->set_row_count(s->backend, s->rows, err, errlen);
}

int tr_store_upsert(tr_store *s, const int64_t *ids, const uint64_t *ns, const int64_t *created,
                    const float *vectors, uint32_t count, int64_t *evicted, uint32_t *n_evicted,
                    char *err, size_t errlen) {
    *n_evicted = 0;
    if (count > s->capacity) {
        snprintf(err, errlen, "%u rows exceed the hot tier's capacity of %llu: send fewer rows or "
                 "restart the sidecar with a larger --capacity", count, (unsigned long long)s->capacity);
        return TR_E_FULL;
    }
    for (uint32_t i = 0; i < count; i++) {
        if (!ns_find(s, ns[i], 1)) {
            snprintf(err, errlen, "the namespace table (%u entries) is full: restart the sidecar "
                     "with more --namespaces", s->ns_entries);
            return TR_E_NS_TABLE_FULL;
        }
    }
    /* Pass 1: rows that exist are replaced in place and become most recent, so the evictions
     * below can never pick a row of this batch. */
    uint32_t fresh = 0;
    for (uint32_t i = 0; i < count; i++) {
        int64_t r = map_get(s, ids[i]);
        int dup_later = 0;
        for (uint32_t j = i + 1; j < count && !dup_later; j++) dup_later = ids[j] == ids[i];
        if (dup_later) {
            s->scratch_rows[i] = UINT64_MAX; /* the last copy of an id wins */
            continue;
        }
        if (r >= 0) {
            if (s->ns[r] != ns[i]) {
                ns_add(s, s->ns[r], -1);
                ns_add(s, ns[i], +1);
            }
            s->ns[r] = ns[i];
            s->created[r] = created[i];
            lru_touch(s, r);
            s->scratch_rows[i] = (uint64_t)r;
        } else {
            s->scratch_rows[i] = UINT64_MAX - 1; /* needs a new row */
            fresh++;
        }
    }
    uint64_t free_rows = s->capacity - s->rows;
    while (fresh > free_rows) {
        int64_t victim = s->lru_tail;
        evicted[(*n_evicted)++] = s->ids[victim];
        int rc = remove_row(s, victim, err, errlen);
        if (rc) return rc;
        free_rows++;
    }
    /* An eviction moves the last row into the freed one, and that last row can be one this batch replaces:
     * find the replaced rows again, or their vectors would land in a row another id then takes. */
    if (*n_evicted)
        for (uint32_t i = 0; i < count; i++)
            if (s->scratch_rows[i] < UINT64_MAX - 1) s->scratch_rows[i] = (uint64_t)map_get(s, ids[i]);
    for (uint32_t i = 0; i < count; i++) {
        if (s->scratch_rows[i] != UINT64_MAX - 1) continue;
        int64_t r = (int64_t)s->rows++;
        s->ids[r] = ids[i];
        s->ns[r] = ns[i];
        s->created[r] = created[i];
        lru_push_front(s, r);
        map_put(s, ids[i], r);
        ns_add(s, ns[i], +1);
        s->scratch_rows[i] = (uint64_t)r;
    }
    /* Write the vectors in runs (superseded duplicates split runs), then publish the count. */
    for (uint32_t i = 0; i < count;) {
        if (s->scratch_rows[i] == UINT64_MAX) {
            i++;
            continue;
        }
        uint32_t end = i;
        while (end < count && s->scratch_rows[end] != UINT64_MAX) end++;
        int rc = s->ops->write_rows(s->backend, s->scratch_rows + i, end - i,
                                    vectors + (size_t)i * s->dim, ids + i, ns + i, err, errlen);
        if (rc) return rc;
        i = end;
    }
    map_maybe_rebuild(s);
    return s->ops->set_row_count(s->backend, s->rows, err, errlen);
}

int tr_store_delete(tr_store *s, const int64_t *ids, uint32_t count, uint32_t *deleted, char *err,
                    size_t errlen) {
    *deleted = 0;
    for (uint32_t i = 0; i < count; i++) {
        int64_t r = map_get(s, ids[i]);
        if (r < 0) continue;
        int rc = remove_row(s, r, err, errlen);
        if (rc) return rc;
        (*deleted)++;
    }
    map_maybe_rebuild(s);
    return 0;
}

uint32_t tr_store_contains(tr_store *s, const int64_t *ids, uint32_t count, uint8_t *present) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < count; i++) {
        present[i] = map_get(s, ids[i]) >= 0;
        n += present[i];
    }
    return n;
}

uint32_t tr_store_list_ids(const tr_store *s, uint64_t *cursor, int filtered, uint64_t ns, int64_t *out,
                           uint32_t max) {
    uint32_t n = 0;
    uint64_t r = *cursor;
    for (; r < s->rows && n < max; r++)
        if (!filtered || s->ns[r] == ns) out[n++] = s->ids[r];
    *cursor = r;
    return n;
}

int tr_store_clear(tr_store *s, uint32_t *removed, char *err, size_t errlen) {
    *removed = (uint32_t)s->rows;
    for (uint64_t r = 0; r < s->rows; r++) ns_add(s, s->ns[r], -1);
    s->rows = 0;
    s->lru_head = s->lru_tail = -1;
    map_rebuild(s);
    return s->ops->set_row_count(s->backend, 0, err, errlen);
}

void tr_store_touch_ids(tr_store *s, const int64_t *ids, uint32_t count) {
    for (uint32_t i = 0; i < count; i++) {
        int64_t r = map_get(s, ids[i]);
        if (r >= 0) lru_touch(s, r);
    }
}

int tr_store_set_totals(tr_store *s, const uint64_t *ns, const uint64_t *totals, uint32_t count,
                        char *err, size_t errlen) {
    for (uint32_t i = 0; i < count; i++) {
        tr_ns_entry *e = ns_find(s, ns[i], 1);
        if (!e) {
            snprintf(err, errlen, "the namespace table (%u entries) is full: restart the sidecar "
                     "with more --namespaces", s->ns_entries);
            return TR_E_NS_TABLE_FULL;
        }
        __atomic_store_n(&e->total_rows, totals[i], __ATOMIC_RELEASE);
    }
    return 0;
}
