/* The CPU backend: rows in host memory (float32 or float16), exact search with a fused scan and top-k.
 *
 * The reference for every other backend: the CUDA backend is tested against these results.
 * Small tiers scan on the calling thread; large ones split the rows over a persistent pool.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "threadpool.h"
#include "tiered_recall/layout.h"
#include "topk.h"

/* Below this many vector elements one thread is faster than waking the pool. */
#define TR_CPU_PARALLEL_ELEMENTS (1u << 21)

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
} cpu_backend;

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
        free(b->vectors); free(b->ids); free(b->ns); free(b->heap_scores); free(b->heap_ids);
        if (b->pool) tr_threadpool_destroy(b->pool);
        free(b);
        return NULL;
    }
    return b;
}

static void cpu_destroy(void *self) {
    cpu_backend *b = self;
    if (!b) return;
    tr_threadpool_destroy(b->pool);
    free(b->vectors); free(b->ids); free(b->ns); free(b->heap_scores); free(b->heap_ids);
    free(b);
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

static int cpu_search(void *self, const float *queries, uint32_t nq, uint32_t k, int filter_ns,
                      uint64_t ns_hash, int64_t *ids_out, float *scores_out, uint32_t *hits,
                      char *err, size_t errlen) {
    cpu_backend *b = self;
    (void)err; (void)errlen;
    uint32_t workers = tr_threadpool_size(b->pool);
    if ((uint64_t)b->rows * b->dim < TR_CPU_PARALLEL_ELEMENTS) workers = 1;
    uint32_t heap_sizes[256];
    if (workers > 256) workers = 256;
    *hits = 0;
    for (uint32_t qi = 0; qi < nq; qi++) {
        scan_job job = {b, queries + (size_t)qi * b->dim, k, filter_ns, ns_hash, heap_sizes};
        tr_threadpool_run(b->pool, workers, scan_task, &job);
        uint32_t used = workers <= 1 ? 1 : tr_threadpool_size(b->pool);
        /* merge the workers' heaps into worker 0's */
        tr_topk merged = {b->heap_scores, b->heap_ids, heap_sizes[0], k};
        for (uint32_t w = 1; w < used; w++) {
            const float *ws = b->heap_scores + (size_t)w * b->max_k;
            const int64_t *wi = b->heap_ids + (size_t)w * b->max_k;
            for (uint32_t i = 0; i < heap_sizes[w]; i++) tr_topk_push(&merged, ws[i], wi[i]);
        }
        uint32_t n = tr_topk_drain_sorted(&merged, ids_out + (size_t)qi * k, scores_out + (size_t)qi * k);
        for (uint32_t i = n; i < k; i++) {
            ids_out[(size_t)qi * k + i] = -1;
            scores_out[(size_t)qi * k + i] = -INFINITY;
        }
        *hits = n;
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
