/* The CUDA backend's search dispatch: launched searches (per query, batched passes) and the asynchronous submit/poll.
 *
 * One query at a time: search_kernel (any dtype, any k). Batched passes: batch_scan_kernel (f16 rows,
 * k <= TR_BQ_MAX_K, up to TR_BQ_MAX queries a pass). Submit hands a batch to the persistent kernel (persist.cu) when
 * it can take it.
 *
 * Per-query path (the host thread drives it): the query travels inside the kernel's parameters when
 * dim <= TR_CUDA_INLINE_DIM (no copy at all); larger dims or several queries go through one pinned host buffer that
 * the kernel reads through its mapped device pointer. The last block writes ids, scores and the hit count straight
 * into pinned, mapped host memory; the host synchronises once (spin) and copies k results out.
 * Batched path: queries are converted to f16 on the host and copied once (or ride in the kernel parameters); the
 * results go straight into the requests' slots when the segment is registered, else into the pinned buffer, copied
 * out at poll.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.cuh"

int ensure_query_buffers(cuda_backend *b, uint32_t nq, char *err, size_t errlen) {
    if (nq > b->hq_cap) {
        if (b->hq) cudaFreeHost(b->hq);
        b->hq = NULL;
        b->hq_cap = 0;
        CUDA_TRY(cudaHostAlloc((void **)&b->hq, (size_t)nq * b->ld * sizeof(float) + 16,
                               cudaHostAllocMapped | cudaHostAllocPortable));
        CUDA_TRY(cudaHostGetDevicePointer((void **)&b->hq_dev, b->hq, 0));
        b->hq_cap = nq;
    }
    if (nq > b->hres_cap) {
        if (b->hres_ids) cudaFreeHost(b->hres_ids);
        if (b->hres_s) cudaFreeHost(b->hres_s);
        if (b->hres_hits) cudaFreeHost(b->hres_hits);
        b->hres_ids = NULL; b->hres_s = NULL; b->hres_hits = NULL;
        b->hres_cap = 0;
        uint32_t cap = nq < 16 ? 16 : nq;
        CUDA_TRY(cudaHostAlloc((void **)&b->hres_ids, (size_t)cap * b->max_k * sizeof(long long),
                               cudaHostAllocMapped | cudaHostAllocPortable));
        CUDA_TRY(cudaHostAlloc((void **)&b->hres_s, (size_t)cap * b->max_k * sizeof(float),
                               cudaHostAllocMapped | cudaHostAllocPortable));
        CUDA_TRY(cudaHostAlloc((void **)&b->hres_hits, (size_t)cap * sizeof(unsigned),
                               cudaHostAllocMapped | cudaHostAllocPortable));
        CUDA_TRY(cudaHostGetDevicePointer((void **)&b->hres_ids_dev, b->hres_ids, 0));
        CUDA_TRY(cudaHostGetDevicePointer((void **)&b->hres_s_dev, b->hres_s, 0));
        CUDA_TRY(cudaHostGetDevicePointer((void **)&b->hres_hits_dev, b->hres_hits, 0));
        b->hres_cap = cap;
    }
    return 0;
}

/* The per-query scan's parameters for k results (per query: qptr and the outputs are set by the caller). */
static SearchParams search_params(const cuda_backend *b, unsigned grid, uint32_t k, int filter_ns, uint64_t ns_hash) {
    SearchParams p;
    memset(&p, 0, sizeof p);
    p.X = b->X;
    p.ids = b->ids;
    p.ns = b->ns;
    p.part_s = b->part_s;
    p.part_id = b->part_id;
    p.part_n = b->part_n;
    p.done = b->done;
    p.rows = b->rows;
    p.rows_per_block = (b->rows + grid - 1) / grid;
    p.ns_hash = ns_hash;
    p.nvec = b->nvec;
    p.ld = b->ld;
    p.dim = b->dim;
    p.k = k;
    p.filter = filter_ns ? 1 : 0;
    return p;
}

int cuda_search(void *self, const float *queries, uint32_t nq, uint32_t k, int filter_ns, uint64_t ns_hash,
                int64_t *ids_out, float *scores_out, uint32_t *hits, char *err, size_t errlen) {
    cuda_backend *b = (cuda_backend *)self;
    *hits = 0;
    if (k < 1 || k > b->max_k) {
        snprintf(err, errlen, "k=%u is out of range: use 1 <= k <= %u", k, b->max_k);
        return TR_E_BAD_K;
    }
    if (b->rows == 0 || nq == 0) {
        for (size_t i = 0; i < (size_t)nq * k; i++) {
            ids_out[i] = -1;
            scores_out[i] = -INFINITY;
        }
        return 0;
    }
    int rc = persist_stop(b, "launch", err, errlen); /* this search is launched on the kernel's stream */
    if (rc) return rc;
    rc = ensure_query_buffers(b, nq, err, errlen);
    if (rc) return rc;
    const bool inline_q = b->dim <= TR_CUDA_INLINE_DIM && nq == 1;
    if (!inline_q) {
        for (uint32_t q = 0; q < nq; q++) {
            float *dst = b->hq + (size_t)q * b->ld;
            memcpy(dst, queries + (size_t)q * b->dim, (size_t)b->dim * sizeof(float));
            for (uint32_t j = b->dim; j < b->ld; j++) dst[j] = 0.f;
        }
    }
    if (b->poison) { /* tests: a result the kernel failed to write must not look valid */
        memset(b->hres_ids, 0x7f, (size_t)nq * k * sizeof(long long));
        memset(b->hres_s, 0x7f, (size_t)nq * k * sizeof(float));
        memset(b->hres_hits, 0x7f, (size_t)nq * sizeof(unsigned));
    }
    uint64_t blocks = (b->rows + TR_CUDA_MIN_ROWS_PER_BLOCK - 1) / TR_CUDA_MIN_ROWS_PER_BLOCK;
    unsigned grid = blocks < (uint64_t)b->grid_max ? (unsigned)blocks : (unsigned)b->grid_max;
    SearchParams p = search_params(b, grid, k, filter_ns, ns_hash);
    for (uint32_t q = 0; q < nq; q++) {
        p.qptr = b->hq_dev + (size_t)q * b->ld;
        p.out_ids = b->hres_ids_dev + (size_t)q * k;
        p.out_s = b->hres_s_dev + (size_t)q * k;
        p.out_hits = b->hres_hits_dev + q;
        CUDA_TRY(tr_launch_search(b->dtype == TR_DTYPE_F16, p, grid, (size_t)b->ld * sizeof(float),
                                  inline_q ? queries : NULL, b->dim, b->stream));
    }
    CUDA_TRY(cudaStreamSynchronize(b->stream));
    for (uint32_t q = 0; q < nq; q++) {
        memcpy(ids_out + (size_t)q * k, b->hres_ids + (size_t)q * k, (size_t)k * sizeof(int64_t));
        memcpy(scores_out + (size_t)q * k, b->hres_s + (size_t)q * k, (size_t)k * sizeof(float));
    }
    *hits = b->hres_hits[nq - 1];
    return 0;
}

size_t batch_smem(const cuda_backend *b, int nt) {
    const size_t nchunk = (b->nvec + 3) / 4, qstride = nchunk * 4 + 1;
    const size_t scan = (size_t)nt * 8 * qstride * 16 + (size_t)nt * 8 * TR_BQ_CB * (sizeof(long long) + sizeof(float));
    const size_t merge = (size_t)TR_BQ_MCB * (sizeof(long long) + sizeof(float)); /* fused merge aliases it */
    return scan > merge ? scan : merge;
}

int ensure_batch_buffers(cuda_backend *b, uint32_t nq, char *err, size_t errlen) {
    if (nq <= b->bq_cap) return 0;
    CUDA_TRY(cudaStreamSynchronize(b->stream));
    if (b->hq16) cudaFreeHost(b->hq16);
    if (b->dq) cudaFree(b->dq);
    b->hq16 = NULL;
    b->dq = NULL;
    b->bq_cap = 0;
    const uint32_t cap = nq < 64 ? 64 : nq;
    CUDA_TRY(cudaHostAlloc((void **)&b->hq16, (size_t)cap * b->nvec * sizeof(uint4), cudaHostAllocPortable));
    CUDA_TRY(cudaMalloc((void **)&b->dq, (size_t)cap * b->nvec * sizeof(uint4)));
    b->bq_cap = cap;
    return 0;
}

/* Device pointer for host memory inside the registered segment, or NULL. */
void *seg_device_ptr(const cuda_backend *b, const void *host, size_t bytes) {
    if (!b->seg_registered) return NULL;
    const unsigned char *h = (const unsigned char *)host;
    if (h < b->seg_host || h + bytes > b->seg_host + b->seg_bytes) return NULL;
    return b->seg_dev + (h - b->seg_host);
}

/* One query -> f16 row of the batched scan, zero-padded to whole uint4. */
void stage_query_f16(const cuda_backend *b, const float *query, uint4 *dst) {
    uint16_t *h = (uint16_t *)dst;
    f32_to_f16(query, h, b->dim);
    for (uint32_t j = b->dim; j < b->ld; j++) h[j] = 0;
}

/* The store's part of a batched pass (launched or persistent): rows in runs of at least min_rpb rows (whole
 * rounds, except for the persistent kernel's split build) over at most max_blocks blocks, walked backward every
 * other pass (BatchParams::backward). Returns the number of runs, i.e. of scanning blocks and partial lists. */
unsigned batch_params_init(cuda_backend *b, BatchParams &p, unsigned max_blocks, uint64_t min_rpb) {
    memset(&p, 0, sizeof p);
    p.backward = b->passes++ & 1u;
    uint64_t rpb = (b->rows + max_blocks - 1) / max_blocks;
    if (rpb < min_rpb) rpb = min_rpb;
    p.X = b->X;
    p.ids = b->ids;
    p.ns = b->ns;
    p.part_s = b->bpart_s;
    p.part_id = b->bpart_id;
    p.part_n = b->bpart_n;
    p.rows = b->rows;
    p.rows_per_block = rpb;
    p.nvec = b->nvec;
    p.nchunk = (b->nvec + 3) / 4;
    p.qstride = p.nchunk * 4 + 1;
    return (unsigned)((b->rows + rpb - 1) / rpb);
}

/* Query j of a pass: request r's parameters, results to oid/osc (device pointers). */
void set_batch_query(BatchParams &p, uint32_t j, const tr_search_request *r, long long *oid, float *osc) {
    p.bq[j].k = r->k;
    p.bq[j].filter = r->filter_ns ? 1 : 0;
    p.bq[j].ns_hash = r->ns_hash;
    p.bq[j].oid = oid;
    p.bq[j].osc = osc;
    p.any_filter |= (unsigned)p.bq[j].filter;
}

static bool batched_k(uint32_t k) { return k >= 1 && k <= TR_BQ_MAX_K; }

/* The persistent kernel takes the whole batch when every request fits it: 0 or a negative tr_status when it took
 * it, 1 when the batch is to be launched. */
static int try_persist(cuda_backend *b, tr_search_request *reqs, uint32_t n, char *err, size_t errlen) {
    uint32_t q = 0, all_mma = 1;
    for (uint32_t i = 0; i < n; i++) {
        q += reqs[i].count;
        all_mma &= batched_k(reqs[i].k);
    }
    if (!all_mma || q > TR_BQ_MAX) return 1;
    return persist_submit(b, reqs, n, q, err, errlen);
}

/* Queries -> f16, padded to whole uint4, into the pinned buffer for one copy (or the kernel parameters): every scan
 * block reads all queries, so reading them from host memory would cross PCIe once per block. */
void stage_batched_queries(cuda_backend *b, tr_search_request *reqs, uint32_t n, uint32_t total) {
    for (uint32_t i = 0, f = 0; i < n; i++) {
        tr_search_request *r = &reqs[i];
        if (!batched_k(r->k)) continue;
        for (uint32_t q = 0; q < r->count; q++, f++)
            stage_query_f16(b, r->queries + (size_t)q * b->dim, b->hq16 + (size_t)f * b->nvec);
    }
    if (!b->poison) return;
    memset(b->hres_ids, 0x7f, (size_t)total * b->max_k * sizeof(long long));
    memset(b->hres_s, 0x7f, (size_t)total * b->max_k * sizeof(float));
    memset(b->hres_hits, 0x7f, (size_t)total * sizeof(unsigned));
    for (uint32_t i = 0; i < n; i++) {
        tr_search_request *r = &reqs[i];
        if (!batched_k(r->k)) continue;
        memset(r->ids_out, 0x7f, (size_t)r->count * r->k * sizeof(int64_t));
        memset(r->scores_out, 0x7f, (size_t)r->count * r->k * sizeof(float));
    }
}

/* Launches the batched passes over the staged queries, TR_BQ_MAX at a time. Results go in place when the slot lies
 * in the registered segment, else into the pinned buffer (pending_copy: poll copies them out). */
int launch_batched_passes(cuda_backend *b, tr_search_request *reqs, uint32_t total, char *err, size_t errlen) {
    const bool all_inline = total * b->nvec <= TR_BQ_INLINE;
    if (!all_inline)
        CUDA_TRY(cudaMemcpyAsync(b->dq, b->hq16, (size_t)total * b->nvec * sizeof(uint4), cudaMemcpyHostToDevice,
                                 b->stream));
    BatchParams p;
    const unsigned grid = batch_params_init(b, p, (unsigned)b->grid_max);
    p.done = b->bdone;
    b->pending_copy = 0;
    uint32_t ri = 0, rq = 0; /* request and query cursor */
    for (uint32_t f0 = 0; f0 < total; f0 += TR_BQ_MAX) {
        p.nq = total - f0 < TR_BQ_MAX ? total - f0 : TR_BQ_MAX;
        p.any_filter = 0;
        for (uint32_t j = 0; j < p.nq; j++) {
            while (!batched_k(reqs[ri].k) || rq >= reqs[ri].count) {
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
            set_batch_query(p, j, r, oid, osc);
            rq++;
        }
        p.q = b->dq + (size_t)f0 * b->nvec;
        p.out_hits = b->hres_hits_dev + f0;
        const uint4 *qh = all_inline ? b->hq16 + (size_t)f0 * b->nvec : NULL;
        CUDA_TRY(tr_launch_batch(p, grid, batch_smem(b, p.nq <= 8 ? 1 : 2), qh, p.nq <= TR_BQ_FUSE_MAX, b->stream));
    }
    CUDA_TRY(cudaEventRecord(b->batch_done, b->stream));
    return 0;
}

int cuda_search_submit(void *self, tr_search_request *reqs, uint32_t n, char *err, size_t errlen) {
    cuda_backend *b = (cuda_backend *)self;
    if (b->pending) { /* the server never does this; stay correct if a caller does */
        int rc = cuda_search_poll(self, 1, err, errlen);
        if (rc < 0) return rc;
    }
    const bool mma = b->mma_ok && b->rows > 0 && b->rows < (1ull << 40);
    if (mma && codes_take(b, reqs, n)) return codes_submit(b, reqs, n, err, errlen);
    if (b->persist_ok && mma) {
        int rc = try_persist(b, reqs, n, err, errlen);
        if (rc <= 0) return rc; /* 1: launch instead */
    }
    /* launched below, on the stream the persistent kernel holds (more than TR_BQ_MAX queries, k > TR_BQ_MAX_K, f32
     * rows, or results outside the registered segment) */
    int rc = persist_stop(b, "launch", err, errlen);
    if (rc) return rc;
    uint32_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        tr_search_request *r = &reqs[i];
        if (mma && batched_k(r->k)) {
            total += r->count;
            continue;
        }
        r->status = cuda_search(self, r->queries, r->count, r->k, r->filter_ns, r->ns_hash, r->ids_out,
                                r->scores_out, &r->hits, err, errlen);
    }
    if (!total) return 0;
    rc = ensure_query_buffers(b, total, err, errlen);
    if (rc) return rc;
    rc = ensure_batch_buffers(b, total, err, errlen);
    if (rc) return rc;
    stage_batched_queries(b, reqs, n, total);
    rc = launch_batched_passes(b, reqs, total, err, errlen);
    if (rc) return rc;
    b->pending = 1;
    b->preqs = reqs;
    b->pn = n;
    return 0;
}

int cuda_search_poll(void *self, int block, char *err, size_t errlen) {
    cuda_backend *b = (cuda_backend *)self;
    if (!b->pending) return 0;
    if (b->persist_pending) {
        int rc = persist_wait(b, b->pseq, block, err, errlen);
        if (rc == 1) return 1;
        b->pending = 0;
        b->persist_pending = 0;
        if (rc) return rc;
        for (uint32_t i = 0, f = 0; i < b->pn; i++) {
            tr_search_request *r = &b->preqs[i];
            for (uint32_t q = 0; q < r->count; q++, f++) r->hits = b->pmb->hits[f];
            r->status = 0;
        }
        return 0;
    }
    cudaError_t e = block ? cudaEventSynchronize(b->batch_done) : cudaEventQuery(b->batch_done);
    if (e == cudaErrorNotReady) return 1;
    b->pending = 0;
    CUDA_TRY(e);
    if (b->code_pending) { /* queries the codes could not answer: the f16 scan answers them, now */
        b->code_pending = 0;
        int rc = codes_finish(b, err, errlen);
        if (rc) return rc;
    }
    tr_search_request *reqs = b->preqs;
    uint32_t f = 0;
    for (uint32_t i = 0; i < b->pn; i++) {
        tr_search_request *r = &reqs[i];
        if (!batched_k(r->k)) continue; /* answered at submit (per-query kernel) */
        for (uint32_t q = 0; q < r->count; q++, f++) {
            if (b->pending_copy &&
                !(seg_device_ptr(b, r->ids_out + (size_t)q * r->k, (size_t)r->k * 8) &&
                  seg_device_ptr(b, r->scores_out + (size_t)q * r->k, (size_t)r->k * 4))) {
                memcpy(r->ids_out + (size_t)q * r->k, b->hres_ids + (size_t)f * b->max_k, (size_t)r->k * sizeof(int64_t));
                memcpy(r->scores_out + (size_t)q * r->k, b->hres_s + (size_t)f * b->max_k, (size_t)r->k * sizeof(float));
            }
            r->hits = b->hres_hits[f];
        }
        r->status = 0;
    }
    return 0;
}

int cuda_search_many(void *self, tr_search_request *reqs, uint32_t n, char *err, size_t errlen) {
    int rc = cuda_search_submit(self, reqs, n, err, errlen);
    if (rc) return rc;
    return cuda_search_poll(self, 1, err, errlen);
}
