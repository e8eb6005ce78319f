/* Row writes: the kernels that scatter staged rows into their slots and move one row over another. */
#ifndef TR_CUDA_ROW_KERNELS_CUH
#define TR_CUDA_ROW_KERNELS_CUH

#include "launch.h"

/* Writes n staged rows (already in the device dtype, padded to ld; with codes, their codes and meta) into their
 * row slots. */
__global__ void scatter_rows(const RowArrays a, const StagedRows s, unsigned n) {
    for (unsigned i = blockIdx.x; i < n; i += gridDim.x) {
        const uint64_t r = s.rows[i];
        for (unsigned c = threadIdx.x; c < a.nvec; c += blockDim.x) a.X[r * a.nvec + c] = s.vec[(size_t)i * a.nvec + c];
        if (a.C)
            for (unsigned c = threadIdx.x; c < a.cvec; c += blockDim.x)
                a.C[r * a.cvec + c] = s.codes[(size_t)i * a.cvec + c];
        if (threadIdx.x == 0) {
            a.ids[r] = s.ids[i];
            a.ns[r] = s.ns[i];
            if (a.C) a.meta[r] = s.meta[i];
        }
    }
}

__global__ void move_row_kernel(const RowArrays a, uint64_t dst, uint64_t src) {
    for (unsigned c = threadIdx.x; c < a.nvec; c += blockDim.x) a.X[dst * a.nvec + c] = a.X[src * a.nvec + c];
    if (a.C)
        for (unsigned c = threadIdx.x; c < a.cvec; c += blockDim.x) a.C[dst * a.cvec + c] = a.C[src * a.cvec + c];
    if (threadIdx.x == 0) {
        a.ids[dst] = a.ids[src];
        a.ns[dst] = a.ns[src];
        if (a.C) a.meta[dst] = a.meta[src];
    }
}
#endif
