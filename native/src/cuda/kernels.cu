/* The CUDA backend's device code as one translation unit: every kernel family and the launches the host files use.
 *
 * The families (one header each): the per-query scan (query_scan.cuh), row writes (row_kernels.cuh), the batched
 * tensor-core scan (batch_scan.cuh) with its selections (select.cuh) and merge (merge.cuh), and the persistent
 * kernel (persist_kernel.cuh); params.cuh holds what host and device share, device.cuh the common device helpers.
 * Order of every answer: best first, equal scores by smaller id (the CPU backend's order, backend_cpu.c).
 * Compile report: nvcc -Xptxas=-v (CMakeLists.txt adds it); the kernels must show 0 spill bytes.
 * native/tools/compare_sass.sh compares every kernel's SASS between two builds.
 */
#include <string.h>

#include "launch.h"
#include "code_scan.cuh"
#include "persist_kernel.cuh"
#include "query_scan.cuh"
#include "row_kernels.cuh"

template <typename T>
static cudaError_t launch_search(const SearchParams &p, unsigned grid, size_t smem, const float *q_inline,
                                 unsigned dim, cudaStream_t stream) {
    if (q_inline) {
        QueryInline<TR_CUDA_INLINE_DIM> qin;
        memcpy(qin.q, q_inline, (size_t)dim * sizeof(float));
        search_kernel<T, TR_CUDA_INLINE_DIM><<<grid, TR_CUDA_BLOCK, smem, stream>>>(p, qin);
    } else {
        QueryInline<1> qin;
        qin.q[0] = 0.f;
        search_kernel<T, 1><<<grid, TR_CUDA_BLOCK, smem, stream>>>(p, qin);
    }
    return cudaGetLastError();
}

cudaError_t tr_launch_search(bool f16, const SearchParams &p, unsigned grid, size_t smem, const float *q_inline,
                             unsigned dim, cudaStream_t stream) {
    return f16 ? launch_search<__half>(p, grid, smem, q_inline, dim, stream)
               : launch_search<float>(p, grid, smem, q_inline, dim, stream);
}

template <int NT, int INL>
static cudaError_t launch_batch(const BatchParams &p, unsigned grid, size_t smem, const uint4 *q_inline, bool fused,
                                cudaStream_t stream) {
    BatchInline<INL ? TR_BQ_INLINE : 1> qin;
    if (INL) memcpy(qin.v, q_inline, (size_t)p.nq * p.nvec * sizeof(uint4));
    else memset(&qin, 0, sizeof qin);
    if (fused) { /* one launch: the last scan block merges */
        batch_scan_kernel<NT, INL, 1><<<grid, TR_CUDA_BLOCK, smem, stream>>>(p, qin);
        return cudaGetLastError();
    }
    batch_scan_kernel<NT, INL, 0><<<grid, TR_CUDA_BLOCK, smem, stream>>>(p, qin);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    batch_merge_kernel<<<p.nq, TR_CUDA_BLOCK, 0, stream>>>(p, grid);
    return cudaGetLastError();
}

cudaError_t tr_launch_batch(const BatchParams &p, unsigned grid, size_t smem, const uint4 *q_inline, bool fused,
                            cudaStream_t stream) {
    if (q_inline)
        return p.nq <= 8 ? launch_batch<1, 1>(p, grid, smem, q_inline, fused, stream)
                         : launch_batch<2, 1>(p, grid, smem, q_inline, fused, stream);
    return p.nq <= 8 ? launch_batch<1, 0>(p, grid, smem, q_inline, fused, stream)
                     : launch_batch<2, 0>(p, grid, smem, q_inline, fused, stream);
}

cudaError_t tr_batch_kernels_allow_smem(int smem1, int smem2) {
    const void *one[] = {(const void *)batch_scan_kernel<1, 0, 0>, (const void *)batch_scan_kernel<1, 1, 0>,
                         (const void *)batch_scan_kernel<1, 0, 1>, (const void *)batch_scan_kernel<1, 1, 1>};
    const void *two[] = {(const void *)batch_scan_kernel<2, 0, 0>, (const void *)batch_scan_kernel<2, 1, 0>,
                         (const void *)batch_scan_kernel<2, 0, 1>, (const void *)batch_scan_kernel<2, 1, 1>};
    for (int i = 0; i < 4; i++) {
        cudaError_t e = cudaFuncSetAttribute(one[i], cudaFuncAttributeMaxDynamicSharedMemorySize, smem1);
        if (e == cudaSuccess) e = cudaFuncSetAttribute(two[i], cudaFuncAttributeMaxDynamicSharedMemorySize, smem2);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

cudaError_t tr_launch_codes(const CodeParams &p, unsigned grid, size_t smem, bool fused, const uint4 *q_inline,
                            cudaStream_t stream) {
    const bool two = p.nq > 8;
    BatchInline<1> none;
    memset(&none, 0, sizeof none);
    if (q_inline) { /* one query tile, fused (tr_launch_codes' contract) */
        BatchInline<TR_BQ_INLINE> qin;
        memcpy(qin.v, q_inline, (size_t)p.nq * p.nvec * sizeof(uint4));
        code_scan_kernel<1, 1, 1><<<grid, TR_CUDA_BLOCK, smem, stream>>>(p, qin);
        return cudaGetLastError();
    }
    if (fused) {
        if (two) code_scan_kernel<2, 1, 0><<<grid, TR_CUDA_BLOCK, smem, stream>>>(p, none);
        else code_scan_kernel<1, 1, 0><<<grid, TR_CUDA_BLOCK, smem, stream>>>(p, none);
        return cudaGetLastError();
    }
    if (two) code_scan_kernel<2, 0, 0><<<grid, TR_CUDA_BLOCK, smem, stream>>>(p, none);
    else code_scan_kernel<1, 0, 0><<<grid, TR_CUDA_BLOCK, smem, stream>>>(p, none);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    code_merge_kernel<<<p.nq, TR_CUDA_BLOCK, code_merge_smem(p.nvec), stream>>>(p, grid);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    return cudaMemsetAsync(p.state, 0, sizeof(CodeState), stream);
}

cudaError_t tr_code_kernels_allow_smem(int smem1, int smem2) {
    const void *one[] = {(const void *)code_scan_kernel<1, 0, 0>, (const void *)code_scan_kernel<1, 1, 0>,
                         (const void *)code_scan_kernel<1, 1, 1>};
    const void *two[] = {(const void *)code_scan_kernel<2, 0, 0>, (const void *)code_scan_kernel<2, 1, 0>};
    for (int i = 0; i < 3; i++) {
        cudaError_t e = cudaFuncSetAttribute(one[i], cudaFuncAttributeMaxDynamicSharedMemorySize, smem1);
        if (e == cudaSuccess && i < 2)
            e = cudaFuncSetAttribute(two[i], cudaFuncAttributeMaxDynamicSharedMemorySize, smem2);
        if (e != cudaSuccess) return e;
    }
    return cudaFuncSetAttribute((const void *)code_merge_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                smem1 > smem2 ? smem1 : smem2);
}

cudaError_t tr_launch_scatter_rows(const RowArrays &a, const StagedRows &s, unsigned n, cudaStream_t stream) {
    const unsigned grid = n < 1024 ? n : 1024;
    scatter_rows<<<grid, 128, 0, stream>>>(a, s, n);
    return cudaGetLastError();
}

cudaError_t tr_launch_move_row(const RowArrays &a, uint64_t dst, uint64_t src, cudaStream_t stream) {
    move_row_kernel<<<1, 128, 0, stream>>>(a, dst, src);
    return cudaGetLastError();
}

const void *tr_persist_kernel(int build) {
    switch (build) {
    case TR_PERSIST_ROUNDS: return (const void *)persist_kernel<false, false>;
    case TR_PERSIST_ONE_TRIP: return (const void *)persist_kernel<true, false>;
    case TR_PERSIST_SPLIT: return (const void *)persist_kernel<true, true>;
    }
    return nullptr;
}
