/* Row writes: the kernels that scatter staged rows into their slots and move one row over another. */
#ifndef TR_CUDA_ROW_KERNELS_CUH
#define TR_CUDA_ROW_KERNELS_CUH

#include "params.cuh"

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
#endif
