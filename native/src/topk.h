/* A bounded min-heap that keeps the k best (score, id) pairs: higher score wins, then smaller id. */
#ifndef TR_TOPK_H
#define TR_TOPK_H

#include <stdint.h>

typedef struct tr_topk {
    float *scores;
    int64_t *ids;
    uint32_t size;
    uint32_t k;
} tr_topk;

/* a is worse than b: lower score, or equal score and larger id. */
static inline int tr_topk_worse(float sa, int64_t ia, float sb, int64_t ib) {
    return sa < sb || (sa == sb && ia > ib);
}

static inline void tr_topk_sift_down(tr_topk *h, uint32_t i) {
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->size && tr_topk_worse(h->scores[l], h->ids[l], h->scores[m], h->ids[m])) m = l;
        if (r < h->size && tr_topk_worse(h->scores[r], h->ids[r], h->scores[m], h->ids[m])) m = r;
        if (m == i) return;
        float ts = h->scores[i]; h->scores[i] = h->scores[m]; h->scores[m] = ts;
        int64_t ti = h->ids[i]; h->ids[i] = h->ids[m]; h->ids[m] = ti;
        i = m;
    }
}

static inline void tr_topk_push(tr_topk *h, float score, int64_t id) {
    if (h->size < h->k) {
        uint32_t i = h->size++;
        h->scores[i] = score; h->ids[i] = id;
        while (i > 0) {
            uint32_t p = (i - 1) / 2;
            if (!tr_topk_worse(h->scores[i], h->ids[i], h->scores[p], h->ids[p])) break;
            float ts = h->scores[i]; h->scores[i] = h->scores[p]; h->scores[p] = ts;
            int64_t ti = h->ids[i]; h->ids[i] = h->ids[p]; h->ids[p] = ti;
            i = p;
        }
    } else if (tr_topk_worse(h->scores[0], h->ids[0], score, id)) {
        h->scores[0] = score; h->ids[0] = id;
        tr_topk_sift_down(h, 0);
    }
}

/* The score a candidate must beat to enter (only meaningful once full). */
static inline float tr_topk_floor(const tr_topk *h) {
    return h->size < h->k ? -__builtin_inff() : h->scores[0];
}

/* Empties the heap into ids/scores, best first. */
static inline uint32_t tr_topk_drain_sorted(tr_topk *h, int64_t *ids, float *scores) {
    uint32_t n = h->size;
    for (uint32_t out = n; out > 0; out--) {
        ids[out - 1] = h->ids[0];
        scores[out - 1] = h->scores[0];
        h->size--;
        h->scores[0] = h->scores[h->size];
        h->ids[0] = h->ids[h->size];
        tr_topk_sift_down(h, 0);
    }
    return n;
}

#endif
