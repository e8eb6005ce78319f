/* The CUDA backend's int8 codes (--codes int8), host side: their device arrays, the codes and bounds staged with each
 * written row, and the searches that scan them (code_scan.cuh), with the f16 scan answering the queries whose
 * candidates overflowed.
 *
 * A batch goes to the codes when the tier has at least --codes-min-rows rows and every request has k <= 32
 * (TR_CODE_MAX_K); it is launched (one kernel a pass of up to 16 queries, fused with the merge for up to two), so the
 * persistent kernel is stopped first. After a batch with a query that fell back, the next batches take the f16 scan
 * at once: 16, doubling on each fallback in a row up to 1,024. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.cuh"
#include "codes.h"
#include "tiered_recall/layout.h"

static_assert(sizeof(float2) == TR_CODES_ROW_META_CUDA, "the per-row code metadata (cmeta) is what layout.h counts");

/* --codes-min-rows's default on the GPU: below about this many rows the persistent kernel's f16 scan answers sooner
 * (H100, 768 d, batch 1: codes 63 us against 67 at 100k rows, 302 against 537 at 1M; a line through the two puts
 * the crossing near 90k) */
#define TR_CUDA_CODES_MIN_ROWS 100000ull
#define TR_CUDA_CODES_BACKOFF_MIN 16u
#define TR_CUDA_CODES_BACKOFF_MAX 1024u

/* The dynamic shared memory of a codes kernel with nt query tiles: the scan's (staged queries and the candidate
 * lists) or, in the fused kernel's last block and code_merge_kernel, the merge's, whichever is larger. */
static size_t code_smem(const cuda_backend *b, int nt) {
    const size_t qstride = 2 * (size_t)b->cvec + 1;
    const size_t scan = (size_t)nt * 8 * qstride * 16 + (size_t)nt * 8 * TR_CODE_CB * 12;
    const size_t merge = code_merge_smem(b->nvec);
    return scan > merge ? scan : merge;
}

int codes_setup(cuda_backend *b, const tr_backend_config *cfg, char *err, size_t errlen) {
    if (cfg->codes != TR_CODES_INT8) return 0;
    b->cvec = (cfg->dim + 63) / 64 * 4;
    b->csmem1 = code_smem(b, 1);
    b->csmem2 = code_smem(b, 2);
    if (!b->mma_ok || b->csmem2 > b->smem_optin) {
        snprintf(err, errlen, "--codes int8 needs the batched f16 scan and %zu bytes of shared memory a block at "
                 "dim %u (this GPU: %zu): use --codes off", b->csmem2, cfg->dim, b->smem_optin);
        return TR_E_INTERNAL;
    }
    const size_t cap = cfg->capacity ? cfg->capacity : 1;
    if (cudaMalloc(&b->C, cap * b->cvec * sizeof(uint4)) != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, errlen, "cannot allocate the int8 codes of %llu rows x %u on the GPU (%.1f GiB beside the f16 "
                 "rows): lower --capacity or use --codes off", (unsigned long long)cap, cfg->dim,
                 cap * b->cvec * 16.0 / (1 << 30));
        return TR_E_INTERNAL;
    }
    CUDA_TRY(cudaMalloc(&b->cmeta, cap * sizeof(float2)));
    CUDA_TRY(cudaMalloc(&b->cflat, (size_t)TR_BQ_MAX * TR_CODE_FLAT * sizeof(float4)));
    CUDA_TRY(cudaMalloc(&b->cbest, (size_t)TR_BQ_MAX * TR_CUDA_MAX_GRID * sizeof(float)));
    CUDA_TRY(cudaMalloc(&b->cstate, sizeof(CodeState)));
    CUDA_TRY(cudaMemset(b->cstate, 0, sizeof(CodeState)));
    CUDA_TRY(tr_code_kernels_allow_smem((int)b->csmem1, (int)b->csmem2));
    b->codes_on = 1;
    b->codes_min_rows = cfg->codes_min_rows == UINT64_MAX ? TR_CUDA_CODES_MIN_ROWS : cfg->codes_min_rows;
    b->code_next_backoff = TR_CUDA_CODES_BACKOFF_MIN;
    b->code_scans = cfg->code_scans;
    b->code_fallbacks = cfg->code_fallbacks;
    if (b->verbose)
        fprintf(stderr, "tr-sidecar: cuda: int8 codes on (tiers of %llu rows or more, k <= %d; %zu and %zu bytes of "
                "shared memory a block)\n", (unsigned long long)b->codes_min_rows, TR_CODE_MAX_K, b->csmem1, b->csmem2);
    return 0;
}

void codes_free(cuda_backend *b) {
    cudaFree(b->C);
    cudaFree(b->cmeta);
    cudaFree(b->cflat);
    cudaFree(b->cbest);
    cudaFree(b->cstate);
}

size_t codes_stage_bytes(const cuda_backend *b) {
    return b->codes_on ? (size_t)b->cvec * 16 + sizeof(float2) : 0;
}

/* One row's codes (from its f16 values h, as stored) and meta, into the staging buffer. */
void codes_stage_row(const cuda_backend *b, const uint16_t *h, uint4 *codes, float2 *meta) {
    float x[TR_MAX_DIM];
    f16_to_f32(h, x, b->dim);
    uint8_t *c = reinterpret_cast<uint8_t *>(codes);
    tr_code_row row;
    tr_codes_encode_row(x, b->dim, c, &row);
    memset(c + b->dim, (int)TR_CODES_ZERO, (size_t)b->cvec * 16 - b->dim);
    *meta = make_float2(row.scale, row.bound_r);
}

/* The batch goes to the codes (and then counts against the backoff when it does not). */
bool codes_take(cuda_backend *b, const tr_search_request *reqs, uint32_t n) {
    if (!b->codes_on || b->rows < b->codes_min_rows) return false;
    uint32_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (reqs[i].k < 1 || reqs[i].k > TR_CODE_MAX_K) return false;
        total += reqs[i].count;
    }
    if (total == 0) return false;
    if (b->code_backoff) {
        b->code_backoff--;
        return false;
    }
    return true;
}

/* |q16| (1 + 2^-18), rounded up: the factor of a row's bound_r (codes.h). */
static float query_bound(const cuda_backend *b, const uint4 *q16) {
    float q[TR_MAX_DIM];
    f16_to_f32(reinterpret_cast<const uint16_t *>(q16), q, b->dim);
    double s = 0.0;
    for (uint32_t j = 0; j < b->dim; j++) s += (double)q[j] * q[j];
    const float qn = tr_codes_round_up(sqrt(s) * (1.0 + 1e-9));
    return tr_codes_round_up((double)qn * (1.0 + 1.0 / 262144.0));
}

int codes_submit(cuda_backend *b, tr_search_request *reqs, uint32_t n, char *err, size_t errlen) {
    int rc = persist_stop(b, "codes", err, errlen); /* the codes' kernels run on its stream */
    if (rc) return rc;
    uint32_t total = 0;
    for (uint32_t i = 0; i < n; i++) total += reqs[i].count;
    rc = ensure_query_buffers(b, total, err, errlen);
    if (!rc) rc = ensure_batch_buffers(b, total, err, errlen);
    if (rc) return rc;
    stage_batched_queries(b, reqs, n, total);
    /* one query (or two, of few dimensions) rides in the kernel's parameters: no copy before the launch */
    const bool inline_q = total * b->nvec <= TR_BQ_INLINE && total <= TR_BQ_FUSE_MAX;
    if (!inline_q)
        CUDA_TRY(cudaMemcpyAsync(b->dq, b->hq16, (size_t)total * b->nvec * sizeof(uint4), cudaMemcpyHostToDevice,
                                 b->stream));
    CodeParams p;
    memset(&p, 0, sizeof p);
    p.C = b->C;
    p.meta = b->cmeta;
    p.X = b->X;
    p.ids = b->ids;
    p.ns = b->ns;
    p.flat = b->cflat;
    p.best = b->cbest;
    p.state = b->cstate;
    p.rows = b->rows;
    uint64_t rpb = (b->rows + b->grid_max - 1) / b->grid_max;
    if (rpb < TR_BQ_ROUND) rpb = TR_BQ_ROUND;
    p.rows_per_block = rpb;
    const unsigned grid = (unsigned)((b->rows + rpb - 1) / rpb);
    p.nvec = b->nvec;
    p.nchunk16 = (b->nvec + 3) / 4;
    p.cvec = b->cvec;
    p.cchunk = b->cvec / 4;
    p.qstride = 2 * b->cvec + 1;
    b->pending_copy = 0;
    uint32_t ri = 0, rq = 0;
    for (uint32_t f0 = 0; f0 < total; f0 += TR_BQ_MAX) {
        p.nq = total - f0 < TR_BQ_MAX ? total - f0 : TR_BQ_MAX;
        p.any_filter = 0;
        p.backward = b->passes++ & 1u;
        for (uint32_t j = 0; j < p.nq; j++) {
            while (rq >= reqs[ri].count) {
                ri++;
                rq = 0;
            }
            const tr_search_request *r = &reqs[ri];
            const uint32_t f = f0 + j;
            long long *oid = (long long *)seg_device_ptr(b, r->ids_out + (size_t)rq * r->k, (size_t)r->k * 8);
            float *osc = (float *)seg_device_ptr(b, r->scores_out + (size_t)rq * r->k, (size_t)r->k * 4);
            if (!oid || !osc) {
                oid = b->hres_ids_dev + (size_t)f * b->max_k;
                osc = b->hres_s_dev + (size_t)f * b->max_k;
                b->pending_copy = 1;
            }
            CodeQuery &cq = p.cq[j];
            cq.ns_hash = r->ns_hash;
            cq.oid = oid;
            cq.osc = osc;
            cq.k = r->k;
            cq.filter = r->filter_ns ? 1 : 0;
            cq.qbound = query_bound(b, b->hq16 + (size_t)f * b->nvec);
            p.any_filter |= (unsigned)cq.filter;
            rq++;
        }
        p.q = b->dq + (size_t)f0 * b->nvec;
        p.out_hits = b->hres_hits_dev + f0;
        const bool fused = p.nq <= TR_BQ_FUSE_MAX;
        CUDA_TRY(tr_launch_codes(p, grid, p.nq <= 8 ? b->csmem1 : b->csmem2, fused,
                                 inline_q ? b->hq16 + (size_t)f0 * b->nvec : nullptr, b->stream));
    }
    CUDA_TRY(cudaEventRecord(b->batch_done, b->stream));
    b->pending = 1;
    b->code_pending = 1;
    b->preqs = reqs;
    b->pn = n;
    return 0;
}

/* After a codes batch is done: counts its queries, and answers those whose candidates overflowed (out_hits
 * TR_CODE_FAIL) by launching the whole batch again on the f16 scan, waited for here (its queries are still staged:
 * nothing else was submitted since). */
int codes_finish(cuda_backend *b, char *err, size_t errlen) {
    uint32_t total = 0, failed = 0;
    for (uint32_t i = 0; i < b->pn; i++) total += b->preqs[i].count;
    for (uint32_t f = 0; f < total; f++) failed += b->hres_hits[f] == TR_CODE_FAIL;
    *b->code_scans += total;
    if (!failed) {
        b->code_next_backoff = TR_CUDA_CODES_BACKOFF_MIN;
        return 0;
    }
    *b->code_fallbacks += failed;
    b->code_backoff = b->code_next_backoff;
    b->code_next_backoff = b->code_next_backoff * 2 > TR_CUDA_CODES_BACKOFF_MAX ? TR_CUDA_CODES_BACKOFF_MAX
                                                                                  : b->code_next_backoff * 2;
    if (b->verbose)
        fprintf(stderr, "tr-sidecar: cuda: %u of %u queries had too many candidates for the int8 codes: the f16 scan "
                "answers them, and the next %u batches\n", failed, total, b->code_backoff);
    int rc = launch_batched_passes(b, b->preqs, total, err, errlen);
    if (rc) return rc;
    CUDA_TRY(cudaEventSynchronize(b->batch_done));
    return 0;
}
