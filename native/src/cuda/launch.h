/* The device side as the host files see it: kernel launches and attributes, defined in kernels.cu. */
#ifndef TR_CUDA_LAUNCH_H
#define TR_CUDA_LAUNCH_H

#include "params.cuh"

/* The per-query scan of one query (p.qptr, or q_inline: dim floats that ride in the kernel parameters when the
 * query has at most TR_CUDA_INLINE_DIM; NULL: read through p.qptr). smem: ld floats. */
cudaError_t tr_launch_search(bool f16, const SearchParams &p, unsigned grid, size_t smem, const float *q_inline,
                             unsigned dim, cudaStream_t stream);

/* One batched pass of p.nq <= TR_BQ_MAX queries (one query tile up to 8, two above): q_inline holds them when they
 * fit the kernel parameters (p.nq x p.nvec <= TR_BQ_INLINE uint4), else NULL (read from p.q). fused: the scan's
 * last block merges (one launch); otherwise batch_merge_kernel merges, one block per query. smem: batch_smem. */
cudaError_t tr_launch_batch(const BatchParams &p, unsigned grid, size_t smem, const uint4 *q_inline, bool fused,
                            cudaStream_t stream);
/* Allows the batched scan kernels the dynamic shared memory of one (smem1) and two (smem2) query tiles. */
cudaError_t tr_batch_kernels_allow_smem(int smem1, int smem2);

/* One pass of p.nq <= TR_BQ_MAX queries over the int8 codes (code_scan.cuh): one query tile up to 8, two above.
 * fused: the scan's last block merges (one launch); otherwise code_merge_kernel merges, one block per query, and the
 * pass's state is zeroed after it. smem: the scan's and the merge's dynamic shared memory (the larger). q_inline:
 * the pass's queries, when p.nq x p.nvec <= TR_BQ_INLINE uint4 and p.nq <= 8 and fused, to ride in the parameters
 * (else NULL: read from p.q). */
cudaError_t tr_launch_codes(const CodeParams &p, unsigned grid, size_t smem, bool fused, const uint4 *q_inline,
                            cudaStream_t stream);
/* Allows the codes' kernels the dynamic shared memory of one (smem1) and two (smem2) query tiles. */
cudaError_t tr_code_kernels_allow_smem(int smem1, int smem2);

/* Where a batch of staged rows is (device pointers into the pinned staging buffer): n x nvec uint4 vectors, their
 * ids, namespaces and row numbers, and with codes n x cvec uint4 codes and n meta (else null). */
struct StagedRows {
    const uint4 *vec;
    const int64_t *ids;
    const uint64_t *ns;
    const uint64_t *rows;
    const uint4 *codes;
    const float2 *meta;
};
/* The rows' device arrays a write changes: vectors, ids, namespaces, and the codes and their meta (null: none). */
struct RowArrays {
    uint4 *X;
    int64_t *ids;
    uint64_t *ns;
    uint4 *C;
    float2 *meta;
    unsigned nvec, cvec;
};
/* Writes n staged rows into their slots. */
cudaError_t tr_launch_scatter_rows(const RowArrays &a, const StagedRows &s, unsigned n, cudaStream_t stream);
/* Copies row src (vector, id, namespace, codes) over row dst. */
cudaError_t tr_launch_move_row(const RowArrays &a, uint64_t dst, uint64_t src, cudaStream_t stream);

/* The persistent kernel's three builds (persist_kernel.cuh), for cudaLaunchCooperativeKernel and attributes. */
enum tr_persist_build {
    TR_PERSIST_ROUNDS,   /* tiers past the one-trip limit: the word-then-batch hand-over, the merge in rounds */
    TR_PERSIST_ONE_TRIP, /* the tagged message and the one-trip merge */
    TR_PERSIST_SPLIT,    /* ... and the split scan over the row cache */
    TR_PERSIST_BUILDS
};
const void *tr_persist_kernel(int build);

#endif
