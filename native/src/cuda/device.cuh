/* Device helpers every kernel family uses: ordering, the per-query candidate buffer, dot products, timers, shuffles. */
#ifndef TR_CUDA_DEVICE_CUH
#define TR_CUDA_DEVICE_CUH

#include <cuda_fp16.h>
#include <limits.h>
#include <math.h>

#include "params.cuh"

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

#endif
