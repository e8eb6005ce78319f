/* The merge of a batched pass: each query's per-block lists into its final top-k (merge_query, batch_merge_kernel).
 *
 * merge_query runs in the scan's last block, in the persistent kernel, or in batch_merge_kernel (one block per
 * query). */
#ifndef TR_CUDA_MERGE_CUH
#define TR_CUDA_MERGE_CUH

#include "select.cuh"

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
                            unsigned &mcnt, float &mthr, float *wmax, unsigned long long *stamp = nullptr) {
    const unsigned tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const unsigned k = p.bq[qi].k;
    const unsigned *pn = p.part_n + (size_t)qi * G;
    const float *ps = p.part_s + (size_t)qi * G * TR_BQ_MAX_K;
    const long long *pid = p.part_id + (size_t)qi * G * TR_BQ_MAX_K;
    const unsigned total = G * k;
    bool merged = false; /* the one-trip path below has the candidates in ms/mid */
    if (ONE_TRIP && total <= TR_MERGE_SLOTS * TR_CUDA_BLOCK && k <= 32 && G <= TR_MERGE_BOUND_GROUPS * TR_CUDA_BLOCK) {
        /* One trip to L2: every thread loads its slots (scores and ids) and its warp's share of the bound's
         * entries at once, and filters after the bound is known (the bounds first and then the slots in
         * rounds of 2,048 would be four dependent trips at a few hundred lists). Each
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
#endif
