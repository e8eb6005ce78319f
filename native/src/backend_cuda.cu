/* The CUDA backend: hot vectors in device memory (f16 or f32), exact top-k in one fused pass.
 *
 * Search paths: batches of up to TR_BQ_MAX f16 queries with k <= TR_BQ_MAX_K go to the persistent
 * kernel while it runs (persist_kernel, below: no launch per request); everything else, and every
 * search when TR_CUDA_PERSIST=0, is launched per batch (batch_scan_kernel) or per query:
 *
 * Search path (launch per request, host thread drives it):
 *   - the query (unit-normalised f32, already checked by the server) travels inside the kernel's
 *     parameters when dim <= TR_CUDA_INLINE_DIM (no copy at all); larger dims or several queries
 *     go through one pinned host buffer that the kernel reads through its mapped device pointer;
 *   - each block stages the query into shared memory once, scores its contiguous run of rows
 *     (16-byte loads, two rows in flight per warp, namespace filter in the same pass) and keeps
 *     its own top-k in a shared candidate buffer (admit >= threshold, bitonic flush when full);
 *   - the last block to finish (threadfence + ticket) merges the per-block lists, pruned by the
 *     best per-block k-th score, and writes ids, scores and the hit count straight into pinned,
 *     mapped host memory; the host synchronises once (spin) and copies k results out.
 * Writes: rows are converted on the host into a pinned staging buffer and scattered by one kernel
 * per batch on the same stream as searches, so a search never sees a half-written row; the row
 * count used by a search is the host's, published only after the write was enqueued before it.
 *
 * Order: best first, equal scores by smaller id (the CPU backend's order, backend_cpu.c).
 * Compile report: nvcc -Xptxas=-v (CMakeLists.txt adds it); the kernels must show 0 spill bytes.
 */
#include <cuda_fp16.h>
#include <cuda_pipeline.h> /* row_cache_fill */
#include <cuda_runtime.h>
#if defined(__x86_64__)
#include <emmintrin.h> /* store16 */
#endif

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "platform.h" /* tr_cache_demote */
#include "tiered_recall/layout.h"

#define TR_CUDA_BLOCK 256                 /* threads per scan block: 8 warps */
#define TR_CUDA_WARPS (TR_CUDA_BLOCK / 32)
#define TR_CUDA_ROWS_PER_WARP 16           /* rows one warp scores per round */
#define TR_CUDA_ROUND (TR_CUDA_WARPS * TR_CUDA_ROWS_PER_WARP) /* 128 rows per block round */
#define TR_CUDA_CAND 512                   /* candidate buffer; >= TR_MAX_K + TR_CUDA_ROUND */
#define TR_CUDA_MIN_ROWS_PER_BLOCK 32
#define TR_CUDA_BLOCKS_PER_SM 2
#define TR_CUDA_MAX_GRID (2 * TR_CUDA_BLOCK) /* the merge walks at most two lists per thread */
#define TR_CUDA_INLINE_DIM 1024            /* queries up to this dim ride in kernel parameters */
#define TR_CUDA_CHUNK 4                    /* 16-byte loads per lane per step of a row */

static_assert(TR_CUDA_CAND >= TR_MAX_K + TR_CUDA_ROUND, "candidate buffer too small for max k");
static_assert((TR_CUDA_CAND & (TR_CUDA_CAND - 1)) == 0, "candidate buffer must be a power of two");

#define CUDA_TRY(call)                                                                            \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            snprintf(err, errlen, "CUDA error %s (%s) at %s:%d in %s", cudaGetErrorName(e_),      \
                     cudaGetErrorString(e_), __FILE__, __LINE__, #call);                          \
            return TR_E_INTERNAL;                                                                 \
        }                                                                                         \
    } while (0)

/* ------------------------------------------------------------------------------------------ */
/* device code                                                                                 */

struct SearchParams {
    const uint4 *X;          /* rows x nvec uint4 */
    const int64_t *ids;      /* row -> id */
    const uint64_t *ns;      /* row -> namespace hash */
    const float *qptr;       /* device view of the query (non-inline variant) */
    float *part_s;           /* grid x k partial scores */
    long long *part_id;      /* grid x k partial ids */
    unsigned *part_n;        /* grid */
    unsigned *done;          /* ticket counter, reset by the last block */
    long long *out_ids;      /* mapped host memory: k ids */
    float *out_s;            /* mapped host memory: k scores */
    unsigned *out_hits;      /* mapped host memory: 1 */
    unsigned long long rows;
    unsigned long long rows_per_block;
    unsigned long long ns_hash;
    unsigned nvec;           /* uint4 per row */
    unsigned ld;             /* elements per row (padded) */
    unsigned dim;
    unsigned k;
    int filter;
};

template <int N>
struct QueryInline {
    float q[N];
};

struct Cand {
    float s[TR_CUDA_CAND];
    long long id[TR_CUDA_CAND];
    unsigned n;
    float thresh;
};

/* a is better than b: higher score, then smaller id. */
__device__ __forceinline__ bool better(float sa, long long ia, float sb, long long ib) {
    return sa > sb || (sa == sb && ia < ib);
}

/* Sorts c.s/c.id[0, n) best first (bitonic over the next power of two), keeps min(n, k). */
__device__ void flush(Cand &c, unsigned k) {
    __syncthreads();
    const unsigned n = c.n < TR_CUDA_CAND ? c.n : TR_CUDA_CAND;
    unsigned n2 = 2;
    while (n2 < n) n2 <<= 1;
    for (unsigned i = n + threadIdx.x; i < n2; i += blockDim.x) {
        c.s[i] = -INFINITY;
        c.id[i] = LLONG_MAX;
    }
    __syncthreads();
    for (unsigned size = 2; size <= n2; size <<= 1) {
        for (unsigned stride = size >> 1; stride > 0; stride >>= 1) {
            for (unsigned i = threadIdx.x; i < n2 / 2; i += blockDim.x) {
                unsigned lo = 2 * i - (i & (stride - 1));
                unsigned hi = lo + stride;
                bool best_first = (lo & size) == 0;
                float sl = c.s[lo], sh = c.s[hi];
                long long il = c.id[lo], ih = c.id[hi];
                if (better(sh, ih, sl, il) == best_first) {
                    c.s[lo] = sh; c.s[hi] = sl;
                    c.id[lo] = ih; c.id[hi] = il;
                }
            }
            __syncthreads();
        }
    }
    if (threadIdx.x == 0) {
        unsigned kept = n < k ? n : k;
        c.n = kept;
        c.thresh = kept == k ? c.s[k - 1] : -INFINITY;
    }
    __syncthreads();
}

template <typename T> struct Elem;
template <> struct Elem<__half> {
    static constexpr int per_vec = 8;
    static __device__ __forceinline__ float dot(uint4 v, const float *q) {
        const float4 a = *reinterpret_cast<const float4 *>(q);
        const float4 b = *reinterpret_cast<const float4 *>(q + 4);
        const __half2 *h = reinterpret_cast<const __half2 *>(&v);
        float2 x0 = __half22float2(h[0]), x1 = __half22float2(h[1]);
        float2 x2 = __half22float2(h[2]), x3 = __half22float2(h[3]);
        float acc = x0.x * a.x;
        acc = fmaf(x0.y, a.y, acc); acc = fmaf(x1.x, a.z, acc); acc = fmaf(x1.y, a.w, acc);
        acc = fmaf(x2.x, b.x, acc); acc = fmaf(x2.y, b.y, acc); acc = fmaf(x3.x, b.z, acc);
        acc = fmaf(x3.y, b.w, acc);
        return acc;
    }
};
template <> struct Elem<float> {
    static constexpr int per_vec = 4;
    static __device__ __forceinline__ float dot(uint4 v, const float *q) {
        const float4 a = *reinterpret_cast<const float4 *>(q);
        float acc = __uint_as_float(v.x) * a.x;
        acc = fmaf(__uint_as_float(v.y), a.y, acc);
        acc = fmaf(__uint_as_float(v.z), a.z, acc);
        acc = fmaf(__uint_as_float(v.w), a.w, acc);
        return acc;
    }
};

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Scores TR_CUDA_ROWS rows r[i] (valid flags v[i]) with the whole warp: all loads first, then math. */
#define TR_CUDA_ROWS 4
static_assert(TR_CUDA_ROWS_PER_WARP % TR_CUDA_ROWS == 0, "whole row groups per round");
template <typename T>
__device__ __forceinline__ void score_rows(const SearchParams &p, const float *qs, const unsigned long long *r,
                                           const bool *v, float *sc) {
    const unsigned lane = threadIdx.x & 31u;
    float acc[TR_CUDA_ROWS];
#pragma unroll
    for (int j = 0; j < TR_CUDA_ROWS; j++) acc[j] = 0.f;
    for (unsigned c0 = 0; c0 < p.nvec; c0 += 32u * TR_CUDA_CHUNK) {
        uint4 x[TR_CUDA_ROWS][TR_CUDA_CHUNK];
#pragma unroll
        for (int u = 0; u < TR_CUDA_CHUNK; u++) {
            unsigned c = c0 + u * 32u + lane;
            bool in = c < p.nvec;
#pragma unroll
            for (int j = 0; j < TR_CUDA_ROWS; j++)
                x[j][u] = (in && v[j]) ? __ldg(p.X + r[j] * p.nvec + c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < TR_CUDA_CHUNK; u++) {
            unsigned c = c0 + u * 32u + lane;
            if (c < p.nvec) {
                const float *q = qs + (size_t)c * Elem<T>::per_vec;
#pragma unroll
                for (int j = 0; j < TR_CUDA_ROWS; j++) acc[j] += Elem<T>::dot(x[j][u], q);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < TR_CUDA_ROWS; j++) sc[j] = warp_sum(acc[j]);
}

__device__ __forceinline__ void admit(Cand &c, const SearchParams &p, float s, unsigned long long r) {
    if (s >= c.thresh) {
        unsigned pos = atomicAdd(&c.n, 1u);
        c.s[pos] = s;
        c.id[pos] = (long long)p.ids[r];
    }
}

template <typename T, int QN>
__global__ void __launch_bounds__(TR_CUDA_BLOCK, TR_CUDA_BLOCKS_PER_SM)
search_kernel(const __grid_constant__ SearchParams p, const __grid_constant__ QueryInline<QN> qin) {
    extern __shared__ float4 smem_q4[];
    float *qs = reinterpret_cast<float *>(smem_q4);
    __shared__ Cand cand;
    __shared__ bool is_last;

    /* Stage the query once: from the parameters, or with 16-byte loads from its device view. */
    if (QN > 1) {
        for (unsigned i = threadIdx.x; i < p.ld; i += blockDim.x) qs[i] = i < p.dim ? qin.q[i] : 0.f;
    } else {
        const unsigned n4 = p.ld / 4; /* ld is a multiple of 4; the pinned buffer is padded */
        const float4 *src = reinterpret_cast<const float4 *>(p.qptr);
        for (unsigned i = threadIdx.x; i < n4; i += blockDim.x) smem_q4[i] = src[i];
    }
    if (threadIdx.x == 0) {
        cand.n = 0;
        cand.thresh = -INFINITY;
    }
    __syncthreads();

    const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
    const unsigned long long start = (unsigned long long)blockIdx.x * p.rows_per_block;
    unsigned long long end = start + p.rows_per_block;
    if (end > p.rows) end = p.rows;
    for (unsigned long long base = start; base < end; base += TR_CUDA_ROUND) {
#pragma unroll 1
        for (unsigned i = 0; i < TR_CUDA_ROWS_PER_WARP; i += TR_CUDA_ROWS) {
            unsigned long long r[TR_CUDA_ROWS];
            bool v[TR_CUDA_ROWS];
            bool any = false;
#pragma unroll
            for (int j = 0; j < TR_CUDA_ROWS; j++) {
                r[j] = base + warp + (unsigned long long)(i + j) * TR_CUDA_WARPS;
                v[j] = r[j] < end;
                if (p.filter) v[j] = v[j] && p.ns[r[j]] == p.ns_hash;
                any = any || v[j];
            }
            if (r[0] >= end) break; /* rows only grow with i: warp-uniform exit */
            if (!any) continue;
            float sc[TR_CUDA_ROWS];
            score_rows<T>(p, qs, r, v, sc);
            if (lane == 0) {
#pragma unroll
                for (int j = 0; j < TR_CUDA_ROWS; j++)
                    if (v[j]) admit(cand, p, sc[j], r[j]);
            }
        }
        __syncthreads();
        if (cand.n > TR_CUDA_CAND - TR_CUDA_ROUND) flush(cand, p.k);
    }
    flush(cand, p.k);

    /* Publish this block's list, then the last block to finish merges all of them. */
    const unsigned G = gridDim.x;
    for (unsigned j = threadIdx.x; j < cand.n; j += blockDim.x) {
        p.part_s[(size_t)blockIdx.x * p.k + j] = cand.s[j];
        p.part_id[(size_t)blockIdx.x * p.k + j] = cand.id[j];
    }
    if (threadIdx.x == 0) p.part_n[blockIdx.x] = cand.n;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned ticket = atomicAdd(p.done, 1u);
        is_last = ticket == G - 1;
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();

    /* Any block holding k entries bounds the global k-th score from below: prune with the best
     * such bound. */
    __shared__ float bound;
    if (threadIdx.x == 0) bound = -INFINITY;
    __syncthreads();
    {
        float local = -INFINITY;
        for (unsigned b = threadIdx.x; b < G; b += blockDim.x) {
            unsigned n = __ldcg(p.part_n + b);
            if (n == p.k) local = fmaxf(local, __ldcg(p.part_s + (size_t)b * p.k + p.k - 1));
        }
        local = fmaxf(local, __shfl_xor_sync(0xffffffffu, local, 16));
        local = fmaxf(local, __shfl_xor_sync(0xffffffffu, local, 8));
        local = fmaxf(local, __shfl_xor_sync(0xffffffffu, local, 4));
        local = fmaxf(local, __shfl_xor_sync(0xffffffffu, local, 2));
        local = fmaxf(local, __shfl_xor_sync(0xffffffffu, local, 1));
        if (lane == 0 && local > -INFINITY) {
            /* float max through int compare works for non-negative; use a CAS loop for all signs */
            float old = bound;
            while (local > old) {
                int prev = atomicCAS(reinterpret_cast<int *>(&bound), __float_as_int(old), __float_as_int(local));
                if (prev == __float_as_int(old)) break;
                old = __int_as_float(prev);
            }
        }
    }
    if (threadIdx.x == 0) {
        cand.n = 0;
        cand.thresh = -INFINITY;
    }
    __syncthreads();
    const float prune = bound;
    /* Each list is sorted best first, so its useful part is a prefix: thread t walks lists t and
     * t + blockDim.x while scores stay >= the bound. When the buffer fills, flush and go on. */
    __shared__ int overflow;
    unsigned cursor[2] = {0, 0};
    for (;;) {
        if (threadIdx.x == 0) overflow = 0;
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const unsigned b = threadIdx.x + i * blockDim.x;
            if (b >= G) continue;
            const unsigned n = __ldcg(p.part_n + b);
            while (cursor[i] < n) {
                const size_t e = (size_t)b * p.k + cursor[i];
                const float s = __ldcg(p.part_s + e);
                if (s < prune || s < cand.thresh) {
                    cursor[i] = n;
                    break;
                }
                const unsigned pos = atomicAdd(&cand.n, 1u);
                if (pos >= TR_CUDA_CAND) {
                    overflow = 1;
                    break;
                }
                cand.s[pos] = s;
                cand.id[pos] = __ldcg(p.part_id + e);
                cursor[i]++;
            }
        }
        __syncthreads();
        const int again = overflow; /* flush clamps cand.n: reservations past the end wrote nothing */
        flush(cand, p.k); /* starts and ends with a barrier: every thread has read `overflow` */
        if (!again) break;
    }
    for (unsigned j = threadIdx.x; j < p.k; j += blockDim.x) {
        bool have = j < cand.n;
        p.out_ids[j] = have ? cand.id[j] : -1;
        p.out_s[j] = have ? cand.s[j] : -INFINITY;
    }
    if (threadIdx.x == 0) {
        *p.out_hits = cand.n;
        *p.done = 0; /* ready for the next launch on this stream */
    }
}

/* Writes n staged rows (already in the device dtype, padded to ld) into their row slots. */
__global__ void scatter_rows(uint4 *X, int64_t *ids, uint64_t *ns, const uint4 *staged, const int64_t *sids,
                             const uint64_t *sns, const uint64_t *rows, unsigned n, unsigned nvec) {
    for (unsigned i = blockIdx.x; i < n; i += gridDim.x) {
        const uint64_t r = rows[i];
        for (unsigned c = threadIdx.x; c < nvec; c += blockDim.x) X[r * nvec + c] = staged[(size_t)i * nvec + c];
        if (threadIdx.x == 0) {
            ids[r] = sids[i];
            ns[r] = sns[i];
        }
    }
}

__global__ void move_row_kernel(uint4 *X, int64_t *ids, uint64_t *ns, uint64_t dst, uint64_t src, unsigned nvec) {
    for (unsigned c = threadIdx.x; c < nvec; c += blockDim.x) X[dst * nvec + c] = X[src * nvec + c];
    if (threadIdx.x == 0) {
        ids[dst] = ids[src];
        ns[dst] = ns[src];
    }
}

/* ------------------------------------------------------------------------------------------ */
/* batched search: up to TR_BQ_MAX queries (from any number of requests) in one pass, tensor cores */
/*
 * f16 rows only. Queries are converted to f16 (error <= 2^-12 relative per element; the dot
 * product's error stays far below the f16 rows' own rounding) and staged into shared memory.
 * A warp scores a 16-row tile against 8 queries per mma.sync.m16n8k16 (f32 accumulate). The k
 * index inside an mma is permuted so that each lane's A fragment is one 16-byte load of a row:
 * lane (g = lane/4, t = lane%4) loads halves [8t, 8t+8) of each 32-half chunk of rows g and g+8
 * and the matching halves of query g; sums over k do not depend on the order.
 * Top-k per query per block: admit score >= threshold into a shared buffer (atomicAdd), and at
 * the end of a 128-row round select the best k in place (one warp per query). The blocks' lists
 * are then merged per query (pruned by the best block k-th score): for up to TR_BQ_FUSE_MAX
 * queries by the last scan block to finish (one launch per pass: the single-request latency
 * path); for more by a second kernel, one block per query, so the merges run in parallel.
 */
#define TR_BQ_MAX 16     /* queries per pass (two n-tiles of 8) */
#define TR_BQ_MAX_K 64   /* larger k goes through the per-query kernel */
#define TR_BQ_CB 256     /* per-query candidate buffer in a scan block */
#define TR_BQ_ROUND 128  /* rows per block round: 8 warps x 16 */
#define TR_BQ_STAGE 4    /* 32-half chunks per register stage (two stages: one loading, one in the mmas) */
#define TR_BQ_INLINE 128 /* uint4 of f16 queries that ride in the kernel parameters (2 KB) */
#define TR_BQ_MCB 2304   /* merge buffer: one 2048-entry round + kept */
#define TR_MERGE_SLOTS 12       /* the merge's one-trip path: up to this many list slots per thread (G x k) */
#define TR_MERGE_BOUND_GROUPS 2 /* ... and up to this many groups of 32 lists per warp (G <= 512) */
/* The persistent kernel with the one-trip merge is a second instantiation, used for tiers up to this many rows
 * (TR_CUDA_ONE_TRIP_MAX_ROWS overrides). In one kernel with the scan, it made the scan slower the more rounds each
 * block walks, path taken or not (H200, 768 dims, go -> last ticket: 100k rows 43.3 -> 43.2 us, 250k 101.6 -> 107.7,
 * 1M 402 -> 425), while its merge is 2.2 us shorter; as its own instantiation the other kernel compiles as before
 * (1M: 403.5 and 402.8 us without it, 402.7 and 401.9 with it). */
#define TR_ONE_TRIP_MAX_ROWS 131072ull
/* Tiers of up to grid x the row cache's rows (row_cache_layout: at most TR_SPLIT_MAX_RPB) get a third instantiation,
 * whose scan reads each block's run from shared memory (RowCache) and splits the dimensions among a block's warps
 * (batch_scan_block<1, true>; TR_CUDA_SPLIT_MAX_ROWS lowers the limit, 0 turns it off), with scan
 * blocks of TR_SPLIT_RPB rows (TR_CUDA_SPLIT_ROWS_PER_BLOCK, 1..64): more blocks read at once, more lists to merge.
 * H200, 4,096 x 768, first round / merge / host submit -> done seen, us: unsplit (32 blocks of 128 rows) 7.0 / 2.65
 * / 21.8-22.3; split, 16 rows 3.6 / 4.2 / 20.4-20.5; 32 rows 3.6 / 3.3 / 19.5-19.7; 64 rows 5.3 / 2.9 / 20.7-20.9
 * (before the row cache: the runs came from global memory). */
#define TR_SPLIT_RPB 32ull
#define TR_SPLIT_MAX_RPB 64u
#define TR_BQ_FUSE_MAX 2 /* up to this many queries per pass: the scan's last block merges (one launch);
                          * more: a merge kernel, one block per query (TR_CUDA_FUSE_MAX overrides) */
static_assert(TR_BQ_CB - TR_BQ_ROUND >= TR_BQ_MAX_K, "a flush must leave room for a round");
static_assert(TR_BQ_MCB - 2048 >= TR_BQ_MAX_K, "merge flush must leave room for a round");

struct BatchQuery {
    unsigned long long ns_hash;
    long long *oid;           /* where the k ids go: the slot's result area (registered segment) */
    float *osc;               /* or the pinned mapped result buffer; same for the k scores */
    unsigned k;
    int filter;
};

struct BatchParams {
    const uint4 *X;
    const int64_t *ids;
    const uint64_t *ns;
    const uint4 *q;           /* device copy of the f16 queries (nq x nvec) unless inline */
    float *part_s;            /* [TR_BQ_MAX][grid][TR_BQ_MAX_K] */
    long long *part_id;
    unsigned *part_n;         /* [TR_BQ_MAX][grid] */
    unsigned *out_hits;       /* mapped host memory, query i at i */
    unsigned *done;           /* fused merge: ticket counter, reset by the last block */
    unsigned long long rows;
    unsigned long long rows_per_block;
    unsigned nvec, nchunk, qstride, nq, any_filter;
    unsigned backward;        /* scan each block's rounds last to first (alternates per pass: batch_params_init) */
    BatchQuery bq[TR_BQ_MAX];
};

template <int N>
struct BatchInline {
    uint4 v[N];
};

__device__ __forceinline__ void mma16816(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* v sorted across the warp, largest in lane 0 (bitonic, by shuffles). */
__device__ __forceinline__ float warp_sort_desc(float v) {
    const unsigned lane = threadIdx.x & 31u;
#pragma unroll
    for (unsigned size = 2; size <= 32; size <<= 1) {
#pragma unroll
        for (unsigned stride = size >> 1; stride > 0; stride >>= 1) {
            const float o = __shfl_xor_sync(0xffffffffu, v, stride);
            /* the lower lane of a pair keeps the larger in a descending run, the smaller otherwise */
            const bool keep_max = ((lane & stride) == 0) == ((lane & size) == 0);
            v = keep_max ? fmaxf(v, o) : fminf(v, o);
        }
    }
    return v;
}

/* In-place selection of the best min(n, k) entries of s/id[0, n) into [0, min(n, k)), best first,
 * by one warp. Returns min(n, k). */
__device__ unsigned warp_select(float *s, long long *id, unsigned n, unsigned k) {
    const unsigned lane = threadIdx.x & 31u;
    const unsigned m = n < k ? n : k;
    for (unsigned i = 0; i < m; i++) {
        float bs = -INFINITY;
        long long bid = LLONG_MAX;
        unsigned bj = UINT_MAX;
        for (unsigned j = i + lane; j < n; j += 32) {
            const float v = s[j];
            const long long d = id[j];
            if (bj == UINT_MAX || better(v, d, bs, bid)) {
                bs = v; bid = d; bj = j;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float os = __shfl_xor_sync(0xffffffffu, bs, o);
            const long long oid = __shfl_xor_sync(0xffffffffu, bid, o);
            const unsigned oj = __shfl_xor_sync(0xffffffffu, bj, o);
            if (oj != UINT_MAX && (bj == UINT_MAX || better(os, oid, bs, bid) ||
                                   (os == bs && oid == bid && oj < bj))) {
                bs = os; bid = oid; bj = oj;
            }
        }
        __syncwarp();
        if (lane == 0 && bj != i) {
            const float ts = s[i];
            const long long ti = id[i];
            s[i] = bs; id[i] = bid;
            s[bj] = ts; id[bj] = ti;
        }
        __syncwarp();
    }
    return m;
}

template <bool ONE_TRIP>
__device__ void merge_query(const BatchParams &p, unsigned G, unsigned qi, float *ms, long long *mid,
                            unsigned &mcnt, float &mthr, float *wmax, unsigned long long *stamp = nullptr);

/* Entries lane and lane + 32 of s/id[0, n) (n <= 64) and their ranks among all n, by one warp (ranks are distinct
 * when the ids are); place() writes those ranked below k to their place in out. */
struct RankedPair {
    bool h0, h1;
    float s0, s1;
    long long i0, i1;
    unsigned r0, r1;
    __device__ __forceinline__ void place(float *out_s, long long *out_id, unsigned k) const {
        if (h0 && r0 < k) {
            out_s[r0] = s0;
            out_id[r0] = i0;
        }
        if (h1 && r1 < k) {
            out_s[r1] = s1;
            out_id[r1] = i1;
        }
    }
};
__device__ __forceinline__ RankedPair warp_rank_pair(const float *s, const long long *id, unsigned n) {
    const unsigned lane = threadIdx.x & 31u;
    RankedPair p;
    p.h0 = lane < n;
    p.h1 = lane + 32u < n;
    p.s0 = p.h0 ? s[lane] : -INFINITY;
    p.s1 = p.h1 ? s[lane + 32] : -INFINITY;
    p.i0 = p.h0 ? id[lane] : LLONG_MAX;
    p.i1 = p.h1 ? id[lane + 32] : LLONG_MAX;
    p.r0 = p.r1 = 0;
    for (unsigned j = 0; j < n; j++) {
        const float sj = s[j];
        const long long ij = id[j];
        p.r0 += better(sj, ij, p.s0, p.i0) ? 1u : 0u;
        p.r1 += better(sj, ij, p.s1, p.i1) ? 1u : 0u;
    }
    return p;
}

/* Ranks entries [0, n) of s/id (shared memory, n <= TR_CUDA_BLOCK, ids distinct) with the whole block and writes
 * those ranked below k to their place in out: each entry gets TR_CUDA_BLOCK / n threads (up to 8; a power of two,
 * so a group sits inside a warp), each counts the entries of its share that rank above it, and the group adds the
 * counts by shuffles. A scan block's list at 4,096 x 768 on an H200 (n = 32): 1.3 us by one warp (each lane's loop
 * of n dependent steps), 1.7 by shuffles in one warp, 0.8 by the block. Every thread of the block must call it. */
__device__ void block_rank_place(const float *s, const long long *id, unsigned n, unsigned k, float *out_s,
                                 long long *out_id) {
    const unsigned tid = threadIdx.x;
    const unsigned tpe = n <= TR_CUDA_BLOCK / 8 ? 8u : n <= TR_CUDA_BLOCK / 4 ? 4u : n <= TR_CUDA_BLOCK / 2 ? 2u : 1u;
    const unsigned e = tid / tpe, sub = tid - e * tpe;
    const bool have = e < n;
    const float se = have ? s[e] : 0.f;
    const long long ide = have ? id[e] : 0;
    unsigned rank = 0;
    if (have)
        for (unsigned j = sub; j < n; j += tpe) rank += better(s[j], id[j], se, ide) ? 1u : 0u;
    for (unsigned o = tpe >> 1; o > 0; o >>= 1) rank += __shfl_xor_sync(0xffffffffu, rank, o);
    if (have && sub == 0 && rank < k) {
        out_s[rank] = se;
        out_id[rank] = ide;
    }
}

/* warp_select for a scan block's candidate list (n <= TR_BQ_CB, k <= TR_BQ_MAX_K), by one warp, without
 * k sequential rounds: the k-th largest of the lanes' maxima is a lower bound on the k-th best score (it
 * stands for k distinct entries), so only entries at or above it can be in the top k: they are compacted
 * to the front (usually about k of them) and each is ranked against the others and written to its place
 * (ranks are distinct: a block's ids are unique). Many ties at the bound (more than 64 survivors) take
 * warp_select's path. Same contract as warp_select: the best min(n, k) entries, best first, in [0, m). */
#define TR_SELECT_LANE (TR_BQ_CB / 32)
#define TR_SELECT_RANK 64 /* survivors ranked directly: two per lane */
static_assert(TR_BQ_MAX_K <= TR_SELECT_RANK, "every kept entry must fit the rank step");
__device__ unsigned warp_select_block(float *s, long long *id, unsigned n, unsigned k) {
    const unsigned lane = threadIdx.x & 31u;
    float v[TR_SELECT_LANE];
    long long d[TR_SELECT_LANE];
    float lane_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < TR_SELECT_LANE; i++) {
        const unsigned j = lane + 32u * i;
        v[i] = j < n ? s[j] : -INFINITY;
        d[i] = j < n ? id[j] : LLONG_MAX;
        if (j < n) lane_max = fmaxf(lane_max, v[i]);
    }
    float bound = -INFINITY;
    if (n > k && k <= 32) bound = __shfl_sync(0xffffffffu, warp_sort_desc(lane_max), k - 1);
    unsigned mine = 0;
#pragma unroll
    for (int i = 0; i < TR_SELECT_LANE; i++) mine += (lane + 32u * i < n && v[i] >= bound) ? 1u : 0u;
    unsigned upto = mine; /* inclusive prefix sum over the lanes */
#pragma unroll
    for (unsigned o = 1; o < 32; o <<= 1) {
        const unsigned t = __shfl_up_sync(0xffffffffu, upto, o);
        if (lane >= o) upto += t;
    }
    const unsigned m = __shfl_sync(0xffffffffu, upto, 31);
    if (m > TR_SELECT_RANK) return warp_select(s, id, n, k); /* nothing written yet */
    __syncwarp(); /* every lane has read its entries before any is overwritten */
    unsigned pos = upto - mine;
#pragma unroll
    for (int i = 0; i < TR_SELECT_LANE; i++) {
        if (lane + 32u * i < n && v[i] >= bound) {
            s[pos] = v[i];
            id[pos] = d[i];
            pos++;
        }
    }
    __syncwarp();
    const RankedPair r = warp_rank_pair(s, id, m);
    __syncwarp(); /* every rank is computed before the entries move */
    r.place(s, id, k);
    __syncwarp();
    return m < k ? m : k;
}

/* A block's final list when it holds at most TR_SELECT_RANK candidates (the split scan: one round of at most
 * TR_SPLIT_MAX_RPB rows), by one warp: each lane ranks its two entries against all n and writes those ranked
 * below k straight to their place in the partial list (ranks are distinct: a block's ids are unique). No bound
 * to sort for and nothing to compact: warp_select_block's path took the lists phase 1.7 us at 4,096 x 768.
 * Returns min(n, k), what the list holds. */
__device__ unsigned warp_rank_to_list(const float *s, const long long *id, unsigned n, unsigned k, float *out_s,
                                      long long *out_id) {
    warp_rank_pair(s, id, n).place(out_s, out_id, k);
    return n < k ? n : k;
}

/* TR_CUDA_PROFILE=1: each block of the persistent kernel adds up where its part of a batch goes
 * (clock64 between barriers, so per block and exact; one %globaltimer total per batch calibrates them),
 * and the sidecar logs the means at each stop: which part of a small tier's scan is fixed cost. */
enum {
    TR_PH_STAGE,      /* go seen -> parameters and queries staged (block 0: the mailbox over PCIe) */
    TR_PH_ROUND1,     /* -> first round scored and admitted */
    TR_PH_ROUNDS,     /* -> every further round (and its selections) */
    TR_PH_LISTS,      /* -> final selection and partial lists written */
    TR_PH_FENCE,      /* -> the ticket's release fence */
    TR_PH_TICKET,     /* -> the ticket's atomic returned */
    TR_PH_CYCLES,     /* go seen -> ticket, in cycles, and ... */
    TR_PH_NS,         /* ... in ns (%globaltimer): the clock of the other phases */
    TR_PH_GO_NS,      /* block 0 raised go -> this block saw it (ns; 0 for block 0) */
    TR_PH_COUNT,      /* batches added up */
    TR_PH_SLOTS
};
__shared__ long long tr_clk[TR_PH_CYCLES + 2]; /* the phases' clocks, then %globaltimer at go seen */
__device__ __forceinline__ void prof_clock(bool prof, int i) {
    if (prof && threadIdx.x == 0) tr_clk[i] = clock64();
}

/* The split scan's row cache (persist_kernel<true, true>): a block of the persistent kernel keeps its run of rows
 * in shared memory from one batch to the next, so a small tier is scored from on-chip memory. The first batch with
 * a given run (kernel start, or a new row count) copies it in (row_cache_fill) before its scan; the scans read it
 * from there. It stays valid for the kernel's life because every write to the rows stops the kernel
 * (cuda_write_rows, cuda_move_row): only the row count may change under it, and the run is part of the key
 * (persist_kernel). Rows are stride uint4 apart, stride = 4 mod 8: the two rows a quarter-warp reads fall in
 * disjoint banks. Filling it during the scan instead (each lane storing what it loaded), or keeping a path that reads
 * the rows from global memory beside it, made the scan spill (so the split build takes only runs the cache holds).
 * H200, 4,096 rows, first round of the scan: 768 dims 3.8 -> 2.7 us, 384 dims 3.4 -> 2.4 us. */
struct RowCache {     /* places in the dynamic shared memory, in uint4 */
    unsigned rows;    /* rows of the run x stride */
    unsigned ids;     /* the run's ids, then its namespace hashes */
    unsigned ns;
    unsigned stride;
};

/* Copies rows [start, end) of the tier, their ids and namespace hashes into the row cache, every load in flight at
 * once (cp.async); the caller's barrier makes them visible to the block. */
__device__ void row_cache_fill(const BatchParams &p, const RowCache &rc, uint4 *bsm, unsigned long long start,
                               unsigned long long end) {
    const unsigned n = (unsigned)(end - start), tid = threadIdx.x;
    const uint4 *src = p.X + start * p.nvec;
    for (unsigned i = tid; i < n * p.nvec; i += blockDim.x) {
        const unsigned r = i / p.nvec, c = i - r * p.nvec;
        __pipeline_memcpy_async(bsm + rc.rows + r * rc.stride + c, src + i, sizeof(uint4));
    }
    long long *ids = reinterpret_cast<long long *>(bsm + rc.ids);
    uint64_t *ns = reinterpret_cast<uint64_t *>(bsm + rc.ns);
    for (unsigned i = tid; i < n; i += blockDim.x) {
        __pipeline_memcpy_async(ids + i, p.ids + start + i, sizeof(long long));
        __pipeline_memcpy_async(ns + i, p.ns + start + i, sizeof(uint64_t));
    }
    __pipeline_commit();
    __pipeline_wait_prior(0);
}

/* One block's share of a batched scan (block blk of G): stages the queries (qsrc: kernel parameters,
 * or device memory read through L2 when q_l2; null: the caller has staged them at the start of bsm,
 * as the persistent kernel does with its parameters), scores its run of rows and leaves its sorted
 * top-k per query in the partial lists. bsm: the dynamic shared memory (batch_smem).
 *
 * SPLIT (one query tile; blocks of at most TR_SPLIT_MAX_RPB rows, read from the row cache rc, which the caller has
 * filled): the block's warps share out the dimensions as well as the rows: 16 rows per group of warps, each warp
 * of a group scores one part of the dimensions, and the parts are summed through shared memory. A small tier is
 * then scored by every SM at once in one round. Without it a warp walks all dimensions of its 16 rows in
 * 2 x TR_BQ_STAGE-chunk waves, one memory trip each: a block of 16 rows took 4.7 us at 768 dims, whatever the
 * tier. */
template <int NT, bool SPLIT = false>
__device__ void batch_scan_block(const BatchParams &p, const uint4 *qsrc, bool q_l2, unsigned blk, unsigned G,
                                 uint4 *bsm, bool prof = false, RowCache rc = RowCache{}) {
    constexpr unsigned QR = NT * 8;
    uint4 *sq = bsm;                                                   /* QR x qstride */
    long long *cid = reinterpret_cast<long long *>(bsm + QR * p.qstride); /* QR x CB */
    float *cs = reinterpret_cast<float *>(cid + QR * TR_BQ_CB);          /* QR x CB */
    __shared__ unsigned cnt[QR];
    __shared__ float thr[QR];

    const unsigned tid = threadIdx.x;
    for (unsigned i = tid; qsrc && i < QR * p.qstride; i += blockDim.x) {
        const unsigned r = i / p.qstride, c = i - r * p.qstride;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < p.nq && c < p.nvec) v = q_l2 ? __ldcg(qsrc + r * p.nvec + c) : qsrc[r * p.nvec + c];
        sq[i] = v;
    }
    if (tid < QR) {
        cnt[tid] = 0;
        thr[tid] = -INFINITY;
    }
    /* SPLIT: the parts' barrier orders these before the admission (the split scan always has parts): one barrier
     * fewer on the latency path (with the select's below, the first round took 0.2 us less at 4,096 rows) */
    if (!SPLIT) __syncthreads();

    const unsigned warp = tid >> 5, lane = tid & 31u, g = lane >> 2, t = lane & 3u;
    static_assert(!SPLIT || NT == 1, "the split scan sums one query tile's accumulators");
    /* SPLIT: groups of 16 rows x parts of the dimensions (groups x parts = the block's warps) */
    unsigned parts = 1;
    if constexpr (SPLIT) {
        if (p.rows_per_block <= TR_SPLIT_MAX_RPB)
            parts = p.rows_per_block <= 16   ? TR_CUDA_WARPS
                    : p.rows_per_block <= 32 ? TR_CUDA_WARPS / 2
                                             : TR_CUDA_WARPS / 4;
    }
    const unsigned group = SPLIT ? warp / parts : warp, part = SPLIT ? warp - group * parts : 0u;
    const unsigned round_rows = SPLIT ? (TR_CUDA_WARPS / parts) * 16u : TR_BQ_ROUND;
    /* SPLIT: this warp's chunks [cb, ce) (the other path reads p.nchunk where it is used, as it always has) */
    const unsigned cb = part * p.nchunk / parts, ce = (part + 1u) * p.nchunk / parts;
    /* SPLIT: the parts' sums, after the lists' buffers (the persistent kernel's batch_smem(b, 2) has room) */
    float4 *red = reinterpret_cast<float4 *>(cs + QR * TR_BQ_CB);
    const unsigned long long start = (unsigned long long)blk * p.rows_per_block;
    unsigned long long end = start + p.rows_per_block;
    if (end > p.rows) end = p.rows;
    /* One query tile (the single-request latency path) also: loads the next round's first stage before
     * this round's admission and barriers, so they overlap a memory trip, and keeps two accumulator chains
     * (one mma chain of 2 x nchunk steps otherwise). Two tiles have two chains already, and the prefetch's
     * registers spilled there (measured together at 100k x 768: scan 48.7 -> 45.5 us). */
    /* SPLIT: a block of up to 64 rows has one round, and a warp few chunks (one chain is enough; registers) */
    constexpr bool kPrefetch = NT == 1 && !SPLIT, kAcc2 = NT == 1 && !SPLIT;
    uint4 a0[TR_BQ_STAGE], b0[TR_BQ_STAGE];
    bool prefetched = false;
    /* Every other pass walks the block's rounds backward. A pass leaves the rows it read last in L2, so the
     * next one starts on rows L2 still holds instead of on the ones it evicted first (a tier larger than L2 but
     * not by much, e.g. 100k x 768 f16 = 154 MB against 50 MB, has a third of its next pass in L2). */
    const unsigned nrounds = end > start ? (unsigned)((end - start + round_rows - 1) / round_rows) : 0u;
    const long long step = p.backward ? -(long long)round_rows : (long long)round_rows;
    unsigned long long base = p.backward && nrounds ? start + (nrounds - 1ull) * round_rows : start;
    for (unsigned r = 0; r < nrounds; r++, base += step) {
        const unsigned long long row0 = base + group * 16ull;
        /* warp-uniform; SPLIT: every warp enters (past the end its loads are masked), to meet at the parts' barrier */
        if (SPLIT || row0 < end) {
            const unsigned long long rg = row0 + g, rh = rg + 8;
            const bool vg = rg < end, vh = rh < end;
            const uint4 *xg = p.X + (vg ? rg : 0) * p.nvec;
            const uint4 *xh = p.X + (vh ? rh : 0) * p.nvec;
            float acc[NT][4];
#pragma unroll
            for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
            float acc2[NT][4];
#pragma unroll
            for (int n = 0; n < NT; n++) acc2[n][0] = acc2[n][1] = acc2[n][2] = acc2[n][3] = 0.f;
            /* two register stages: the next TR_BQ_STAGE chunks are in flight while the mmas consume
             * the current ones, so the row stream never waits a whole memory round trip between
             * waves (one 8-chunk wave at a time left HBM idle between them) */
            auto load_from = [&](unsigned c0, uint4 (&a)[TR_BQ_STAGE], uint4 (&b)[TR_BQ_STAGE], const uint4 *fg,
                                 const uint4 *fh, bool lg, bool lh) {
#pragma unroll
                for (int u = 0; u < TR_BQ_STAGE; u++) {
                    const unsigned cc = (c0 + u) * 4u + t;
                    const bool ok = cc < p.nvec; /* also false past the last chunk: no load */
                    a[u] = (ok && lg) ? __ldg(fg + cc) : make_uint4(0, 0, 0, 0);
                    b[u] = (ok && lh) ? __ldg(fh + cc) : make_uint4(0, 0, 0, 0);
                }
            };
            auto load = [&](unsigned c0, uint4 (&a)[TR_BQ_STAGE], uint4 (&b)[TR_BQ_STAGE]) {
                load_from(c0, a, b, xg, xh, vg, vh);
            };
            auto multiply = [&](unsigned c0, const uint4 (&a)[TR_BQ_STAGE], const uint4 (&b)[TR_BQ_STAGE]) {
#pragma unroll
                for (int u = 0; u < TR_BQ_STAGE; u++) {
                    if (c0 + u < p.nchunk) {
                        const unsigned cc = (c0 + u) * 4u + t;
#pragma unroll
                        for (int n = 0; n < NT; n++) {
                            const uint4 qv = sq[(n * 8 + g) * p.qstride + cc];
                            mma16816(acc[n], a[u].x, b[u].x, a[u].y, b[u].y, qv.x, qv.y);
                            mma16816(kAcc2 ? acc2[n] : acc[n], a[u].z, b[u].z, a[u].w, b[u].w, qv.z, qv.w);
                        }
                    }
                }
            };
            long long idg, idh;
            uint64_t nsg = 0, nsh = 0;
            if constexpr (SPLIT) {
                /* the run from the row cache (the caller has filled it): one chunk at a time (shared memory answers
                 * in tens of cycles), two accumulator chains. A run is one round (at most TR_SPLIT_MAX_RPB rows), so
                 * rows g and g + 8 are at group * 16 + g and + 8 in it. */
                const unsigned lg_row = group * 16u + g;
                const uint4 *cg = bsm + rc.rows + lg_row * rc.stride, *ch = cg + 8u * rc.stride;
                const long long *cids = reinterpret_cast<const long long *>(bsm + rc.ids);
                const uint64_t *cns = reinterpret_cast<const uint64_t *>(bsm + rc.ns);
                idg = vg ? cids[lg_row] : 0;
                idh = vh ? cids[lg_row + 8u] : 0;
                if (p.any_filter) {
                    nsg = vg ? cns[lg_row] : 0;
                    nsh = vh ? cns[lg_row + 8u] : 0;
                }
#pragma unroll 2
                for (unsigned c = cb; c < ce; c++) {
                    const unsigned cc = c * 4u + t;
                    const bool ok = cc < p.nvec;
                    const uint4 av = (ok && vg) ? cg[cc] : make_uint4(0, 0, 0, 0);
                    const uint4 bv = (ok && vh) ? ch[cc] : make_uint4(0, 0, 0, 0);
                    const uint4 qv = sq[g * p.qstride + cc];
                    mma16816(acc[0], av.x, bv.x, av.y, bv.y, qv.x, qv.y);
                    mma16816(acc2[0], av.z, bv.z, av.w, bv.w, qv.z, qv.w);
                }
#pragma unroll
                for (int e = 0; e < 4; e++) acc[0][e] += acc2[0][e];
            } else {
                uint4 a1[TR_BQ_STAGE], b1[TR_BQ_STAGE];
                if (!prefetched) load(0u, a0, b0);
                /* ids and namespaces load beside the rows, not after the scores (one memory trip fewer) */
                idg = vg ? (long long)p.ids[rg] : 0;
                idh = vh ? (long long)p.ids[rh] : 0;
                if (p.any_filter) {
                    nsg = vg ? p.ns[rg] : 0;
                    nsh = vh ? p.ns[rh] : 0;
                }
                for (unsigned c0 = 0; c0 < p.nchunk; c0 += 2 * TR_BQ_STAGE) {
                    load(c0 + TR_BQ_STAGE, a1, b1);
                    multiply(c0, a0, b0);
                    load(c0 + 2 * TR_BQ_STAGE, a0, b0);
                    multiply(c0 + TR_BQ_STAGE, a1, b1);
                }
            }
            if constexpr (kPrefetch) {
                const unsigned long long next = r + 1 < nrounds ? row0 + step : end;
                const unsigned long long ng = next + g, nh = ng + 8;
                prefetched = next < end; /* warp-uniform */
                if (prefetched) {
                    const bool lg = ng < end, lh = nh < end;
                    load_from(0, a0, b0, p.X + (lg ? ng : 0) * p.nvec, p.X + (lh ? nh : 0) * p.nvec, lg, lh);
                }
            }
            if constexpr (kAcc2) {
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[n][e] += acc2[n][e];
            }
            if constexpr (SPLIT) {
                if (parts == 1) { /* block-uniform; never, for the rows per block the host asks */
                    __syncthreads(); /* cnt, thr */
                } else { /* each group's first warp sums its parts */
                    red[tid] = make_float4(acc[0][0], acc[0][1], acc[0][2], acc[0][3]);
                    __syncthreads();
                    if (part == 0) {
                        for (unsigned o = 1; o < parts; o++) {
                            const float4 v = red[tid + o * 32u];
                            acc[0][0] += v.x;
                            acc[0][1] += v.y;
                            acc[0][2] += v.z;
                            acc[0][3] += v.w;
                        }
                    }
                }
            }
#pragma unroll
            for (int n = 0; n < NT; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const unsigned qi = n * 8 + 2 * t + (e & 1);
                    const bool hi = e >= 2;
                    const bool v = (hi ? vh : vg) && (!SPLIT || part == 0);
                    if (qi < p.nq && v) {
                        const BatchQuery &bq = p.bq[qi];
                        if (bq.filter && (hi ? nsh : nsg) != bq.ns_hash) continue;
                        const float sc = acc[n][e];
                        if (sc >= thr[qi]) {
                            const unsigned pos = atomicAdd(&cnt[qi], 1u);
                            cs[qi * TR_BQ_CB + pos] = sc;
                            cid[qi * TR_BQ_CB + pos] = hi ? idh : idg;
                        }
                    }
                }
            }
        }
        __syncthreads();
        if constexpr (!SPLIT) { /* SPLIT: one round of at most TR_SPLIT_MAX_RPB rows never fills the buffer */
            for (unsigned qi = warp; qi < p.nq; qi += TR_CUDA_WARPS) {
                const unsigned n = cnt[qi];
                if (n > TR_BQ_CB - TR_BQ_ROUND) {
                    const unsigned k = p.bq[qi].k;
                    const unsigned m = warp_select_block(cs + qi * TR_BQ_CB, cid + qi * TR_BQ_CB, n, k);
                    if (lane == 0) {
                        cnt[qi] = m;
                        thr[qi] = m == k ? cs[qi * TR_BQ_CB + k - 1] : -INFINITY;
                    }
                }
            }
            __syncthreads();
        }
        if (r == 0) prof_clock(prof, TR_PH_ROUND1 + 1);
    }
    prof_clock(prof, TR_PH_ROUNDS + 1);
    if constexpr (SPLIT) {
        if (p.nq == 1) { /* block-uniform: the latency path, ranked by the whole block (always n <= 64 here) */
            const size_t o = (size_t)blk * TR_BQ_MAX_K;
            const unsigned n = cnt[0], k = p.bq[0].k;
            block_rank_place(cs, cid, n, k, p.part_s + o, p.part_id + o);
            if (tid == 0) p.part_n[blk] = n < k ? n : k;
            return;
        }
    }
    for (unsigned qi = warp; qi < p.nq; qi += TR_CUDA_WARPS) {
        if constexpr (SPLIT) {
            if (cnt[qi] <= TR_SELECT_RANK) { /* warp-uniform; always, for the rows per block the host asks */
                const size_t o = ((size_t)qi * G + blk) * TR_BQ_MAX_K;
                const unsigned m = warp_rank_to_list(cs + qi * TR_BQ_CB, cid + qi * TR_BQ_CB, cnt[qi], p.bq[qi].k,
                                                     p.part_s + o, p.part_id + o);
                if (lane == 0) p.part_n[(size_t)qi * G + blk] = m;
                continue;
            }
        }
        const unsigned m = warp_select_block(cs + qi * TR_BQ_CB, cid + qi * TR_BQ_CB, cnt[qi], p.bq[qi].k);
        const size_t o = ((size_t)qi * G + blk) * TR_BQ_MAX_K;
        for (unsigned j = lane; j < m; j += 32) {
            p.part_s[o + j] = cs[qi * TR_BQ_CB + j];
            p.part_id[o + j] = cid[qi * TR_BQ_CB + j];
        }
        if (lane == 0) p.part_n[(size_t)qi * G + blk] = m;
    }
}

/* FUSE: the last block to finish (device-scope ticket in p.done, fences on both sides) merges
 * every query's lists itself, so a small batch is one launch. */
template <int NT, int INL, int FUSE>
__global__ void __launch_bounds__(TR_CUDA_BLOCK, 2)
batch_scan_kernel(const __grid_constant__ BatchParams p, const __grid_constant__ BatchInline<INL ? TR_BQ_INLINE : 1> qin) {
    extern __shared__ uint4 bsm[];
    const unsigned tid = threadIdx.x;
    const unsigned G = gridDim.x;
    batch_scan_block<NT>(p, INL ? qin.v : p.q, false, blockIdx.x, G, bsm);
    if (!FUSE) return;
    __shared__ bool is_last;
    __shared__ unsigned mcnt;
    __shared__ float mthr;
    __shared__ float wmax[TR_CUDA_WARPS];
    __threadfence(); /* this block's lists are visible device-wide before its ticket */
    __syncthreads();
    if (tid == 0) is_last = atomicAdd(p.done, 1u) == G - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence(); /* acquire: every other block's lists (fenced before their tickets) */
    /* the scan's shared memory is free now: the merge buffer aliases it (batch_smem sizes it) */
    long long *mid = reinterpret_cast<long long *>(bsm);
    float *ms = reinterpret_cast<float *>(mid + TR_BQ_MCB);
    for (unsigned qi = 0; qi < p.nq; qi++) merge_query<false>(p, G, qi, ms, mid, mcnt, mthr, wmax);
    if (tid == 0) *p.done = 0; /* ready for the next launch on this stream */
}

/* Each warp's largest `local` (reduced over its lanes) into wmax[warp], and mcnt reset; every thread may read
 * wmax when it returns. */
__device__ __forceinline__ void publish_warp_max(float local, float *wmax, unsigned &mcnt) {
    const unsigned tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) local = fmaxf(local, __shfl_xor_sync(0xffffffffu, local, o));
    __syncthreads(); /* the previous query's readers of wmax, mcnt, mthr and the merge buffer are done */
    if (lane == 0) wmax[warp] = local;
    if (tid == 0) mcnt = 0;
    __syncthreads();
}

/* The whole block merges query qi's G sorted per-block lists into its final top-k (ms/mid: TR_BQ_MCB
 * entries of shared memory; mcnt/mthr/wmax: shared scratch). Reads the partial lists with __ldcg:
 * in the fused scan they were written by other blocks of the same launch (ordered by the ticket's
 * fences), so they must come from L2, never from a stale L1 line. */
template <bool ONE_TRIP>
__device__ void merge_query(const BatchParams &p, unsigned G, unsigned qi, float *ms, long long *mid,
                            unsigned &mcnt, float &mthr, float *wmax, unsigned long long *stamp) {
    const unsigned tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const unsigned k = p.bq[qi].k;
    const unsigned *pn = p.part_n + (size_t)qi * G;
    const float *ps = p.part_s + (size_t)qi * G * TR_BQ_MAX_K;
    const long long *pid = p.part_id + (size_t)qi * G * TR_BQ_MAX_K;
    const unsigned total = G * k;
    bool merged = false; /* the one-trip path below has the candidates in ms/mid */
    if (ONE_TRIP && total <= TR_MERGE_SLOTS * TR_CUDA_BLOCK && k <= 32 && G <= TR_MERGE_BOUND_GROUPS * TR_CUDA_BLOCK) {
        /* One trip to L2: every thread loads its slots (scores and ids) and its warp's share of the bound's
         * entries at once, and filters after the bound is known. The bounds first and then the slots in
         * rounds of 2,048 were four dependent trips at 264 lists (6.9 us of the merge at 100k x 768). Each
         * slot's list count is loaded beside it: slots past it hold an earlier pass's entries. */
        float kth[TR_MERGE_BOUND_GROUPS], first[TR_MERGE_BOUND_GROUPS];
        unsigned nb[TR_MERGE_BOUND_GROUPS];
#pragma unroll
        for (int u = 0; u < TR_MERGE_BOUND_GROUPS; u++) {
            const unsigned b = (warp + u * TR_CUDA_WARPS) * 32 + lane;
            nb[u] = b < G ? __ldcg(pn + b) : 0u;
            kth[u] = b < G ? __ldcg(ps + (size_t)b * TR_BQ_MAX_K + k - 1) : -INFINITY;
            first[u] = b < G ? __ldcg(ps + (size_t)b * TR_BQ_MAX_K) : -INFINITY;
        }
        float s[TR_MERGE_SLOTS];
        long long d[TR_MERGE_SLOTS];
        unsigned n[TR_MERGE_SLOTS];
        /* slot e = i * TR_CUDA_BLOCK + tid is entry j of list b (e = b * k + j), stepped without a division */
        const unsigned step_b = TR_CUDA_BLOCK / k, step_j = TR_CUDA_BLOCK - step_b * k;
        const unsigned b0 = tid / k, j0 = tid - b0 * k;
        {
            unsigned b = b0, j = j0;
#pragma unroll
            for (int i = 0; i < TR_MERGE_SLOTS; i++) {
                const bool in = i * TR_CUDA_BLOCK + tid < total;
                n[i] = in ? __ldcg(pn + b) : 0u;
                s[i] = in ? __ldcg(ps + (size_t)b * TR_BQ_MAX_K + j) : -INFINITY;
                d[i] = in ? __ldcg(pid + (size_t)b * TR_BQ_MAX_K + j) : 0;
                b += step_b;
                j += step_j;
                if (j >= k) {
                    j -= k;
                    b++;
                }
            }
        }
        /* the bound, as below: the k-th entry of any list that holds k, and the k-th best of the first
         * entries within each group of 32 lists */
        float local = -INFINITY;
#pragma unroll
        for (int u = 0; u < TR_MERGE_BOUND_GROUPS; u++) {
            if ((warp + u * TR_CUDA_WARPS) * 32 < G) { /* warp-uniform */
                if (nb[u] == k) local = fmaxf(local, kth[u]);
                const float top = warp_sort_desc(nb[u] ? first[u] : -INFINITY);
                local = fmaxf(local, __shfl_sync(0xffffffffu, top, k - 1));
            }
        }
        publish_warp_max(local, wmax, mcnt);
        float bnd = wmax[0];
#pragma unroll
        for (int w = 1; w < TR_CUDA_WARPS; w++) bnd = fmaxf(bnd, wmax[w]);
        if (stamp && tid == 0) stamp[0] = global_ns();
        unsigned j = j0;
#pragma unroll
        for (int i = 0; i < TR_MERGE_SLOTS; i++) {
            const bool take = j < n[i] && s[i] >= bnd; /* n[i] = 0 past the slots */
            j += step_j;
            if (j >= k) j -= k;
            if (take) {
                const unsigned pos = atomicAdd(&mcnt, 1u);
                if (pos < TR_BQ_MCB) {
                    ms[pos] = s[i];
                    mid[pos] = d[i];
                }
            }
        }
        __syncthreads();
        merged = mcnt <= TR_BQ_MCB; /* block-uniform; more (ties at the bound) take the rounds below */
        if (!merged) {
            __syncthreads(); /* every thread has read mcnt */
            if (tid == 0) {
                mcnt = 0;
                mthr = bnd;
            }
            __syncthreads();
        }
    } else {
        /* Lower bounds on the global k-th score: the k-th entry of any list that holds k, and the k-th best
         * of the lists' first entries within a group of 32 lists (k entries of distinct lists). The second is
         * far tighter when many lists each hold a few of the global best (1M rows over 264 lists: ~900
         * entries pass the first alone, ~50 with both), which keeps the final selection small. */
        float local = -INFINITY;
        for (unsigned g = warp; g * 32 < G; g += TR_CUDA_WARPS) {
            const unsigned b = g * 32 + lane;
            /* the scores are loaded beside the count, not after it (one L2 round trip, not two): a list's
             * slots always exist, and what lies past its count is ignored */
            const unsigned n = b < G ? __ldcg(pn + b) : 0u;
            const float kth = b < G ? __ldcg(ps + (size_t)b * TR_BQ_MAX_K + k - 1) : -INFINITY;
            const float first = b < G ? __ldcg(ps + (size_t)b * TR_BQ_MAX_K) : -INFINITY;
            if (n == k) local = fmaxf(local, kth);
            if (k <= 32) {
                const float top = warp_sort_desc(n ? first : -INFINITY);
                local = fmaxf(local, __shfl_sync(0xffffffffu, top, k - 1));
            }
        }
        publish_warp_max(local, wmax, mcnt);
        if (tid == 0) {
            float bnd = -INFINITY;
            for (int w = 0; w < TR_CUDA_WARPS; w++) bnd = fmaxf(bnd, wmax[w]);
            mthr = bnd;
            if (stamp) stamp[0] = global_ns();
        }
        __syncthreads();
    }
    if (!merged) {
        for (unsigned base = 0; base < total; base += 8 * TR_CUDA_BLOCK) {
            float s[8];
            long long d[8];
            unsigned n[8];
            bool ok[8];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const unsigned e = base + i * TR_CUDA_BLOCK + tid;
                const unsigned b = e < total ? e / k : 0u, j = e < total ? e - b * k : 0u;
                n[i] = __ldcg(pn + b); /* as above: the entry's loads do not wait for its list's count */
                s[i] = __ldcg(ps + (size_t)b * TR_BQ_MAX_K + j);
                d[i] = __ldcg(pid + (size_t)b * TR_BQ_MAX_K + j);
                ok[i] = e < total && j < n[i];
            }
            const float th = mthr;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                if (ok[i] && s[i] >= th) {
                    const unsigned pos = atomicAdd(&mcnt, 1u);
                    ms[pos] = s[i];
                    mid[pos] = d[i];
                }
            }
            __syncthreads();
            if (warp == 0 && mcnt > TR_BQ_MCB - 8 * TR_CUDA_BLOCK) {
                const unsigned m = warp_select(ms, mid, mcnt, k);
                if (lane == 0) {
                    mcnt = m;
                    if (m == k) mthr = fmaxf(mthr, ms[k - 1]);
                }
            }
            __syncthreads();
        }
    }
    long long *oi = p.bq[qi].oid;
    float *os = p.bq[qi].osc;
    const unsigned n = mcnt;
    if (stamp && tid == 0) {
        stamp[1] = global_ns();
        stamp[2] = n;
    }
    if (ONE_TRIP && n <= TR_CUDA_BLOCK) {
        /* few candidates (the usual case): the whole block ranks them (block_rank_place) */
        const unsigned m = n < k ? n : k;
        block_rank_place(ms, mid, n, k, os, oi);
        for (unsigned j = m + tid; j < k; j += blockDim.x) {
            oi[j] = -1;
            os[j] = -INFINITY;
        }
        if (tid == 0) p.out_hits[qi] = m;
    } else if (n <= blockDim.x) {
        /* few candidates: each thread ranks one against all (ranks are distinct: ids are unique) and
         * writes it to its place, instead of k sequential rounds of one warp */
        const unsigned m = n < k ? n : k;
        if (tid < n) {
            const float si = ms[tid];
            const long long di = mid[tid];
            unsigned rank = 0;
            for (unsigned j = 0; j < n; j++) rank += better(ms[j], mid[j], si, di);
            if (rank < k) {
                oi[rank] = di;
                os[rank] = si;
            }
        }
        for (unsigned j = m + tid; j < k; j += blockDim.x) {
            oi[j] = -1;
            os[j] = -INFINITY;
        }
        if (tid == 0) p.out_hits[qi] = m;
    } else if (warp == 0) {
        const unsigned m = warp_select(ms, mid, n, k);
        for (unsigned j = lane; j < k; j += 32) {
            const bool have = j < m;
            oi[j] = have ? mid[j] : -1;
            os[j] = have ? ms[j] : -INFINITY;
        }
        if (lane == 0) p.out_hits[qi] = m;
    }
}

/* One block per query: merges the scan blocks' sorted lists (G of them) into the final top-k
 * (batches of more than TR_BQ_FUSE_MAX queries: the merges run in parallel, one block each). */
__global__ void __launch_bounds__(TR_CUDA_BLOCK)
batch_merge_kernel(const __grid_constant__ BatchParams p, unsigned G) {
    __shared__ float ms[TR_BQ_MCB];
    __shared__ long long mid[TR_BQ_MCB];
    __shared__ unsigned mcnt;
    __shared__ float mthr;
    __shared__ float wmax[TR_CUDA_WARPS];
    merge_query<false>(p, G, blockIdx.x, ms, mid, mcnt, mthr, wmax);
}

/* ------------------------------------------------------------------------------------------ */
/* persistent search kernel: no launch on the hot path                                          */
/*
 * One cooperative launch keeps TR_CUDA_BLOCK-thread blocks resident on every SM. The host (the
 * server thread, after it has checked and normalised the requests as for a launch) writes a batch
 * of up to TR_BQ_MAX f16 queries and their parameters into a pinned, mapped mailbox as one tagged
 * message: 16-byte chunks of 12 bytes of the batch and the tag seq << 8 | nq, each written by one
 * atomic 16-byte store. Block 0 polls the message itself over PCIe (a batch is there when every chunk
 * it spans carries the tag) and relays the chunks as they came into device memory (dq); every other
 * block reads the relay in L2 the same way. (The build for tiers past TR_ONE_TRIP_MAX_ROWS takes the
 * batch in mb->req and the query area, and then the word seq << 8 | nq, which block 0 polls before it
 * reads the batch and copies it into dreq/dq, raising ctl->go for the others: see the kernel.) Every block takes part in every batch (the
 * first G scan their share of rows, the others only take a ticket), so a batch cannot finish while
 * any block still reads the previous one. The last block to take its ticket merges (up to
 * TR_BQ_FUSE_MAX queries, or when there are fewer scanning blocks than queries), or releases blocks
 * 0..nq-1 to merge one query each; results go straight into the requests' slots (registered
 * segment) and, after a system-scope fence, the batch's seq into mb->done_seq, which the host polls.
 * nq = 0 stops the kernel: the host sends it before any write to the rows and when the server goes
 * to sleep, so an idle store does not keep the GPU spinning, and the next search launches it again.
 */
#define TR_PERSIST_SEQ_MASK 0xFFFFFFu /* seq lives in the top 24 bits of the message tag and of go; 0 is never used */

struct alignas(16) PersistReq {
    unsigned nq, G, profile, pad1;     /* profile: stamp the stages into mb->stamp (TR_CUDA_PROFILE=1) */
    BatchParams p;
};

/* The message: the PersistReq and then nq rows of nvec uint4 of f16 queries, as a stream of 32-bit words cut
 * into 12-byte pieces, each sent in a chunk whose fourth word is the tag. Block 0 used to poll one word and then
 * read the batch: two PCIe round trips before go. It now polls the chunks themselves: one. The tag in every chunk
 * is what makes that safe: reads of separate words may be served in any order, so a batch read beside a word
 * read could be older than the word. */
#define TR_MSG_HEAD TR_CUDA_BLOCK /* chunks block 0 polls at most, one per thread: the parameters and one query of
                                   * up to 1,216 dims; the rest of a longer message is read once the head is there */
#define TR_MSG_LOADS 8            /* ... in rounds of this many chunks per thread */
static_assert((TR_MSG_HEAD * 3 - sizeof(PersistReq) / 4) * 2 == 1216, "say how many dims the head carries");
__host__ __device__ inline unsigned persist_msg_words(unsigned nq, unsigned nvec) {
    return (unsigned)(sizeof(PersistReq) / 4) + nq * nvec * 4u;
}
__host__ __device__ inline unsigned persist_msg_chunks(unsigned nq, unsigned nvec) {
    return (persist_msg_words(nq, nvec) + 2u) / 3u;
}

struct PersistMailbox {
    alignas(128) unsigned word;        /* host -> device, builds past TR_ONE_TRIP_MAX_ROWS: seq << 8 | nq (nq = 0:
                                        * stop), after req and the queries */
    alignas(128) unsigned done_seq;    /* device -> host: the last seq answered */
    unsigned hits[TR_BQ_MAX];          /* device -> host: hits per query of that batch */
    unsigned long long stamp[4];       /* device -> host (profile): %globaltimer at message seen, go (the tagged
                                        * builds: block 0's relay written), last
                                        * ticket, done */
    unsigned long long merge_stamp[3]; /* device -> host (profile, merged by the last block): %globaltimer
                                        * after the merge's bounds, after its candidates; candidates kept */
    alignas(128) PersistReq req;       /* host -> device, builds past TR_ONE_TRIP_MAX_ROWS */
    /* then TR_BQ_MAX x nvec uint4 of f16 queries (those builds), then the tagged message (the others):
     * max(TR_MSG_HEAD, persist_msg_chunks(TR_BQ_MAX, nvec)) uint4 (persist_msg_area) */
};
__host__ __device__ inline uint4 *persist_msg_area(PersistMailbox *mb, unsigned nvec) {
    return reinterpret_cast<uint4 *>(mb + 1) + (size_t)TR_BQ_MAX * nvec;
}

struct PersistCtl {                    /* device memory, zeroed before each launch */
    unsigned go;                       /* builds past TR_ONE_TRIP_MAX_ROWS: seq of the batch copied into dreq/dq */
    unsigned ticket;                   /* scan tickets (atomicInc wraps it back to 0) */
    unsigned merge_go;                 /* seq whose per-query merges may start */
    unsigned merge_ticket;
    unsigned long long go_ns;          /* profile: %globaltimer when block 0 raised go */
    /* the split build's row cache (RowCache), set by persist_start: where it starts in the dynamic shared memory
     * (uint4), how many rows it holds (0: off) and their stride (uint4) */
    unsigned cache_off, cache_rows, cache_stride;
};

__host__ __device__ inline unsigned persist_next_seq(unsigned s) {
    return (s & TR_PERSIST_SEQ_MASK) == TR_PERSIST_SEQ_MASK ? 1u : (s & TR_PERSIST_SEQ_MASK) + 1u;
}

__device__ __forceinline__ unsigned ld_acquire_sys(const unsigned *a) {
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(a) : "memory");
    return v;
}
__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned *a) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(a) : "memory");
    return v;
}
__device__ __forceinline__ void st_release_gpu(unsigned *a, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(a), "r"(v) : "memory");
}
__device__ __forceinline__ void st_release_sys(unsigned *a, unsigned v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(a), "r"(v) : "memory");
}

/* The builds with the one-trip merge, every block: polls the tagged message for batch seq at msg (block 0: the
 * host's, over PCIe; the others: block 0's relay in L2), each thread one chunk of its head; it is there when chunk
 * 0 carries this seq and every chunk it spans carries chunk 0's tag. Unpacks it into the block's sreq and staged
 * queries sq (block 0 also stores each chunk, as it came, at relay), reading a message longer than the head
 * (several queries, or large dims) on until all of it carries the tag, and zeroes the padding of the staged rows.
 * Returns the tag (seq << 8 | nq); tr_seen_ns: %globaltimer when the head was there, tr_seen_clk: clock64 then.
 * Not inlined: inlined, its registers made the scan of two builds spill. */
__shared__ unsigned long long tr_seen_ns;
__shared__ long long tr_seen_clk;
__device__ __noinline__ unsigned persist_receive(const uint4 *msg, uint4 *relay, PersistReq *sreq, uint4 *sq,
                                                 unsigned seq, unsigned nvec, unsigned qstride) {
    __shared__ unsigned s_tag;
    const unsigned tid = threadIdx.x;
    /* the head: what one query needs (a poll of more bytes took longer to come back) */
    const unsigned head = min(persist_msg_chunks(1, nvec), (unsigned)TR_MSG_HEAD);
    uint4 v = make_uint4(0, 0, 0, 0);
    unsigned tag, nchunks;
    if (!relay) { /* the relay in L2: one thread waits for chunk 0, then the block reads the rest (every thread
                   * polling its chunk reached the ticket sooner but slowed the merge: more traffic in L2) */
        if (tid == 0)
            while ((__ldcv(&msg[0].w) >> 8) != seq) __nanosleep(32);
        __syncthreads();
    }
    for (;;) {
        if (tid < head) v = __ldcv(msg + tid);
        if (tid == 0) s_tag = v.w;
        __syncthreads();
        tag = s_tag;
        nchunks = persist_msg_chunks(tag & 0xFFu, nvec);
        const bool ok = (tag >> 8) == seq && (tid >= min(nchunks, head) || v.w == tag);
        if (__syncthreads_and(ok)) break;
    }
    if (tid == 0) {
        tr_seen_clk = clock64();
        tr_seen_ns = global_ns();
    }
    const unsigned nq = tag & 0xFFu, req_words = (unsigned)(sizeof(PersistReq) / 4),
                   words = persist_msg_words(nq, nvec), row_words = nvec * 4u;
    auto unpack = [&](unsigned c, const uint4 &x) {
        if (relay) __stcg(relay + c, x); /* the chunk as it came, tag and all: one 16-byte store */
        const unsigned val[3] = {x.x, x.y, x.z};
#pragma unroll
        for (int i = 0; i < 3; i++) {
            const unsigned u = c * 3u + i;
            if (u < req_words) {
                reinterpret_cast<unsigned *>(sreq)[u] = val[i];
            } else if (u < words) {
                const unsigned j = u - req_words, r = j / row_words, col = j - r * row_words;
                reinterpret_cast<unsigned *>(sq)[r * qstride * 4u + col] = val[i];
            }
        }
    };
    if (tid < min(nchunks, head)) unpack(tid, v);
    for (bool rest = nchunks > head; rest;) { /* block-uniform */
        /* in rounds of TR_MSG_LOADS chunks per thread, all loads in flight before any is used */
        bool ok = true;
        for (unsigned c0 = head; c0 < nchunks; c0 += TR_MSG_LOADS * blockDim.x) {
            uint4 x[TR_MSG_LOADS];
#pragma unroll
            for (int i = 0; i < TR_MSG_LOADS; i++) {
                const unsigned c = c0 + i * blockDim.x + tid;
                x[i] = c < nchunks ? __ldcv(msg + c) : make_uint4(0, 0, 0, tag);
            }
#pragma unroll
            for (int i = 0; i < TR_MSG_LOADS; i++) {
                const unsigned c = c0 + i * blockDim.x + tid;
                if (x[i].w != tag) ok = false;
                else if (c < nchunks) unpack(c, x[i]);
            }
        }
        rest = !__syncthreads_and(ok);
    }
    /* padding inside a staged row feeds the mma: zeros (a row past nq feeds only its own, unread, column) */
    for (unsigned i = tid; i < nq * (qstride - nvec); i += blockDim.x) {
        const unsigned r = i / (qstride - nvec), c = nvec + (i - r * (qstride - nvec));
        sq[r * qstride + c] = make_uint4(0, 0, 0, 0);
    }
    return tag;
}

template <bool ONE_TRIP, bool SPLIT>
__global__ void __launch_bounds__(TR_CUDA_BLOCK, 2)
persist_kernel(PersistMailbox *mb, PersistReq *dreq, uint4 *dq, PersistCtl *ctl, unsigned seq, unsigned nvec,
               unsigned long long *phase) {
    extern __shared__ uint4 bsm[];
    __shared__ PersistReq sreq;
    __shared__ unsigned s_word;
    __shared__ bool is_last;
    __shared__ unsigned mcnt;
    __shared__ float mthr;
    __shared__ float wmax[TR_CUDA_WARPS];
    const unsigned tid = threadIdx.x, blk = blockIdx.x, nblocks = gridDim.x;
    const uint4 *mq = reinterpret_cast<const uint4 *>(mb + 1);
    const bool prof = phase != nullptr; /* TR_CUDA_PROFILE=1: per-block phases (TR_PH_*) */
    constexpr unsigned NREQ = sizeof(PersistReq) / sizeof(uint4);
    const unsigned qstride = (nvec + 3) / 4 * 4 + 1; /* BatchParams::qstride */
    uint4 *sq = bsm;                                  /* the scan's staged queries (batch_scan_block) */
    unsigned long long t_seen = 0;
    /* SPLIT: the row cache's layout, and the run it holds (the key: set by thread 0 between barriers, after every
     * thread has read it for the batch). In shared memory, not registers: kept in registers across the loop, they
     * made the scan spill. */
    __shared__ unsigned long long ckey_start, ckey_end;
    __shared__ const uint4 *ckey_x;
    __shared__ unsigned cache_off, cache_rows, cache_stride;
    if constexpr (SPLIT) {
        if (tid == 0) {
            cache_off = ctl->cache_off;
            cache_rows = ctl->cache_rows;
            cache_stride = ctl->cache_stride;
            ckey_x = nullptr;
        }
    }
    for (;;) {
        seq = persist_next_seq(seq);
        if constexpr (ONE_TRIP) { /* the tagged message (persist_receive) */
            /* Block 0 polls the host's message and relays its chunks, tags and all, into dq; every other block
             * reads them there as block 0 read the host's, each chunk checked by its own tag. Block 0 unpacking
             * into device memory and then raising go (a fence, then a flag the others polled before they loaded
             * the batch) was a fence and a round trip to L2 more. */
            if (blk == 0) persist_receive(persist_msg_area(mb, nvec), dq, &sreq, sq, seq, nvec, qstride);
            else persist_receive(dq, nullptr, &sreq, sq, seq, nvec, qstride);
            if (tid == 0) { /* no barrier first: thread 0 wrote tr_seen_* and unpacked chunk 0 (sreq.profile) itself */
                if (prof) {
                    tr_clk[0] = tr_seen_clk;
                    tr_clk[TR_PH_CYCLES + 1] = tr_seen_ns;
                }
                if (blk == 0 && sreq.profile) {
                    mb->stamp[0] = tr_seen_ns;
                    mb->stamp[1] = global_ns();
                    if (prof) ctl->go_ns = mb->stamp[1];
                }
            }
        } else {
            /* Tiers past TR_ONE_TRIP_MAX_ROWS: the word, then the batch. The tagged message changed this build's
             * code enough to slow its scan (H200, 2M x 768: 737 -> 792 us), and one round trip is little there. */
            /* Each block loads the parameters into sreq and stages the queries into sq in one loop, so
             * their loads are in flight together: block 0 from the mailbox over PCIe (also copying them to
             * dreq/dq for the others), every other block from dreq/dq in L2 once go carries this seq. nq
             * rides in the low byte of the mailbox word and of go, so the loop's bounds are known first. */
            if (tid == 0) {
                if (blk == 0) {
                    unsigned w;
                    while (((w = ld_acquire_sys(&mb->word)) >> 8) != seq) {
                    }
                    s_word = w;
                    t_seen = global_ns();
                } else {
                    unsigned g;
                    while (((g = ld_acquire_gpu(&ctl->go)) >> 8) != seq) __nanosleep(32);
                    s_word = g;
                }
                if (prof) {
                    tr_clk[0] = clock64();
                    tr_clk[TR_PH_CYCLES + 1] = blk == 0 ? t_seen : global_ns();
                }
            }
            __syncthreads(); /* with tid 0's acquire: the loads below see what the word or go published */
            {
                /* Only the batch's own query rows: a row past nq feeds only its own column of the mma, whose scores
                 * nothing reads, so it needs no zeros. Zero-filling the whole tile (8 or 16 rows) took each thread 4
                 * trips round this loop at 768 dims: staging took 1.3 us even with its code and data warm, 1.7 cold;
                 * now 0.9 cold (H200, 4,096 x 768, one query). */
                const unsigned nq = s_word & 0xFFu;
                const uint4 *rsrc = blk == 0 ? reinterpret_cast<const uint4 *>(&mb->req) : reinterpret_cast<const uint4 *>(dreq);
                unsigned profile = 0;
                for (unsigned i = tid; i < NREQ + nq * qstride; i += blockDim.x) {
                    if (i < NREQ) {
                        const uint4 v = blk == 0 ? __ldcv(rsrc + i) : __ldcg(rsrc + i);
                        reinterpret_cast<uint4 *>(&sreq)[i] = v;
                        if (blk == 0) reinterpret_cast<uint4 *>(dreq)[i] = v;
                        if (i == 0) profile = v.z; /* PersistReq::profile */
                    } else {
                        const unsigned j = i - NREQ, r = j / qstride, c = j - r * qstride;
                        uint4 v = make_uint4(0, 0, 0, 0);
                        if (r < nq && c < nvec) {
                            v = blk == 0 ? __ldcv(mq + r * nvec + c) : __ldcg(dq + r * nvec + c);
                            if (blk == 0) dq[r * nvec + c] = v;
                        }
                        sq[j] = v;
                    }
                }
                if (blk == 0) {
                    /* Fences in this kernel follow cooperative groups' grid sync: the block's threads meet
                     * at a barrier and one thread fences (here: the release of go) for all of them. A fence
                     * in every thread first, then the release's own, was two fence latencies in a row. */
                    __syncthreads();
                    if (tid == 0) {
                        if (profile) {
                            mb->stamp[0] = t_seen;
                            mb->stamp[1] = global_ns();
                            if (prof) ctl->go_ns = mb->stamp[1];
                        }
                        st_release_gpu(&ctl->go, s_word);
                    }
                }
            }
        }
        __syncthreads();
        if (prof && tid == 0) tr_clk[1] = tr_clk[2] = tr_clk[3] = clock64();
        const unsigned nq = sreq.nq, G = sreq.G;
        if (nq == 0) return; /* stop */
        const BatchParams &p = sreq.p;
        /* SPLIT: this block's run of rows, which the split scan reads from the row cache: copied in first
         * (row_cache_fill) unless the cache holds it from an earlier batch. The host starts this build only for
         * runs the cache holds (row_cache_layout), and a running kernel's runs only shrink. Computed again after
         * the scan: kept across it, they made the scan spill. */
        auto run_start = [&]() { return (unsigned long long)blk * p.rows_per_block; };
        auto run_end = [&]() {
            const unsigned long long e = run_start() + p.rows_per_block;
            return e < p.rows ? e : p.rows;
        };
        auto cached = [&]() { return SPLIT && nq <= 8 && blk < G && p.rows_per_block <= cache_rows; };
        if (blk < G) {
            if (nq <= 8) {
                if (cached()) {
                    RowCache rc{};
                    if constexpr (SPLIT) {
                        const unsigned long long c_start = run_start(), c_end = run_end();
                        rc.rows = cache_off;
                        rc.stride = cache_stride;
                        rc.ids = cache_off + cache_rows * cache_stride;
                        rc.ns = rc.ids + (cache_rows + 1u) / 2u;
                        if (!(ckey_x == p.X && ckey_start == c_start && ckey_end == c_end)) { /* block-uniform */
                            row_cache_fill(p, rc, bsm, c_start, c_end);
                            __syncthreads();
                        }
                    }
                    batch_scan_block<1, SPLIT>(p, nullptr, true, blk, G, bsm, prof, rc);
                } else { /* the builds without the split scan; the split one never asks for it (see above) */
                    batch_scan_block<1>(p, nullptr, true, blk, G, bsm, prof);
                }
            } else {
                batch_scan_block<2>(p, nullptr, true, blk, G, bsm, prof);
            }
        }
        __syncthreads();
        if constexpr (SPLIT) {
            if (tid == 0) {
                if (cached()) { /* filled before the scan just finished, or held already */
                    ckey_x = p.X;
                    ckey_start = run_start();
                    ckey_end = run_end();
                } else if (blk < G) {
                    ckey_x = nullptr; /* the other scans' buffers overlap the cache */
                }
            }
        }
        if (tid == 0) {
            prof_clock(prof, TR_PH_LISTS + 1);
            __threadfence(); /* this block's lists are visible device-wide before its ticket */
            prof_clock(prof, TR_PH_FENCE + 1);
            is_last = atomicInc(&ctl->ticket, nblocks - 1) == nblocks - 1;
            if (prof) {
                tr_clk[TR_PH_TICKET + 1] = clock64();
                unsigned long long *ph = phase + (size_t)blk * TR_PH_SLOTS;
                for (int i = 0; i <= TR_PH_TICKET; i++) ph[i] += (unsigned long long)(tr_clk[i + 1] - tr_clk[i]);
                ph[TR_PH_CYCLES] += (unsigned long long)(tr_clk[TR_PH_TICKET + 1] - tr_clk[0]);
                const unsigned long long seen = (unsigned long long)tr_clk[TR_PH_CYCLES + 1];
                ph[TR_PH_NS] += global_ns() - seen;
                if (blk) ph[TR_PH_GO_NS] += seen - ctl->go_ns;
                ph[TR_PH_COUNT] += 1;
            }
            if (is_last) __threadfence(); /* acquire: every block's lists, for the barrier's readers */
        }
        __syncthreads();
        const bool parallel = nq > TR_BQ_FUSE_MAX && nq <= G;
        long long *mid = reinterpret_cast<long long *>(bsm); /* the merge aliases the scan's buffers */
        float *ms = reinterpret_cast<float *>(mid + TR_BQ_MCB);
        if (is_last) {
            if (tid == 0 && sreq.profile) mb->stamp[2] = global_ns();
            if (!parallel) {
                for (unsigned qi = 0; qi < nq; qi++)
                    merge_query<ONE_TRIP>(p, G, qi, ms, mid, mcnt, mthr, wmax,
                                sreq.profile && qi == 0 ? mb->merge_stamp : nullptr);
                __syncthreads(); /* then done_seq's release (fence.sys) orders every thread's results */
                if (tid == 0) {
                    if (sreq.profile) mb->stamp[3] = global_ns();
                    st_release_sys(&mb->done_seq, seq);
                }
            } else if (tid == 0) {
                st_release_gpu(&ctl->merge_go, seq);
            }
        }
        if (parallel && blk < nq) {
            if (tid == 0)
                while (ld_acquire_gpu(&ctl->merge_go) != seq) __nanosleep(32);
            __syncthreads();
            merge_query<ONE_TRIP>(p, G, blk, ms, mid, mcnt, mthr, wmax);
            __syncthreads();
            if (tid == 0) {
                __threadfence_system(); /* this query's results, before its merge ticket */
                if (atomicInc(&ctl->merge_ticket, nq - 1) == nq - 1) {
                    __threadfence_system();
                    if (sreq.profile) mb->stamp[3] = global_ns();
                    st_release_sys(&mb->done_seq, seq);
                }
            }
        }
        __syncthreads(); /* sreq and the shared buffers are reused by the next batch */
    }
}

/* ------------------------------------------------------------------------------------------ */
/* host side                                                                                   */

typedef struct cuda_backend {
    uint32_t dim, dtype, max_k;
    uint32_t nvec, ld, elem;
    uint64_t capacity, rows;
    int device, sms, grid_max;
    cudaStream_t stream;
    uint4 *X;
    int64_t *ids;
    uint64_t *ns;
    float *part_s;
    long long *part_id;
    unsigned *part_n, *done;
    /* pinned, mapped host buffers */
    float *hq;             /* queries: max_queries x ld */
    float *hq_dev;
    uint32_t hq_cap;       /* queries */
    long long *hres_ids;   /* max_queries x max_k */
    float *hres_s;
    unsigned *hres_hits;
    long long *hres_ids_dev;
    float *hres_s_dev;
    unsigned *hres_hits_dev;
    uint32_t hres_cap;     /* queries */
    /* write staging: pinned mapped, reused once the last scatter finished */
    unsigned char *hstage;
    unsigned char *hstage_dev;
    size_t hstage_cap;     /* rows */
    cudaEvent_t stage_free;
    int poison;            /* TR_CUDA_POISON=1: fill result buffers with garbage before each search */
    uint64_t one_trip_max_rows; /* the persistent kernel merges in one trip up to this many rows */
    uint64_t split_max_rows;    /* ... and splits the dimensions among a block's warps up to this many (0: never) */
    uint64_t split_rpb;         /* rows per block of that kernel: scan blocks = rows / this, up to the grid */
    int persist_split;          /* the running persistent kernel is the split one */
    int persist_tagged;         /* ... takes its batches as tagged messages (the builds with the one-trip merge) */
    int alternate;         /* walk every other batched pass backward (TR_CUDA_ALTERNATE=0 turns it off) */
    unsigned passes;       /* batched passes so far (the direction of the next) */
    /* batched search (f16 rows; TR_CUDA_MMA=0 turns it off) */
    int mma_ok;
    size_t smem_optin;
    float *bpart_s;        /* TR_BQ_MAX x grid_max x TR_BQ_MAX_K */
    long long *bpart_id;
    unsigned *bpart_n;
    unsigned *bdone;       /* fused merge ticket counter */
    uint32_t fuse_max;     /* batches of up to this many queries per pass run as one launch */
    uint4 *hq16;           /* pinned f16 queries */
    uint4 *dq;             /* their device copy */
    uint32_t bq_cap;       /* queries */
    /* the shared-memory segment, registered (mapped) so kernels write results into the slots */
    unsigned char *seg_host;
    unsigned char *seg_dev;
    uint64_t seg_bytes;
    int seg_registered;
    /* the batch in flight (search_submit .. search_poll) */
    cudaEvent_t batch_done;
    int pending;
    int pending_copy;      /* some results went to the pinned buffer: copy them out when done */
    tr_search_request *preqs;
    uint32_t pn;
    /* persistent kernel (f16 rows; TR_CUDA_PERSIST=0 turns it off) */
    int persist_ok;        /* built and allowed */
    int persist_running;
    int persist_pending;   /* the batch in flight went to the persistent kernel */
    unsigned pgrid;        /* resident blocks */
    size_t psmem;
    size_t psmem_split;    /* the split build's: psmem and its row cache (row_cache_layout) */
    unsigned cache_off, cache_rows, cache_stride; /* PersistCtl's row cache fields for the split build */
    unsigned pseq;         /* last seq sent (24 bits, never 0) */
    uint32_t ppolls;
    unsigned long long pbatches; /* answered by the running kernel (TR_CUDA_VERBOSE=1 logs it at each stop) */
    int profile;                 /* TR_CUDA_PROFILE=1: mean stage times logged at each stop */
    unsigned long long psubmit_ns, prof_n, prof_sum[5]; /* host submit->done seen; kernel stages */
    unsigned long long prof_merge_n, prof_merge[3];     /* fused merges: bounds, candidates, final; kept */
    int verbose;
    PersistMailbox *pmb;   /* pinned, mapped */
    PersistMailbox *pmb_dev;
    unsigned char *pstream; /* the message's content (host memory): the batch's parameters (preq), then its f16
                             * queries (pq16), and 16 bytes of slack for persist_post's last 16-byte load */
    PersistReq *preq;
    uint4 *pq16;
    PersistReq *pdreq;     /* device copies of the batch */
    uint4 *pdq;
    PersistCtl *pctl;
    unsigned long long *pphase; /* profile: pgrid x TR_PH_SLOTS per-block phase sums (device) */
    unsigned pG;                /* profile: scanning blocks of the last batch */
} cuda_backend;

static void cuda_destroy(void *self);
static size_t batch_smem(const cuda_backend *b, int nt);
static cudaError_t row_cache_layout(cuda_backend *b, int per_sm);
static int persist_stop(cuda_backend *b, const char *why, char *err, size_t errlen);

static void *cuda_create(const tr_backend_config *cfg, char *err, size_t errlen) {
    cuda_backend *b = (cuda_backend *)calloc(1, sizeof *b);
    if (!b) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    b->dim = cfg->dim;
    b->dtype = cfg->dtype;
    b->capacity = cfg->capacity;
    b->max_k = cfg->max_k;
    b->device = cfg->device;
    b->elem = cfg->dtype == TR_DTYPE_F16 ? 2 : 4;
    const char *poison = getenv("TR_CUDA_POISON");
    b->poison = poison && poison[0] == '1';
    const uint32_t per_vec = 16 / b->elem;
    b->nvec = (cfg->dim + per_vec - 1) / per_vec;
    b->ld = b->nvec * per_vec;
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        snprintf(err, errlen, "no CUDA device is visible (%s): check nvidia-smi and CUDA_VISIBLE_DEVICES, "
                 "or use --backend cpu", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        free(b);
        return NULL;
    }
    if (cfg->device < 0 || cfg->device >= ndev) {
        snprintf(err, errlen, "--device %d does not exist: %d CUDA device(s) visible", cfg->device, ndev);
        free(b);
        return NULL;
    }
#define CREATE_TRY(call)                                                                          \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            snprintf(err, errlen, "CUDA error %s (%s) at %s:%d in %s", cudaGetErrorName(e_),      \
                     cudaGetErrorString(e_), __FILE__, __LINE__, #call);                          \
            cuda_destroy(b);                                                                      \
            return NULL;                                                                          \
        }                                                                                         \
    } while (0)
    /* Spin while waiting: the search path waits a few microseconds, a yield costs more. */
    if (cudaInitDevice(cfg->device, cudaDeviceScheduleSpin | cudaDeviceMapHost, 0) != cudaSuccess)
        cudaGetLastError(); /* already initialised with other flags: still usable */
    CREATE_TRY(cudaSetDevice(cfg->device));
    CREATE_TRY(cudaDeviceGetAttribute(&b->sms, cudaDevAttrMultiProcessorCount, cfg->device));
    b->grid_max = b->sms * TR_CUDA_BLOCKS_PER_SM;
    if (b->grid_max > TR_CUDA_MAX_GRID) b->grid_max = TR_CUDA_MAX_GRID;
    CREATE_TRY(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking));
    CREATE_TRY(cudaEventCreateWithFlags(&b->stage_free, cudaEventDisableTiming));
    CREATE_TRY(cudaEventCreateWithFlags(&b->batch_done, cudaEventDisableTiming));
    /* Zero-copy results: register the segment once (mapped) so the merge kernel writes each
     * query's ids and scores straight into its slot; the host then only publishes DONE.
     * TR_CUDA_ZERO_COPY=0 turns it off; a failed registration falls back to the pinned buffer. */
    {
        const char *zc = getenv("TR_CUDA_ZERO_COPY");
        if (cfg->segment && cfg->segment_bytes && !(zc && zc[0] == '0')) {
            if (cudaHostRegister(cfg->segment, cfg->segment_bytes, cudaHostRegisterMapped | cudaHostRegisterPortable) ==
                cudaSuccess) {
                void *dev = NULL;
                if (cudaHostGetDevicePointer(&dev, cfg->segment, 0) == cudaSuccess) {
                    b->seg_host = (unsigned char *)cfg->segment;
                    b->seg_dev = (unsigned char *)dev;
                    b->seg_bytes = cfg->segment_bytes;
                    b->seg_registered = 1;
                } else {
                    cudaGetLastError();
                    cudaHostUnregister(cfg->segment);
                }
            } else {
                cudaError_t re = cudaGetLastError();
                fprintf(stderr, "tr-sidecar: cuda: cannot register the segment (%s): results go through a "
                        "pinned buffer\n", cudaGetErrorString(re));
            }
        }
        const char *v = getenv("TR_CUDA_VERBOSE");
        if (v && v[0] == '1')
            fprintf(stderr, "tr-sidecar: cuda: zero-copy results %s\n", b->seg_registered ? "on" : "off");
    }
    size_t cap = cfg->capacity ? cfg->capacity : 1;
    e = cudaMalloc(&b->X, cap * b->nvec * sizeof(uint4));
    if (e != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        snprintf(err, errlen, "cannot allocate %llu rows x %u (%s) on the GPU: %.1f GiB needed, %.1f GiB free; "
                 "lower --capacity or use --dtype f16", (unsigned long long)cap, cfg->dim,
                 cfg->dtype == TR_DTYPE_F16 ? "f16" : "f32", cap * b->nvec * 16.0 / (1 << 30), free_b / (double)(1 << 30));
        cuda_destroy(b);
        return NULL;
    }
    CREATE_TRY(cudaMalloc(&b->ids, cap * sizeof(int64_t)));
    CREATE_TRY(cudaMalloc(&b->ns, cap * sizeof(uint64_t)));
    CREATE_TRY(cudaMalloc(&b->part_s, (size_t)b->grid_max * b->max_k * sizeof(float)));
    CREATE_TRY(cudaMalloc(&b->part_id, (size_t)b->grid_max * b->max_k * sizeof(long long)));
    CREATE_TRY(cudaMalloc(&b->part_n, (size_t)b->grid_max * sizeof(unsigned)));
    CREATE_TRY(cudaMalloc(&b->done, sizeof(unsigned)));
    CREATE_TRY(cudaMemset(b->done, 0, sizeof(unsigned)));
    {
        const char *mma = getenv("TR_CUDA_MMA");
        int optin = 0;
        CREATE_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, cfg->device));
        b->smem_optin = (size_t)optin;
        b->mma_ok = b->dtype == TR_DTYPE_F16 && !(mma && mma[0] == '0') && batch_smem(b, 2) <= b->smem_optin;
    }
    if (b->mma_ok) {
        const size_t parts = (size_t)TR_BQ_MAX * b->grid_max * TR_BQ_MAX_K;
        CREATE_TRY(cudaMalloc(&b->bpart_s, parts * sizeof(float)));
        CREATE_TRY(cudaMalloc(&b->bpart_id, parts * sizeof(long long)));
        CREATE_TRY(cudaMalloc(&b->bpart_n, (size_t)TR_BQ_MAX * b->grid_max * sizeof(unsigned)));
        CREATE_TRY(cudaMemset(b->bpart_s, 0, parts * sizeof(float)));
        CREATE_TRY(cudaMemset(b->bpart_id, 0, parts * sizeof(long long)));
        CREATE_TRY(cudaMemset(b->bpart_n, 0, (size_t)TR_BQ_MAX * b->grid_max * sizeof(unsigned)));
        const int sm1 = (int)batch_smem(b, 1), sm2 = (int)batch_smem(b, 2);
        CREATE_TRY(cudaMalloc(&b->bdone, sizeof(unsigned)));
        CREATE_TRY(cudaMemset(b->bdone, 0, sizeof(unsigned)));
        const char *alt = getenv("TR_CUDA_ALTERNATE");
        b->alternate = !(alt && alt[0] == '0');
        const char *fm = getenv("TR_CUDA_FUSE_MAX");
        b->fuse_max = fm && fm[0] ? (uint32_t)strtoul(fm, NULL, 10) : TR_BQ_FUSE_MAX;
#define TR_SET_SMEM(NT, INL, F, SM) \
        CREATE_TRY(cudaFuncSetAttribute(batch_scan_kernel<NT, INL, F>, cudaFuncAttributeMaxDynamicSharedMemorySize, SM))
        TR_SET_SMEM(1, 0, 0, sm1); TR_SET_SMEM(1, 1, 0, sm1); TR_SET_SMEM(2, 0, 0, sm2); TR_SET_SMEM(2, 1, 0, sm2);
        TR_SET_SMEM(1, 0, 1, sm1); TR_SET_SMEM(1, 1, 1, sm1); TR_SET_SMEM(2, 0, 1, sm2); TR_SET_SMEM(2, 1, 1, sm2);
#undef TR_SET_SMEM
    }
    if (b->mma_ok) {
        const char *pe = getenv("TR_CUDA_PERSIST");
        int coop = 0, per_sm = TR_CUDA_BLOCKS_PER_SM; /* lowered to what every build can hold */
        CREATE_TRY(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, cfg->device));
        b->psmem = batch_smem(b, 2);
        int per_sm_kernel = 0;
        const void *kernels[] = {(const void *)persist_kernel<false, false>, (const void *)persist_kernel<true, false>,
                                 (const void *)persist_kernel<true, true>};
        for (const void *k : kernels) { /* one grid for all: the lists are sized by it */
            CREATE_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)b->psmem));
            CREATE_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_kernel, k, TR_CUDA_BLOCK, b->psmem));
            if (per_sm_kernel < per_sm) per_sm = per_sm_kernel;
        }
        const char *otr = getenv("TR_CUDA_ONE_TRIP_MAX_ROWS");
        b->one_trip_max_rows = otr && otr[0] ? strtoull(otr, NULL, 10) : TR_ONE_TRIP_MAX_ROWS;
        const char *srpb = getenv("TR_CUDA_SPLIT_ROWS_PER_BLOCK");
        b->split_rpb = srpb && srpb[0] ? strtoull(srpb, NULL, 10) : TR_SPLIT_RPB;
        if (b->split_rpb < 1 || b->split_rpb > TR_SPLIT_MAX_RPB) b->split_rpb = TR_SPLIT_RPB;
        /* TR_CUDA_PERSIST_BLOCKS_PER_SM=1: half the lists to merge, for measuring the trade-off */
        const char *bps = getenv("TR_CUDA_PERSIST_BLOCKS_PER_SM");
        if (bps && bps[0] >= '1' && bps[0] - '0' < per_sm) per_sm = bps[0] - '0';
        long grid = (long)per_sm * b->sms;
        if (grid > b->grid_max) grid = b->grid_max;
        b->pgrid = (unsigned)grid;
        b->persist_ok = coop && grid > 0 && !(pe && pe[0] == '0');
        CREATE_TRY(row_cache_layout(b, per_sm));
        const char *smr = getenv("TR_CUDA_SPLIT_MAX_ROWS");
        /* the split scan reads its runs from the row cache: runs of at most cache_rows, and at least split_rpb */
        const uint64_t split_cap = b->cache_rows >= b->split_rpb ? (uint64_t)grid * b->cache_rows : 0;
        b->split_max_rows = smr && smr[0] ? strtoull(smr, NULL, 10) : split_cap;
        if (b->split_max_rows > split_cap) b->split_max_rows = split_cap;
    }
    if (b->persist_ok) {
        size_t msg_chunks = persist_msg_chunks(TR_BQ_MAX, b->nvec);
        if (msg_chunks < TR_MSG_HEAD) msg_chunks = TR_MSG_HEAD; /* block 0 reads a whole head, message or not */
        const size_t mb_bytes = sizeof(PersistMailbox) + ((size_t)TR_BQ_MAX * b->nvec + msg_chunks) * sizeof(uint4);
        b->pstream = (unsigned char *)calloc(sizeof(PersistReq) + ((size_t)TR_BQ_MAX * b->nvec + 1) * sizeof(uint4), 1);
        b->preq = reinterpret_cast<PersistReq *>(b->pstream);
        b->pq16 = reinterpret_cast<uint4 *>(b->pstream + sizeof(PersistReq));
        if (!b->pstream) {
            snprintf(err, errlen, "out of host memory for the persistent kernel's queries");
            cuda_destroy(b);
            return NULL;
        }
        CREATE_TRY(cudaHostAlloc((void **)&b->pmb, mb_bytes, cudaHostAllocMapped | cudaHostAllocPortable));
        memset(b->pmb, 0, mb_bytes);
        CREATE_TRY(cudaHostGetDevicePointer((void **)&b->pmb_dev, b->pmb, 0));
        CREATE_TRY(cudaMalloc(&b->pdreq, sizeof(PersistReq)));
        /* dq: the batch's queries (builds past TR_ONE_TRIP_MAX_ROWS) or block 0's relay of the tagged message (the
         * others), zeroed: no chunk carries seq 0 */
        const size_t dq_vecs = (size_t)TR_BQ_MAX * b->nvec > msg_chunks ? (size_t)TR_BQ_MAX * b->nvec : msg_chunks;
        CREATE_TRY(cudaMalloc(&b->pdq, dq_vecs * sizeof(uint4)));
        CREATE_TRY(cudaMemset(b->pdq, 0, dq_vecs * sizeof(uint4)));
        CREATE_TRY(cudaMalloc(&b->pctl, sizeof(PersistCtl)));
    }
    {
        const char *v = getenv("TR_CUDA_VERBOSE");
        b->verbose = v && v[0] == '1';
        const char *pf = getenv("TR_CUDA_PROFILE");
        b->profile = pf && pf[0] == '1';
        if (b->profile && b->persist_ok) {
            const size_t bytes = (size_t)b->pgrid * TR_PH_SLOTS * sizeof(unsigned long long);
            CREATE_TRY(cudaMalloc(&b->pphase, bytes));
            CREATE_TRY(cudaMemset(b->pphase, 0, bytes));
        }
        if (b->verbose) {
            if (b->persist_ok)
                fprintf(stderr, "tr-sidecar: cuda: persistent kernel on (%u blocks); split scan up to %llu rows (row "
                        "cache of %u rows per block, %zu bytes of shared memory per block)\n", b->pgrid,
                        (unsigned long long)b->split_max_rows, b->cache_rows, b->psmem_split);
            else fprintf(stderr, "tr-sidecar: cuda: persistent kernel off (launch per request)\n");
        }
    }
    CREATE_TRY(cudaDeviceSynchronize());
    return b;
#undef CREATE_TRY
}

static void cuda_destroy(void *self) {
    cuda_backend *b = (cuda_backend *)self;
    if (!b) return;
    if (b->persist_running) {
        char e[TR_MESSAGE_BYTES];
        persist_stop(b, "exit", e, sizeof e);
    }
    if (b->stream) cudaStreamSynchronize(b->stream);
    if (b->seg_registered) cudaHostUnregister(b->seg_host);
    if (b->batch_done) cudaEventDestroy(b->batch_done);
    cudaFree(b->X); cudaFree(b->ids); cudaFree(b->ns);
    cudaFree(b->part_s); cudaFree(b->part_id); cudaFree(b->part_n); cudaFree(b->done);
    cudaFree(b->bpart_s); cudaFree(b->bpart_id); cudaFree(b->bpart_n); cudaFree(b->bdone); cudaFree(b->dq);
    cudaFree(b->pdreq); cudaFree(b->pdq); cudaFree(b->pctl); cudaFree(b->pphase);
    if (b->pmb) cudaFreeHost(b->pmb);
    free(b->pstream);
    if (b->hq16) cudaFreeHost(b->hq16);
    if (b->hq) cudaFreeHost(b->hq);
    if (b->hres_ids) cudaFreeHost(b->hres_ids);
    if (b->hres_s) cudaFreeHost(b->hres_s);
    if (b->hres_hits) cudaFreeHost(b->hres_hits);
    if (b->hstage) cudaFreeHost(b->hstage);
    if (b->stage_free) cudaEventDestroy(b->stage_free);
    if (b->stream) cudaStreamDestroy(b->stream);
    free(b);
}

/* Bytes of one staged row: vector (ld elements) + id + ns, kept 16-byte aligned per section. */
static int ensure_stage(cuda_backend *b, uint32_t n, char *err, size_t errlen) {
    if (n <= b->hstage_cap) return 0;
    CUDA_TRY(cudaStreamSynchronize(b->stream));
    if (b->hstage) cudaFreeHost(b->hstage);
    b->hstage = NULL;
    b->hstage_cap = 0;
    size_t cap = n < 256 ? 256 : n;
    size_t bytes = cap * ((size_t)b->nvec * 16 + 8 + 8 + 8);
    CUDA_TRY(cudaHostAlloc((void **)&b->hstage, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    CUDA_TRY(cudaHostGetDevicePointer((void **)&b->hstage_dev, b->hstage, 0));
    b->hstage_cap = cap;
    return 0;
}

static void f32_to_f16(const float *src, uint16_t *dst, uint32_t n);

/* 12 bytes from src and then tag, as one 16-byte store that no reader sees in part (the persistent kernel's
 * message chunks): x86-64 CPUs with AVX carry out an aligned 16-byte SSE store atomically (Intel SDM vol. 3A
 * 9.1.1; AMD likewise), and an aligned STP of two 64-bit registers is single-copy atomic from Armv8.4
 * (FEAT_LSE2). src may be unaligned; its 16 bytes are read. */
static inline void store16_tagged(uint4 *dst, const unsigned char *src, uint32_t tag) {
#if defined(__x86_64__)
    const __m128i low12 = _mm_set_epi32(0, -1, -1, -1);
    const __m128i v = _mm_or_si128(_mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i *>(src)), low12),
                                   _mm_set_epi32((int)tag, 0, 0, 0));
    _mm_store_si128(reinterpret_cast<__m128i *>(dst), v);
#elif defined(__aarch64__)
    uint64_t lo, hi;
    memcpy(&lo, src, 8);
    memcpy(&hi, src + 8, 8);
    hi = (uint64_t)tag << 32 | (hi & 0xFFFFFFFFull);
    asm volatile("stp %0, %1, [%2]" ::"r"(lo), "r"(hi), "r"(dst) : "memory");
#else
#error "the persistent kernel's mailbox needs an atomic 16-byte store on this CPU"
#endif
}

static int cuda_write_rows(void *self, const uint64_t *rows, uint32_t n, const float *vectors,
                           const int64_t *ids, const uint64_t *ns, char *err, size_t errlen) {
    cuda_backend *b = (cuda_backend *)self;
    if (n == 0) return 0;
    for (uint32_t i = 0; i < n; i++) {
        if (rows[i] >= b->capacity) {
            snprintf(err, errlen, "internal: row %llu beyond capacity", (unsigned long long)rows[i]);
            return TR_E_INTERNAL;
        }
    }
    int rc = persist_stop(b, "write", err, errlen); /* the scatter runs on the stream the kernel holds */
    if (rc) return rc;
    rc = ensure_stage(b, n, err, errlen);
    if (rc) return rc;
    /* the previous scatter may still read the staging buffer */
    CUDA_TRY(cudaEventSynchronize(b->stage_free));
    const size_t cap = b->hstage_cap;
    unsigned char *vec = b->hstage;
    int64_t *sids = (int64_t *)(b->hstage + cap * (size_t)b->nvec * 16);
    uint64_t *sns = (uint64_t *)(sids + cap);
    uint64_t *srows = sns + cap;
    for (uint32_t i = 0; i < n; i++) {
        const float *src = vectors + (size_t)i * b->dim;
        if (b->dtype == TR_DTYPE_F16) {
            /* F16C where the CPU has it: __float2half_rn element by element cost ~100 us per 84 rows of 768 */
            uint16_t *dst = (uint16_t *)(vec + (size_t)i * b->nvec * 16);
            f32_to_f16(src, dst, b->dim);
            memset(dst + b->dim, 0, (size_t)(b->ld - b->dim) * sizeof(uint16_t)); /* +0.0 in f16 */
        } else {
            float *dst = (float *)(vec + (size_t)i * b->nvec * 16);
            memcpy(dst, src, (size_t)b->dim * 4);
            for (uint32_t j = b->dim; j < b->ld; j++) dst[j] = 0.f;
        }
        sids[i] = ids[i];
        sns[i] = ns[i];
        srows[i] = rows[i];
    }
    const unsigned char *dev = b->hstage_dev;
    unsigned grid = n < 1024 ? n : 1024;
    scatter_rows<<<grid, 128, 0, b->stream>>>(b->X, b->ids, b->ns, (const uint4 *)dev,
                                              (const int64_t *)(dev + cap * (size_t)b->nvec * 16),
                                              (const uint64_t *)(dev + cap * (size_t)b->nvec * 16 + cap * 8),
                                              (const uint64_t *)(dev + cap * (size_t)b->nvec * 16 + cap * 16),
                                              n, b->nvec);
    CUDA_TRY(cudaGetLastError());
    CUDA_TRY(cudaEventRecord(b->stage_free, b->stream));
    return 0;
}

static int cuda_move_row(void *self, uint64_t dst, uint64_t src, char *err, size_t errlen) {
    cuda_backend *b = (cuda_backend *)self;
    if (dst >= b->capacity || src >= b->capacity) {
        snprintf(err, errlen, "internal: move %llu -> %llu beyond capacity", (unsigned long long)src,
                 (unsigned long long)dst);
        return TR_E_INTERNAL;
    }
    int rc = persist_stop(b, "write", err, errlen);
    if (rc) return rc;
    move_row_kernel<<<1, 128, 0, b->stream>>>(b->X, b->ids, b->ns, dst, src, b->nvec);
    CUDA_TRY(cudaGetLastError());
    return 0;
}

static int cuda_set_row_count(void *self, uint64_t rows, char *err, size_t errlen) {
    cuda_backend *b = (cuda_backend *)self;
    (void)err; (void)errlen;
    /* Searches are enqueued on the same stream after the writes that made these rows. */
    b->rows = rows;
    return 0;
}

static int ensure_query_buffers(cuda_backend *b, uint32_t nq, char *err, size_t errlen) {
    if (nq > b->hq_cap) {
        if (b->hq) cudaFreeHost(b->hq);
        b->hq = NULL;
        b->hq_cap = 0;
        CUDA_TRY(cudaHostAlloc((void **)&b->hq, (size_t)nq * b->ld * sizeof(float) + 16,
                               cudaHostAllocMapped | cudaHostAllocPortable));
        CUDA_TRY(cudaHostGetDevicePointer((void **)&b->hq_dev, b->hq, 0));
        b->hq_cap = nq;
    }
    if (nq > b->hres_cap) {
        if (b->hres_ids) cudaFreeHost(b->hres_ids);
        if (b->hres_s) cudaFreeHost(b->hres_s);
        if (b->hres_hits) cudaFreeHost(b->hres_hits);
        b->hres_ids = NULL; b->hres_s = NULL; b->hres_hits = NULL;
        b->hres_cap = 0;
        uint32_t cap = nq < 16 ? 16 : nq;
        CUDA_TRY(cudaHostAlloc((void **)&b->hres_ids, (size_t)cap * b->max_k * sizeof(long long),
                               cudaHostAllocMapped | cudaHostAllocPortable));
        CUDA_TRY(cudaHostAlloc((void **)&b->hres_s, (size_t)cap * b->max_k * sizeof(float),
                               cudaHostAllocMapped | cudaHostAllocPortable));
        CUDA_TRY(cudaHostAlloc((void **)&b->hres_hits, (size_t)cap * sizeof(unsigned),
                               cudaHostAllocMapped | cudaHostAllocPortable));
        CUDA_TRY(cudaHostGetDevicePointer((void **)&b->hres_ids_dev, b->hres_ids, 0));
        CUDA_TRY(cudaHostGetDevicePointer((void **)&b->hres_s_dev, b->hres_s, 0));
        CUDA_TRY(cudaHostGetDevicePointer((void **)&b->hres_hits_dev, b->hres_hits, 0));
        b->hres_cap = cap;
    }
    return 0;
}

template <typename T>
static cudaError_t launch_one(cuda_backend *b, const SearchParams &p, unsigned grid, const float *q_host) {
    const size_t smem = (size_t)b->ld * sizeof(float);
    if (q_host) {
        QueryInline<TR_CUDA_INLINE_DIM> qin;
        memcpy(qin.q, q_host, (size_t)b->dim * sizeof(float));
        search_kernel<T, TR_CUDA_INLINE_DIM><<<grid, TR_CUDA_BLOCK, smem, b->stream>>>(p, qin);
    } else {
        QueryInline<1> qin;
        qin.q[0] = 0.f;
        search_kernel<T, 1><<<grid, TR_CUDA_BLOCK, smem, b->stream>>>(p, qin);
    }
    return cudaGetLastError();
}

static int cuda_search(void *self, const float *queries, uint32_t nq, uint32_t k, int filter_ns,
                       uint64_t ns_hash, int64_t *ids_out, float *scores_out, uint32_t *hits,
                       char *err, size_t errlen) {
    cuda_backend *b = (cuda_backend *)self;
    *hits = 0;
    if (k < 1 || k > b->max_k) {
        snprintf(err, errlen, "k=%u is out of range: use 1 <= k <= %u", k, b->max_k);
        return TR_E_BAD_K;
    }
    if (b->rows == 0 || nq == 0) {
        for (size_t i = 0; i < (size_t)nq * k; i++) {
            ids_out[i] = -1;
            scores_out[i] = -INFINITY;
        }
        return 0;
    }
    int rc = persist_stop(b, "launch", err, errlen); /* this search is launched on the kernel's stream */
    if (rc) return rc;
    rc = ensure_query_buffers(b, nq, err, errlen);
    if (rc) return rc;
    const bool inline_q = b->dim <= TR_CUDA_INLINE_DIM && nq == 1;
    if (!inline_q) {
        for (uint32_t q = 0; q < nq; q++) {
            float *dst = b->hq + (size_t)q * b->ld;
            memcpy(dst, queries + (size_t)q * b->dim, (size_t)b->dim * sizeof(float));
            for (uint32_t j = b->dim; j < b->ld; j++) dst[j] = 0.f;
        }
    }
    if (b->poison) { /* tests: a result the kernel failed to write must not look valid */
        memset(b->hres_ids, 0x7f, (size_t)nq * k * sizeof(long long));
        memset(b->hres_s, 0x7f, (size_t)nq * k * sizeof(float));
        memset(b->hres_hits, 0x7f, (size_t)nq * sizeof(unsigned));
    }
    uint64_t blocks = (b->rows + TR_CUDA_MIN_ROWS_PER_BLOCK - 1) / TR_CUDA_MIN_ROWS_PER_BLOCK;
    unsigned grid = blocks < (uint64_t)b->grid_max ? (unsigned)blocks : (unsigned)b->grid_max;
    SearchParams p;
    memset(&p, 0, sizeof p);
    p.X = b->X;
    p.ids = b->ids;
    p.ns = b->ns;
    p.part_s = b->part_s;
    p.part_id = b->part_id;
    p.part_n = b->part_n;
    p.done = b->done;
    p.rows = b->rows;
    p.rows_per_block = (b->rows + grid - 1) / grid;
    p.ns_hash = ns_hash;
    p.nvec = b->nvec;
    p.ld = b->ld;
    p.dim = b->dim;
    p.k = k;
    p.filter = filter_ns ? 1 : 0;
    for (uint32_t q = 0; q < nq; q++) {
        p.qptr = b->hq_dev + (size_t)q * b->ld;
        p.out_ids = b->hres_ids_dev + (size_t)q * k;
        p.out_s = b->hres_s_dev + (size_t)q * k;
        p.out_hits = b->hres_hits_dev + q;
        const float *qh = inline_q ? queries : NULL;
        cudaError_t e = b->dtype == TR_DTYPE_F16 ? launch_one<__half>(b, p, grid, qh)
                                                 : launch_one<float>(b, p, grid, qh);
        CUDA_TRY(e);
    }
    CUDA_TRY(cudaStreamSynchronize(b->stream));
    for (uint32_t q = 0; q < nq; q++) {
        memcpy(ids_out + (size_t)q * k, b->hres_ids + (size_t)q * k, (size_t)k * sizeof(int64_t));
        memcpy(scores_out + (size_t)q * k, b->hres_s + (size_t)q * k, (size_t)k * sizeof(float));
    }
    *hits = b->hres_hits[nq - 1];
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* batched search (search_many)                                                                */

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
__attribute__((target("f16c,avx"))) static void f32_to_f16_f16c(const float *src, uint16_t *dst, uint32_t n) {
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) {
        __half h = __float2half_rn(src[i]);
        memcpy(dst + i, &h, 2);
    }
}
#endif

static void f32_to_f16(const float *src, uint16_t *dst, uint32_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    static int f16c = -1;
    if (f16c < 0) f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
    if (f16c) {
        f32_to_f16_f16c(src, dst, n);
        return;
    }
#endif
    for (uint32_t i = 0; i < n; i++) {
        __half h = __float2half_rn(src[i]);
        memcpy(dst + i, &h, 2);
    }
}

static size_t batch_smem(const cuda_backend *b, int nt) {
    const size_t nchunk = (b->nvec + 3) / 4, qstride = nchunk * 4 + 1;
    const size_t scan = (size_t)nt * 8 * qstride * 16 + (size_t)nt * 8 * TR_BQ_CB * (sizeof(long long) + sizeof(float));
    const size_t merge = (size_t)TR_BQ_MCB * (sizeof(long long) + sizeof(float)); /* fused merge aliases it */
    return scan > merge ? scan : merge;
}

/* The split build's row cache (RowCache): it starts past what a one-tile scan (queries, lists, the parts' sums) and
 * the fused merge use, and holds as many rows (up to TR_SPLIT_MAX_RPB) as keep per_sm blocks of the build resident
 * on an SM (the grid every build shares). The split build then serves tiers of up to that many rows per block. */
static cudaError_t row_cache_layout(cuda_backend *b, int per_sm) {
    /* batch_smem(b, 1) covers the one-tile scan and the merge; the parts' sums follow the scan's lists */
    const size_t off = (batch_smem(b, 1) + (size_t)TR_CUDA_BLOCK * sizeof(float4) + 15) / 16;
    const unsigned stride = b->nvec + (12u - b->nvec % 8u) % 8u; /* = 4 mod 8 */
    const void *kernel = (const void *)persist_kernel<true, true>;
    b->psmem_split = b->psmem;
    b->cache_off = (unsigned)off;
    b->cache_stride = stride;
    b->cache_rows = 0;
    for (unsigned rows = TR_SPLIT_MAX_RPB; rows > 0; rows--) {
        /* the rows, then their ids and namespace hashes (8 bytes each, from a 16-byte boundary) */
        size_t smem = (off + (size_t)rows * stride + 2 * ((rows + 1) / 2)) * 16;
        if (smem < b->psmem) smem = b->psmem;
        if (smem > b->smem_optin) continue;
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        int fit = 0;
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, TR_CUDA_BLOCK, smem);
        if (e != cudaSuccess) return e;
        if (fit >= per_sm) {
            b->cache_rows = rows;
            b->psmem_split = smem;
            return cudaSuccess;
        }
    }
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)b->psmem);
}

static int ensure_batch_buffers(cuda_backend *b, uint32_t nq, char *err, size_t errlen) {
    if (nq <= b->bq_cap) return 0;
    CUDA_TRY(cudaStreamSynchronize(b->stream));
    if (b->hq16) cudaFreeHost(b->hq16);
    if (b->dq) cudaFree(b->dq);
    b->hq16 = NULL;
    b->dq = NULL;
    b->bq_cap = 0;
    const uint32_t cap = nq < 64 ? 64 : nq;
    CUDA_TRY(cudaHostAlloc((void **)&b->hq16, (size_t)cap * b->nvec * sizeof(uint4), cudaHostAllocPortable));
    CUDA_TRY(cudaMalloc((void **)&b->dq, (size_t)cap * b->nvec * sizeof(uint4)));
    b->bq_cap = cap;
    return 0;
}

template <int NT, int INL>
static cudaError_t launch_batch(cuda_backend *b, const BatchParams &p, unsigned grid, const uint4 *q_host) {
    BatchInline<INL ? TR_BQ_INLINE : 1> qin;
    if (INL) memcpy(qin.v, q_host, (size_t)p.nq * p.nvec * sizeof(uint4));
    else memset(&qin, 0, sizeof qin);
    if (p.nq <= b->fuse_max) { /* one launch: the last scan block merges */
        batch_scan_kernel<NT, INL, 1><<<grid, TR_CUDA_BLOCK, batch_smem(b, NT), b->stream>>>(p, qin);
        return cudaGetLastError();
    }
    batch_scan_kernel<NT, INL, 0><<<grid, TR_CUDA_BLOCK, batch_smem(b, NT), b->stream>>>(p, qin);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    batch_merge_kernel<<<p.nq, TR_CUDA_BLOCK, 0, b->stream>>>(p, grid);
    return cudaGetLastError();
}

/* Device pointer for host memory inside the registered segment, or NULL. */
static void *seg_device_ptr(const cuda_backend *b, const void *host, size_t bytes) {
    if (!b->seg_registered) return NULL;
    const unsigned char *h = (const unsigned char *)host;
    if (h < b->seg_host || h + bytes > b->seg_host + b->seg_bytes) return NULL;
    return b->seg_dev + (h - b->seg_host);
}

static int cuda_search_poll(void *self, int block, char *err, size_t errlen);

/* One query -> f16 row of the batched scan, zero-padded to whole uint4. */
static void stage_query_f16(const cuda_backend *b, const float *query, uint4 *dst) {
    uint16_t *h = (uint16_t *)dst;
    f32_to_f16(query, h, b->dim);
    for (uint32_t j = b->dim; j < b->ld; j++) h[j] = 0;
}

/* The store's part of a batched pass (launched or persistent): rows in runs of at least min_rpb rows (whole
 * rounds, except for the persistent kernel's split build) over at most max_blocks blocks, walked backward every
 * other pass (BatchParams::backward). Returns the number of runs, i.e. of scanning blocks and partial lists. */
static unsigned batch_params_init(cuda_backend *b, BatchParams &p, unsigned max_blocks, uint64_t min_rpb = TR_BQ_ROUND) {
    memset(&p, 0, sizeof p);
    p.backward = b->alternate && (b->passes++ & 1u);
    uint64_t rpb = (b->rows + max_blocks - 1) / max_blocks;
    if (rpb < min_rpb) rpb = min_rpb;
    p.X = b->X;
    p.ids = b->ids;
    p.ns = b->ns;
    p.part_s = b->bpart_s;
    p.part_id = b->bpart_id;
    p.part_n = b->bpart_n;
    p.rows = b->rows;
    p.rows_per_block = rpb;
    p.nvec = b->nvec;
    p.nchunk = (b->nvec + 3) / 4;
    p.qstride = p.nchunk * 4 + 1;
    return (unsigned)((b->rows + rpb - 1) / rpb);
}

/* Query j of a pass: request r's parameters, results to oid/osc (device pointers). */
static void set_batch_query(BatchParams &p, uint32_t j, const tr_search_request *r, long long *oid, float *osc) {
    p.bq[j].k = r->k;
    p.bq[j].filter = r->filter_ns ? 1 : 0;
    p.bq[j].ns_hash = r->ns_hash;
    p.bq[j].oid = oid;
    p.bq[j].osc = osc;
    p.any_filter |= (unsigned)p.bq[j].filter;
}

/* Hands the batch (b->preq and nq rows of b->pq16) to the running kernel. The builds with the one-trip merge take
 * it as one message (the stream in b->pstream) in the mailbox's message area with the tag
 * seq << 8 | nq, one atomic 16-byte store per chunk: the kernel takes a chunk whose tag it sees as whole (a DMA
 * read sees an aligned 16 bytes of one cache line as the one store left them). Words past the message in its last
 * chunk are whatever the stream holds there; the kernel ignores them. */
static void persist_post(cuda_backend *b, unsigned nq) {
    if (!b->persist_tagged) { /* the build past TR_ONE_TRIP_MAX_ROWS: the batch, then the word */
        memcpy(&b->pmb->req, b->preq, sizeof(PersistReq));
        memcpy(b->pmb + 1, b->pq16, (size_t)nq * b->nvec * sizeof(uint4));
        __atomic_store_n(&b->pmb->word, b->pseq << 8 | nq, __ATOMIC_RELEASE);
        return;
    }
    const unsigned tag = b->pseq << 8 | nq, chunks = persist_msg_chunks(nq, b->nvec);
    uint4 *msg = persist_msg_area(b->pmb, b->nvec);
    for (unsigned c = 0; c < chunks; c++) store16_tagged(&msg[c], b->pstream + (size_t)c * 12u, tag);
    for (unsigned c = 0; c < chunks; c += 4) tr_cache_demote(&msg[c]); /* the device reads them next */
}

/* Launches the persistent kernel (asynchronously: it picks up the mailbox once it runs). */
static int persist_start(cuda_backend *b, char *err, size_t errlen) {
    unsigned seq = b->pseq, nvec = b->nvec;
    void *args[] = {&b->pmb_dev, &b->pdreq, &b->pdq, &b->pctl, &seq, &nvec, &b->pphase};
    /* chosen by the row count now: writes stop it, but a delete that moves no row only shrinks b->rows while it
     * runs. Each pass reads its row count and rows per block from its own parameters, so each build is exact at
     * any size (the split one for any rows per block, though it only ever gets 64 or fewer); the choice only
     * decides speed. */
    b->persist_split = b->rows <= b->split_max_rows;
    b->persist_tagged = b->persist_split || b->rows <= b->one_trip_max_rows;
    const void *kernel = b->persist_split                   ? (const void *)persist_kernel<true, true>
                         : b->rows <= b->one_trip_max_rows ? (const void *)persist_kernel<true, false>
                                                           : (const void *)persist_kernel<false, false>;
    PersistCtl ctl;
    memset(&ctl, 0, sizeof ctl);
    if (b->persist_split) {
        ctl.cache_off = b->cache_off;
        ctl.cache_rows = b->cache_rows;
        ctl.cache_stride = b->cache_stride;
    }
    /* pageable source: the copy has taken ctl before it returns */
    CUDA_TRY(cudaMemcpyAsync(b->pctl, &ctl, sizeof ctl, cudaMemcpyHostToDevice, b->stream));
    cudaError_t e = cudaLaunchCooperativeKernel(kernel, dim3(b->pgrid), dim3(TR_CUDA_BLOCK), args,
                                                b->persist_split ? b->psmem_split : b->psmem, b->stream);
    if (e != cudaSuccess) {
        cudaGetLastError();
        fprintf(stderr, "tr-sidecar: cuda: the persistent kernel cannot start (%s): launching per request from now on\n",
                cudaGetErrorString(e));
        b->persist_ok = 0;
        return 1; /* not an error: the caller uses the launch path */
    }
    b->persist_running = 1;
    b->ppolls = 0;
    if (b->verbose)
        fprintf(stderr, "tr-sidecar: cuda: persistent kernel started for %llu rows (%s)\n", (unsigned long long)b->rows,
                b->persist_split ? "split scan" : b->rows <= b->one_trip_max_rows ? "one-trip merge" : "merge in rounds");
    return 0;
}

/* Waits (spinning) until the persistent kernel has answered seq, or reports that it died. */
static uint64_t host_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Logs the per-block phases (TR_PH_*) added up since the last stop and clears them: the scanning
 * blocks' mean and their slowest block's mean, and the other blocks' mean (they only take a ticket). */
static void log_block_phases(cuda_backend *b) {
    const size_t n = (size_t)b->pgrid * TR_PH_SLOTS;
    unsigned long long *h = (unsigned long long *)calloc(n, sizeof *h);
    if (!h || cudaMemcpy(h, b->pphase, n * sizeof *h, cudaMemcpyDeviceToHost) != cudaSuccess) {
        free(h);
        return;
    }
    double cyc = 0, ns = 0;
    for (unsigned blk = 0; blk < b->pgrid; blk++) {
        cyc += (double)h[blk * TR_PH_SLOTS + TR_PH_CYCLES];
        ns += (double)h[blk * TR_PH_SLOTS + TR_PH_NS];
    }
    const double us_per_cycle = cyc > 0 ? ns / cyc / 1e3 : 0;
    static const char *names[] = {"stage", "round 1", "more rounds", "lists", "fence", "ticket"};
    char line[1024];
    int at = snprintf(line, sizeof line, "tr-sidecar: cuda: block phases, mean us per batch (scanning blocks "
                      "mean/slowest, %u of %u; others mean; %.3f GHz):", b->pG, b->pgrid,
                      us_per_cycle > 0 ? 1e-3 / us_per_cycle : 0.0);
    for (int i = 0; i <= TR_PH_GO_NS && at < (int)sizeof line; i++) {
        if (i == TR_PH_CYCLES || i == TR_PH_NS) continue;
        double sum_s = 0, max_s = 0, sum_o = 0;
        unsigned ns_ = 0, no = 0;
        for (unsigned blk = 0; blk < b->pgrid; blk++) {
            const unsigned long long *ph = h + blk * TR_PH_SLOTS;
            if (!ph[TR_PH_COUNT]) continue;
            const double v = (double)ph[i] / (double)ph[TR_PH_COUNT] * (i == TR_PH_GO_NS ? 1e-3 : us_per_cycle);
            if (blk < b->pG) {
                sum_s += v;
                if (v > max_s) max_s = v;
                ns_++;
            } else {
                sum_o += v;
                no++;
            }
        }
        at += snprintf(line + at, sizeof line - at, " %s %.2f/%.2f|%.2f;", i == TR_PH_GO_NS ? "go seen" : names[i],
                       ns_ ? sum_s / ns_ : 0.0, max_s, no ? sum_o / no : 0.0);
    }
    fprintf(stderr, "%s\n", line);
    free(h);
    cudaMemset(b->pphase, 0, n * sizeof *h);
}

static void persist_profile(cuda_backend *b) {
    const unsigned long long *t = b->pmb->stamp;
    b->prof_sum[0] += host_ns() - b->psubmit_ns;
    b->prof_sum[1] += t[1] - t[0];
    b->prof_sum[2] += t[2] - t[1];
    b->prof_sum[3] += t[3] - t[2];
    b->prof_n++;
    const unsigned long long *m = b->pmb->merge_stamp;
    if (m[0] > t[2] && m[1] >= m[0] && t[3] >= m[1]) { /* this batch's fused merge (not the per-query kernels) */
        b->prof_merge[0] += m[0] - t[2];
        b->prof_merge[1] += m[1] - m[0];
        b->prof_merge[2] += m[2];
        b->prof_merge_n++;
    }
}

static int persist_wait(cuda_backend *b, unsigned seq, int block, char *err, size_t errlen) {
    for (;;) {
        if (__atomic_load_n(&b->pmb->done_seq, __ATOMIC_ACQUIRE) == seq) {
            if (b->profile) persist_profile(b);
            return 0;
        }
        if ((++b->ppolls & 1023u) == 0) {
            /* the kernel never returns while serving: a finished or failed stream means it died */
            cudaError_t e = cudaStreamQuery(b->stream);
            if (e != cudaErrorNotReady) {
                if (__atomic_load_n(&b->pmb->done_seq, __ATOMIC_ACQUIRE) == seq) return 0;
                b->persist_running = 0;
                if (e == cudaSuccess) {
                    snprintf(err, errlen, "internal: the persistent search kernel stopped without answering");
                    return TR_E_INTERNAL;
                }
                CUDA_TRY(e);
            }
        }
        if (!block) return 1;
    }
}

/* Stops the persistent kernel (before anything else runs on its stream, and when the server goes to
 * sleep) and waits until it has exited. */
static int persist_stop(cuda_backend *b, const char *why, char *err, size_t errlen) {
    if (!b->persist_running) return 0;
    if (b->persist_pending) { /* the server never does this; stay correct if a caller does */
        int rc = persist_wait(b, b->pseq, 1, err, errlen);
        if (rc) return rc;
    }
    b->preq->nq = 0;
    b->pseq = persist_next_seq(b->pseq);
    persist_post(b, 0);
    b->persist_running = 0;
    CUDA_TRY(cudaStreamSynchronize(b->stream));
    if (b->verbose)
        fprintf(stderr, "tr-sidecar: cuda: persistent kernel stopped (%s) after %llu batches\n", why, b->pbatches);
    if (b->profile && b->prof_n) {
        const double n = (double)b->prof_n;
        fprintf(stderr, "tr-sidecar: cuda: profile over %llu batches, mean us: host submit->done seen %.2f | "
                "kernel: message seen->go %.2f, go->last ticket %.2f, last ticket->done %.2f\n", b->prof_n,
                b->prof_sum[0] / n / 1e3, b->prof_sum[1] / n / 1e3, b->prof_sum[2] / n / 1e3, b->prof_sum[3] / n / 1e3);
        if (b->prof_merge_n) {
            const double mn = (double)b->prof_merge_n;
            fprintf(stderr, "tr-sidecar: cuda: profile of the fused merge over %llu batches, mean us: bounds %.2f, "
                    "candidates %.2f (%.1f kept), rank and write the rest of last ticket->done\n", b->prof_merge_n,
                    b->prof_merge[0] / mn / 1e3, b->prof_merge[1] / mn / 1e3, b->prof_merge[2] / mn);
        }
        memset(b->prof_sum, 0, sizeof b->prof_sum);
        memset(b->prof_merge, 0, sizeof b->prof_merge);
        b->prof_n = b->prof_merge_n = 0;
        log_block_phases(b);
    }
    b->pbatches = 0;
    return 0;
}

static void cuda_idle(void *self) {
    cuda_backend *b = (cuda_backend *)self;
    char e[TR_MESSAGE_BYTES];
    if (persist_stop(b, "idle", e, sizeof e)) fprintf(stderr, "tr-sidecar: cuda: %s\n", e);
}

/* Hands n requests (total queries, each k <= TR_BQ_MAX_K, total <= TR_BQ_MAX) to the persistent
 * kernel through the mailbox; results go straight into the slots (registered segment), hits into
 * the mailbox. Returns 0, a negative tr_status, or 1 when the kernel could not start. */
static int persist_submit(cuda_backend *b, tr_search_request *reqs, uint32_t n, uint32_t total, char *err,
                          size_t errlen) {
    if (!b->persist_running) {
        int rc = persist_start(b, err, errlen);
        if (rc) return rc;
    }
    PersistReq *pr = b->preq;
    BatchParams &p = pr->p;
    uint4 *q16 = b->pq16;
    pr->G = batch_params_init(b, p, b->pgrid, b->persist_split ? b->split_rpb : TR_BQ_ROUND);
    uint32_t f = 0;
    for (uint32_t i = 0; i < n; i++) {
        tr_search_request *r = &reqs[i];
        for (uint32_t q = 0; q < r->count; q++, f++) {
            stage_query_f16(b, r->queries + (size_t)q * b->dim, q16 + (size_t)f * b->nvec);
            if (b->poison) {
                memset(r->ids_out + (size_t)q * r->k, 0x7f, (size_t)r->k * sizeof(int64_t));
                memset(r->scores_out + (size_t)q * r->k, 0x7f, (size_t)r->k * sizeof(float));
                memset(&b->pmb->hits[f], 0x7f, sizeof(unsigned));
            }
            long long *oid = (long long *)seg_device_ptr(b, r->ids_out + (size_t)q * r->k, (size_t)r->k * 8);
            float *osc = (float *)seg_device_ptr(b, r->scores_out + (size_t)q * r->k, (size_t)r->k * 4);
            if (!oid || !osc) { /* not in the registered segment: let the launch path copy them out */
                return 1;
            }
            set_batch_query(p, f, r, oid, osc);
        }
    }
    pr->nq = total;
    pr->profile = (unsigned)b->profile;
    b->pG = pr->G;
    p.q = b->pdq;
    p.out_hits = reinterpret_cast<unsigned *>(reinterpret_cast<unsigned char *>(b->pmb_dev) +
                                              offsetof(PersistMailbox, hits));
    p.nq = total;
    b->pseq = persist_next_seq(b->pseq);
    if (b->profile) b->psubmit_ns = host_ns();
    persist_post(b, total);
    b->pending = 1;
    b->persist_pending = 1;
    b->pbatches++;
    b->preqs = reqs;
    b->pn = n;
    return 0;
}

static int cuda_search_submit(void *self, tr_search_request *reqs, uint32_t n, char *err, size_t errlen) {
    cuda_backend *b = (cuda_backend *)self;
    if (b->pending) { /* the server never does this; stay correct if a caller does */
        int rc = cuda_search_poll(self, 1, err, errlen);
        if (rc < 0) return rc;
    }
    const bool mma = b->mma_ok && b->rows > 0 && b->rows < (1ull << 40);
    if (b->persist_ok && mma) {
        uint32_t q = 0, all_mma = 1;
        for (uint32_t i = 0; i < n; i++) {
            q += reqs[i].count;
            all_mma &= reqs[i].k >= 1 && reqs[i].k <= TR_BQ_MAX_K;
        }
        if (all_mma && q <= TR_BQ_MAX) {
            int rc = persist_submit(b, reqs, n, q, err, errlen);
            if (rc <= 0) return rc; /* 1: launch instead */
        }
    }
    {   /* launched below, on the stream the persistent kernel holds (more than TR_BQ_MAX queries, k >
         * TR_BQ_MAX_K, f32 rows, or results outside the registered segment) */
        int rc = persist_stop(b, "launch", err, errlen);
        if (rc) return rc;
    }
    uint32_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        tr_search_request *r = &reqs[i];
        if (mma && r->k >= 1 && r->k <= TR_BQ_MAX_K) {
            total += r->count;
            continue;
        }
        r->status = cuda_search(self, r->queries, r->count, r->k, r->filter_ns, r->ns_hash, r->ids_out,
                                r->scores_out, &r->hits, err, errlen);
    }
    if (!total) return 0;
    int rc = ensure_query_buffers(b, total, err, errlen);
    if (rc) return rc;
    rc = ensure_batch_buffers(b, total, err, errlen);
    if (rc) return rc;
    /* Queries -> f16, padded to whole uint4, then one copy (or kernel parameters): every scan block
     * reads all queries, so reading them from host memory would cross PCIe once per block. */
    {
        uint32_t f = 0;
        for (uint32_t i = 0; i < n; i++) {
            tr_search_request *r = &reqs[i];
            if (r->k < 1 || r->k > TR_BQ_MAX_K) continue;
            for (uint32_t q = 0; q < r->count; q++, f++)
                stage_query_f16(b, r->queries + (size_t)q * b->dim, b->hq16 + (size_t)f * b->nvec);
        }
    }
    if (b->poison) {
        memset(b->hres_ids, 0x7f, (size_t)total * b->max_k * sizeof(long long));
        memset(b->hres_s, 0x7f, (size_t)total * b->max_k * sizeof(float));
        memset(b->hres_hits, 0x7f, (size_t)total * sizeof(unsigned));
        for (uint32_t i = 0; i < n; i++) {
            tr_search_request *r = &reqs[i];
            if (r->k < 1 || r->k > TR_BQ_MAX_K) continue;
            memset(r->ids_out, 0x7f, (size_t)r->count * r->k * sizeof(int64_t));
            memset(r->scores_out, 0x7f, (size_t)r->count * r->k * sizeof(float));
        }
    }
    const bool all_inline = total * b->nvec <= TR_BQ_INLINE;
    if (!all_inline)
        CUDA_TRY(cudaMemcpyAsync(b->dq, b->hq16, (size_t)total * b->nvec * sizeof(uint4), cudaMemcpyHostToDevice,
                                 b->stream));
    BatchParams p;
    const unsigned grid = batch_params_init(b, p, (unsigned)b->grid_max);
    p.done = b->bdone;
    b->pending_copy = 0;
    uint32_t ri = 0, rq = 0; /* request and query cursor */
    for (uint32_t f0 = 0; f0 < total; f0 += TR_BQ_MAX) {
        p.nq = total - f0 < TR_BQ_MAX ? total - f0 : TR_BQ_MAX;
        p.any_filter = 0;
        for (uint32_t j = 0; j < p.nq; j++) {
            while (reqs[ri].k < 1 || reqs[ri].k > TR_BQ_MAX_K || rq >= reqs[ri].count) {
                ri++;
                rq = 0;
            }
            const tr_search_request *r = &reqs[ri];
            const uint32_t f = f0 + j;
            /* results in place when the slot lies in the registered segment */
            long long *oid = (long long *)seg_device_ptr(b, r->ids_out + (size_t)rq * r->k, (size_t)r->k * 8);
            float *osc = (float *)seg_device_ptr(b, r->scores_out + (size_t)rq * r->k, (size_t)r->k * 4);
            if (!oid || !osc) {
                oid = b->hres_ids_dev + (size_t)f * b->max_k;
                osc = b->hres_s_dev + (size_t)f * b->max_k;
                b->pending_copy = 1;
            }
            set_batch_query(p, j, r, oid, osc);
            rq++;
        }
        p.q = b->dq + (size_t)f0 * b->nvec;
        p.out_hits = b->hres_hits_dev + f0;
        const uint4 *qh = b->hq16 + (size_t)f0 * b->nvec;
        cudaError_t e;
        if (all_inline) e = p.nq <= 8 ? launch_batch<1, 1>(b, p, grid, qh) : launch_batch<2, 1>(b, p, grid, qh);
        else e = p.nq <= 8 ? launch_batch<1, 0>(b, p, grid, qh) : launch_batch<2, 0>(b, p, grid, qh);
        CUDA_TRY(e);
    }
    CUDA_TRY(cudaEventRecord(b->batch_done, b->stream));
    b->pending = 1;
    b->preqs = reqs;
    b->pn = n;
    return 0;
}

static int cuda_search_poll(void *self, int block, char *err, size_t errlen) {
    cuda_backend *b = (cuda_backend *)self;
    if (!b->pending) return 0;
    if (b->persist_pending) {
        int rc = persist_wait(b, b->pseq, block, err, errlen);
        if (rc == 1) return 1;
        b->pending = 0;
        b->persist_pending = 0;
        if (rc) return rc;
        for (uint32_t i = 0, f = 0; i < b->pn; i++) {
            tr_search_request *r = &b->preqs[i];
            for (uint32_t q = 0; q < r->count; q++, f++) r->hits = b->pmb->hits[f];
            r->status = 0;
        }
        return 0;
    }
    cudaError_t e = block ? cudaEventSynchronize(b->batch_done) : cudaEventQuery(b->batch_done);
    if (e == cudaErrorNotReady) return 1;
    b->pending = 0;
    CUDA_TRY(e);
    tr_search_request *reqs = b->preqs;
    uint32_t f = 0;
    for (uint32_t i = 0; i < b->pn; i++) {
        tr_search_request *r = &reqs[i];
        if (r->k < 1 || r->k > TR_BQ_MAX_K) continue; /* answered at submit (per-query kernel) */
        for (uint32_t q = 0; q < r->count; q++, f++) {
            if (b->pending_copy &&
                !(seg_device_ptr(b, r->ids_out + (size_t)q * r->k, (size_t)r->k * 8) &&
                  seg_device_ptr(b, r->scores_out + (size_t)q * r->k, (size_t)r->k * 4))) {
                memcpy(r->ids_out + (size_t)q * r->k, b->hres_ids + (size_t)f * b->max_k, (size_t)r->k * sizeof(int64_t));
                memcpy(r->scores_out + (size_t)q * r->k, b->hres_s + (size_t)f * b->max_k, (size_t)r->k * sizeof(float));
            }
            r->hits = b->hres_hits[f];
        }
        r->status = 0;
    }
    return 0;
}

static int cuda_search_many(void *self, tr_search_request *reqs, uint32_t n, char *err, size_t errlen) {
    int rc = cuda_search_submit(self, reqs, n, err, errlen);
    if (rc) return rc;
    return cuda_search_poll(self, 1, err, errlen);
}

extern "C" const tr_backend_ops tr_cuda_backend = {
    "cuda",
    TR_BACKEND_CUDA,
    cuda_create,
    cuda_destroy,
    cuda_write_rows,
    cuda_move_row,
    cuda_set_row_count,
    cuda_search,
    cuda_search_many,
    cuda_search_submit,
    cuda_search_poll,
    cuda_idle,
};
