/* The per-query scan (any dtype, any k): search_kernel scores its rows one query at a time, the last block merges. */
#ifndef TR_CUDA_QUERY_SCAN_CUH
#define TR_CUDA_QUERY_SCAN_CUH

#include "device.cuh"

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

#endif
