/* Top-k selection and ranking inside a warp or a block: what the batched scan and the merges keep of their lists. */
#ifndef TR_CUDA_SELECT_CUH
#define TR_CUDA_SELECT_CUH

#include "device.cuh"

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
 * counts by shuffles: shorter than one warp's ranking (each lane's loop of n dependent steps, or shuffles across the
 * warp) for a scan block's list. Every thread of the block must call it. */
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
 * to sort for and nothing to compact, which warp_select_block's path would spend most of the lists phase on.
 * Returns min(n, k), what the list holds. */
__device__ unsigned warp_rank_to_list(const float *s, const long long *id, unsigned n, unsigned k, float *out_s,
                                      long long *out_id) {
    warp_rank_pair(s, id, n).place(out_s, out_id, k);
    return n < k ? n : k;
}
#endif
