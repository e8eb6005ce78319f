/* The batched tensor-core scan of f16 rows: batch_scan_block, batch_scan_kernel and the split build's row cache.
 *
 * batch_scan_block is one block's share of a pass, shared by the launched batch_scan_kernel and the persistent
 * kernel. */
#ifndef TR_CUDA_BATCH_SCAN_CUH
#define TR_CUDA_BATCH_SCAN_CUH

#include <cuda_pipeline.h> /* row_cache_fill */

#include "merge.cuh"

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

__device__ __forceinline__ void mma16816(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

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
 * From the cache, the first round of a small tier's scan takes about two thirds of its time from global memory. */
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
 * 2 x TR_BQ_STAGE-chunk waves, one memory trip each, so even a block of 16 rows pays several trips, whatever the
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
     * fewer on the latency path */
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
     * registers spilled there. */
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

#endif
