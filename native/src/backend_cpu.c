/* The CPU backend: rows in host memory (float32 or float16), exact search with a fused scan and top-k.
 *
 * The reference for every other backend: the CUDA backend is tested against these results.
 * Small tiers scan on the calling thread; large ones split the rows over a persistent pool.
 * With --codes int8 (cpu_codes.c) a search of a tier of at least --codes-min-rows rows scans 8-bit codes of the
 * rows first and re-scores from the rows only those whose bound reaches the k-th best lower bound: the same answer,
 * ids and scores, as the full scan, which also answers when the candidates are too many.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "cpu_codes.h"
#include "threadpool.h"
#include "tiered_recall/layout.h"
#include "topk.h"

/* Below this many vector elements one thread is faster than waking the pool (the scan of the codes: more). */
#define TR_CPU_PARALLEL_ELEMENTS (1u << 21)
#define TR_CPU_CODES_PARALLEL_ELEMENTS (1u << 23)
/* --codes-min-rows's default: a scope of fewer rows (the tier, or the namespace a search is filtered to) is scanned
 * from its rows, which costs less than the codes and the re-scoring of what they leave. A build may set it
 * (-DTR_CPU_CODES_MIN_ROWS=0: every search of a sidecar started with the defaults goes through the codes). */
#ifndef TR_CPU_CODES_MIN_ROWS
#define TR_CPU_CODES_MIN_ROWS 1024u
#endif
/* After a query whose candidates overflowed, the next queries take the full scan at once: first 16, doubling on each
 * overflow in a row up to 1,024 (rows too alike for the codes cost the codes' scan once in that many queries). */
#define TR_CPU_CODES_BACKOFF_MIN 16u
#define TR_CPU_CODES_BACKOFF_MAX 1024u

typedef _Float16 tr_half;

/* One build serves every x86-64 machine (a wheel is built once): the scan is compiled for AVX-512 (x86-64-v4), for
 * AVX2 with FMA and F16C (x86-64-v3) and for the baseline, and the loader picks the best the CPU has. A build tuned
 * for its own machine (TR_NATIVE_ARCH=ON: -march=native) needs no clones. */
#if defined(__x86_64__) && !defined(TR_NATIVE_ARCH_BUILD)
#define TR_SCAN_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TR_SCAN_CLONES
#endif

typedef struct cpu_backend {
    uint32_t dim;
    uint32_t dtype;
    uint64_t capacity;
    uint64_t rows;
    uint32_t max_k;
    void *vectors; /* capacity x dim of float or tr_half */
    int64_t *ids;
    uint64_t *ns;
    tr_threadpool *pool;
    /* per-worker heaps, max_k each */
    float *heap_scores;
    int64_t *heap_ids;
    /* --codes int8 */
    int codes_on;
    uint64_t codes_min_rows; /* of the scope searched: the tier, or the namespace a search is filtered to */
    void *segment;           /* the mapped segment, whose namespace table says a namespace's rows */
    tr_cpu_codes codes;
    tr_codes_scan *scans;  /* one per worker */
    tr_code_cand *cand;    /* cand_cap per worker */
    uint32_t cand_cap;
    int8_t *q1, *q2;       /* the query's terms, dpad each */
    float *merge_scores;   /* max_k: the k best lower bounds over the workers, then the answer */
    int64_t *merge_ids;
    uint32_t backoff, next_backoff; /* queries left to the full scan after an overflow; the next such run */
    uint64_t *code_scans, *code_fallbacks; /* the header's counters */
} cpu_backend;

static void cpu_destroy(void *self) {
    cpu_backend *b = self;
    if (!b) return;
    if (b->pool) tr_threadpool_destroy(b->pool);
    free(b->vectors); free(b->ids); free(b->ns); free(b->heap_scores); free(b->heap_ids);
    tr_cpu_codes_free(&b->codes);
    free(b->scans); free(b->cand); free(b->q1); free(b->q2); free(b->merge_scores); free(b->merge_ids);
    free(b);
}

/* The codes, and per worker a scan state and a list of candidates: a quarter of its share of a full tier, at least
 * 512 (cpu_codes.c's admit says what a full list does). Re-scoring a quarter of the rows from the rows reads as many
 * bytes as the scan of the codes of them all (f32 rows), and the full scan four times that. */
static int setup_codes(cpu_backend *b, const tr_backend_config *cfg, uint32_t workers, char *err, size_t errlen) {
    if (tr_cpu_codes_init(&b->codes, cfg->dim, cfg->capacity, cfg->cpu_isa, err, errlen) != 0) return -1;
    b->codes_on = 1;
    b->codes_min_rows = cfg->codes_min_rows == UINT64_MAX ? TR_CPU_CODES_MIN_ROWS : cfg->codes_min_rows;
    b->segment = cfg->segment;
    const uint64_t share = cfg->capacity / workers / 4;
    b->cand_cap = share < 512 ? 512u : (share > (1u << 30) ? (1u << 30) : (uint32_t)share);
    b->scans = calloc(workers, sizeof *b->scans);
    b->cand = malloc((size_t)workers * b->cand_cap * sizeof *b->cand);
    b->q1 = aligned_alloc(64, b->codes.dpad);
    b->q2 = aligned_alloc(64, b->codes.dpad);
    b->merge_scores = calloc(cfg->max_k, sizeof(float));
    b->merge_ids = calloc(cfg->max_k, sizeof(int64_t));
    b->code_scans = cfg->code_scans;
    b->code_fallbacks = cfg->code_fallbacks;
    b->next_backoff = TR_CPU_CODES_BACKOFF_MIN;
    if (!b->scans || !b->cand || !b->q1 || !b->q2 || !b->merge_scores || !b->merge_ids) {
        snprintf(err, errlen, "cannot allocate the codes' search state: lower --capacity, or --codes off");
        return -1;
    }
    return 0;
}

static void *cpu_create(const tr_backend_config *cfg, char *err, size_t errlen) {
    cpu_backend *b = calloc(1, sizeof *b);
    if (!b) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    b->dim = cfg->dim;
    b->dtype = cfg->dtype;
    b->capacity = cfg->capacity;
    b->max_k = cfg->max_k;
    size_t elem = cfg->dtype == TR_DTYPE_F16 ? 2 : 4;
    b->vectors = aligned_alloc(64, TR_ALIGN64((size_t)cfg->capacity * cfg->dim * elem));
    b->ids = calloc(cfg->capacity ? cfg->capacity : 1, sizeof(int64_t));
    b->ns = calloc(cfg->capacity ? cfg->capacity : 1, sizeof(uint64_t));
    uint32_t threads = cfg->threads;
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (uint32_t)n : 1;
    }
    if (threads > 256) threads = 256; /* cpu_search keeps per-worker state on its stack */
    b->pool = tr_threadpool_create(threads);
    uint32_t workers = b->pool ? tr_threadpool_size(b->pool) : 1;
    b->heap_scores = calloc((size_t)workers * cfg->max_k, sizeof(float));
    b->heap_ids = calloc((size_t)workers * cfg->max_k, sizeof(int64_t));
    if (!b->vectors || !b->ids || !b->ns || !b->pool || !b->heap_scores || !b->heap_ids) {
        snprintf(err, errlen, "cannot allocate %llu rows of dim %u: lower --capacity",
                 (unsigned long long)cfg->capacity, cfg->dim);
        cpu_destroy(b);
        return NULL;
    }
    if (cfg->codes == TR_CODES_INT8 && setup_codes(b, cfg, workers, err, errlen) != 0) {
        cpu_destroy(b);
        return NULL;
    }
    return b;
}

static int cpu_write_rows(void *self, const uint64_t *rows, uint32_t n, const float *vectors,
                          const int64_t *ids, const uint64_t *ns, char *err, size_t errlen) {
    cpu_backend *b = self;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t r = rows[i];
        if (r >= b->capacity) {
            snprintf(err, errlen, "internal: row %llu beyond capacity", (unsigned long long)r);
            return TR_E_INTERNAL;
        }
        const float *src = vectors + (size_t)i * b->dim;
        if (b->dtype == TR_DTYPE_F16) {
            tr_half *dst = (tr_half *)b->vectors + (size_t)r * b->dim;
            for (uint32_t j = 0; j < b->dim; j++) dst[j] = (tr_half)src[j];
        } else {
            memcpy((float *)b->vectors + (size_t)r * b->dim, src, (size_t)b->dim * 4);
        }
        b->ids[r] = ids[i];
        b->ns[r] = ns[i];
        if (b->codes_on) {
            if (b->dtype == TR_DTYPE_F16) { /* the codes encode the row as stored */
                float stored[TR_MAX_DIM];
                const tr_half *h = (const tr_half *)b->vectors + (size_t)r * b->dim;
                for (uint32_t j = 0; j < b->dim; j++) stored[j] = (float)h[j];
                tr_cpu_codes_write(&b->codes, r, stored);
            } else {
                tr_cpu_codes_write(&b->codes, r, src);
            }
        }
    }
    return 0;
}

static int cpu_move_row(void *self, uint64_t dst, uint64_t src, char *err, size_t errlen) {
    cpu_backend *b = self;
    (void)err; (void)errlen;
    size_t elem = b->dtype == TR_DTYPE_F16 ? 2 : 4;
    memmove((char *)b->vectors + dst * b->dim * elem, (char *)b->vectors + src * b->dim * elem,
            (size_t)b->dim * elem);
    b->ids[dst] = b->ids[src];
    b->ns[dst] = b->ns[src];
    if (b->codes_on) tr_cpu_codes_move(&b->codes, dst, src);
    return 0;
}

static int cpu_set_row_count(void *self, uint64_t rows, char *err, size_t errlen) {
    cpu_backend *b = self;
    (void)err; (void)errlen;
    b->rows = rows;
    return 0;
}

static inline float dot_f32(const float *restrict a, const float *restrict q, uint32_t d) {
    float acc = 0.0f;
    for (uint32_t i = 0; i < d; i++) acc += a[i] * q[i];
    return acc;
}

static inline float dot_f16(const tr_half *restrict a, const float *restrict q, uint32_t d) {
    float acc = 0.0f;
    for (uint32_t i = 0; i < d; i++) acc += (float)a[i] * q[i];
    return acc;
}

typedef struct scan_job {
    cpu_backend *b;
    const float *query;
    uint32_t k;
    int filter_ns;
    uint64_t ns_hash;
    uint32_t *heap_sizes; /* one per worker */
} scan_job;

TR_SCAN_CLONES static void scan_task(void *arg, uint32_t worker, uint32_t workers) {
    scan_job *job = arg;
    cpu_backend *b = job->b;
    uint64_t per = (b->rows + workers - 1) / workers;
    uint64_t start = (uint64_t)worker * per;
    uint64_t end = start + per < b->rows ? start + per : b->rows;
    tr_topk heap = {b->heap_scores + (size_t)worker * b->max_k,
                    b->heap_ids + (size_t)worker * b->max_k, 0, job->k};
    const uint32_t d = b->dim;
    const float *q = job->query;
    float floor = -__builtin_inff();
    for (uint64_t r = start; r < end; r++) {
        if (job->filter_ns && b->ns[r] != job->ns_hash) continue;
        float s = b->dtype == TR_DTYPE_F16 ? dot_f16((const tr_half *)b->vectors + r * d, q, d)
                                           : dot_f32((const float *)b->vectors + r * d, q, d);
        if (s < floor) continue;
        tr_topk_push(&heap, s, b->ids[r]);
        floor = tr_topk_floor(&heap);
    }
    job->heap_sizes[worker] = heap.size;
}

/* The full scan's score of one row: re-scores the candidates of the scan of the codes. The same compiled loop as
 * scan_task's (each clone inlines the same dot), so a re-scored row gets the very score the full scan gives it. */
typedef struct score_ctx {
    const cpu_backend *b;
    const float *query;
} score_ctx;

TR_SCAN_CLONES __attribute__((noinline)) static float row_score(void *arg, uint64_t r) {
    const score_ctx *c = arg;
    const cpu_backend *b = c->b;
    const uint32_t d = b->dim;
    return b->dtype == TR_DTYPE_F16 ? dot_f16((const tr_half *)b->vectors + r * d, c->query, d)
                                    : dot_f32((const float *)b->vectors + r * d, c->query, d);
}

typedef struct codes_job {
    cpu_backend *b;
    score_ctx score;
    uint32_t k;
    int filter_ns;
    uint64_t ns_hash;
    tr_code_query qc;
    int abort;          /* a worker's candidates overflowed */
    int overflow[256];  /* per worker */
} codes_job;

static void codes_task(void *arg, uint32_t worker, uint32_t workers) {
    codes_job *job = arg;
    cpu_backend *b = job->b;
    const uint64_t blocks = (b->rows + TR_CODE_BLOCK - 1) / TR_CODE_BLOCK;
    const uint64_t per = (blocks + workers - 1) / workers;
    const uint64_t start = (uint64_t)worker * per < blocks ? (uint64_t)worker * per : blocks;
    const uint64_t end = start + per < blocks ? start + per : blocks;
    tr_codes_scan *s = &b->scans[worker];
    s->codes = &b->codes;
    s->ns = b->ns;
    s->filter_ns = job->filter_ns;
    s->ns_hash = job->ns_hash;
    s->q1 = b->q1;
    s->q2 = b->q2;
    s->qc = job->qc;
    /* a filtered block whose matching rows' own bytes are fewer than the block's codes: score them from the rows */
    s->exact_max = b->dtype == TR_DTYPE_F16 ? 8u : 4u;
    s->score = row_score;
    s->score_ctx = &job->score;
    s->abort = &job->abort;
    s->heap = (tr_topk){b->heap_scores + (size_t)worker * b->max_k, b->heap_ids + (size_t)worker * b->max_k, 0,
                        job->k};
    s->cand = b->cand + (size_t)worker * b->cand_cap;
    s->ncand = 0;
    /* a quarter of this worker's rows (end - start blocks of 16), at least 512 */
    const uint64_t cap = 4 * (end - start) < 512 ? 512 : 4 * (end - start);
    s->cap = cap < b->cand_cap ? (uint32_t)cap : b->cand_cap;
    job->overflow[worker] = start < end ? tr_codes_scan_blocks(s, start, end, b->rows) : 0;
}

/* One query through the codes: 0 with the answer in ids/scores (k each, *hits filled), or 1 when the candidates
 * overflowed (nothing written: the full scan answers). */
static int search_codes(cpu_backend *b, const float *q, uint32_t k, int filter_ns, uint64_t ns_hash, int64_t *ids,
                        float *scores, uint32_t *hits) {
    codes_job job;
    memset(&job, 0, sizeof job);
    job.b = b;
    job.score = (score_ctx){b, q};
    job.k = k;
    job.filter_ns = filter_ns;
    job.ns_hash = ns_hash;
    tr_codes_encode_query(q, b->dim, b->codes.dpad, b->q1, b->q2, &job.qc);
    uint32_t workers = tr_threadpool_size(b->pool);
    if ((uint64_t)b->rows * b->dim < TR_CPU_CODES_PARALLEL_ELEMENTS) workers = 1;
    if (workers > 256) workers = 256;
    tr_threadpool_run(b->pool, workers, codes_task, &job);
    const uint32_t used = workers <= 1 ? 1 : tr_threadpool_size(b->pool);
    for (uint32_t w = 0; w < used; w++)
        if (job.overflow[w]) return 1;
    /* the k-th best lower bound over every row: no row whose upper bound is below it can be in the top k */
    tr_topk lows = {b->merge_scores, b->merge_ids, 0, k};
    for (uint32_t w = 0; w < used; w++) {
        const tr_topk *h = &b->scans[w].heap;
        for (uint32_t i = 0; i < h->size; i++) tr_topk_push(&lows, h->scores[i], h->ids[i]);
    }
    const float kth = tr_topk_floor(&lows);
    tr_topk best = {b->merge_scores, b->merge_ids, 0, k};
    for (uint32_t w = 0; w < used; w++) {
        const tr_codes_scan *s = &b->scans[w];
        for (uint32_t i = 0; i < s->ncand; i++) {
            const tr_code_cand *c = &s->cand[i];
            if (c->hi < kth) continue;
            tr_topk_push(&best, c->exact ? c->hi : row_score(&job.score, c->row), b->ids[c->row]);
        }
    }
    const uint32_t n = tr_topk_drain_sorted(&best, ids, scores);
    for (uint32_t i = n; i < k; i++) {
        ids[i] = -1;
        scores[i] = -INFINITY;
    }
    *hits = n;
    return 0;
}

/* One query by the full scan of the rows. */
static void search_full(cpu_backend *b, const float *q, uint32_t k, int filter_ns, uint64_t ns_hash, int64_t *ids,
                        float *scores, uint32_t *hits) {
    uint32_t workers = tr_threadpool_size(b->pool);
    if ((uint64_t)b->rows * b->dim < TR_CPU_PARALLEL_ELEMENTS) workers = 1;
    uint32_t heap_sizes[256];
    if (workers > 256) workers = 256;
    scan_job job = {b, q, k, filter_ns, ns_hash, heap_sizes};
    tr_threadpool_run(b->pool, workers, scan_task, &job);
    uint32_t used = workers <= 1 ? 1 : tr_threadpool_size(b->pool);
    /* merge the workers' heaps into worker 0's */
    tr_topk merged = {b->heap_scores, b->heap_ids, heap_sizes[0], k};
    for (uint32_t w = 1; w < used; w++) {
        const float *ws = b->heap_scores + (size_t)w * b->max_k;
        const int64_t *wi = b->heap_ids + (size_t)w * b->max_k;
        for (uint32_t i = 0; i < heap_sizes[w]; i++) tr_topk_push(&merged, ws[i], wi[i]);
    }
    uint32_t n = tr_topk_drain_sorted(&merged, ids, scores);
    for (uint32_t i = n; i < k; i++) {
        ids[i] = -1;
        scores[i] = -INFINITY;
    }
    *hits = n;
}

/* The rows a search can find: the tier's, or the namespace's it is filtered to. A scope below --codes-min-rows is
 * scanned from its rows, in a tier of any size: the codes' bounds prune little there, and the candidates they leave
 * are re-scored from the rows anyway. */
static uint64_t scope_rows(const cpu_backend *b, int filter_ns, uint64_t ns_hash) {
    if (!filter_ns || !b->segment) return b->rows;
    return tr_ns_hot_rows(b->segment, (const tr_header *)b->segment, ns_hash);
}

static int cpu_search(void *self, const float *queries, uint32_t nq, uint32_t k, int filter_ns,
                      uint64_t ns_hash, int64_t *ids_out, float *scores_out, uint32_t *hits,
                      char *err, size_t errlen) {
    cpu_backend *b = self;
    (void)err; (void)errlen;
    *hits = 0;
    for (uint32_t qi = 0; qi < nq; qi++) {
        const float *q = queries + (size_t)qi * b->dim;
        int64_t *ids = ids_out + (size_t)qi * k;
        float *scores = scores_out + (size_t)qi * k;
        int codes = b->codes_on && b->rows > 0 && scope_rows(b, filter_ns, ns_hash) >= b->codes_min_rows;
        if (codes && b->backoff) {
            b->backoff--;
            codes = 0;
        }
        if (codes) {
            (*b->code_scans)++;
            if (search_codes(b, q, k, filter_ns, ns_hash, ids, scores, hits) == 0) {
                b->next_backoff = TR_CPU_CODES_BACKOFF_MIN;
                continue;
            }
            (*b->code_fallbacks)++;
            b->backoff = b->next_backoff;
            b->next_backoff = b->next_backoff * 2 > TR_CPU_CODES_BACKOFF_MAX ? TR_CPU_CODES_BACKOFF_MAX
                                                                              : b->next_backoff * 2;
        }
        search_full(b, q, k, filter_ns, ns_hash, ids, scores, hits);
    }
    return 0;
}

const tr_backend_ops tr_cpu_backend = {
    .name = "cpu",
    .kind = TR_BACKEND_CPU,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .write_rows = cpu_write_rows,
    .move_row = cpu_move_row,
    .set_row_count = cpu_set_row_count,
    .search = cpu_search,
};
