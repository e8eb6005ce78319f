/* The persistent kernel's host side: set-up, batch hand-over, start, wait, stop, and the stage profile printout.
 *
 * The kernel (persist_kernel.cuh) runs while searches keep coming: f16 rows, k <= TR_BQ_MAX_K, up to TR_BQ_MAX
 * queries a batch. Anything else on its stream (a write, a launched search) stops it first, and so does an idle
 * server (cuda_idle); the next search that fits starts it again. Which of its three builds starts is chosen by the
 * row count at the start (persist_start).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <emmintrin.h> /* store16_tagged */
#endif

#include "backend.cuh"
#include "platform.h" /* tr_cache_demote */

/* The split build's row cache (RowCache): it starts past what a one-tile scan (queries, lists, the parts' sums) and
 * the fused merge use, and holds as many rows (up to TR_SPLIT_MAX_RPB) as keep per_sm blocks of the build resident
 * on an SM (the grid every build shares). The split build then serves tiers of up to that many rows per block. */
static cudaError_t row_cache_layout(cuda_backend *b, int per_sm) {
    /* batch_smem(b, 1) covers the one-tile scan and the merge; the parts' sums follow the scan's lists */
    const size_t off = (batch_smem(b, 1) + (size_t)TR_CUDA_BLOCK * sizeof(float4) + 15) / 16;
    const unsigned stride = b->nvec + (12u - b->nvec % 8u) % 8u; /* = 4 mod 8 */
    const void *kernel = tr_persist_kernel(TR_PERSIST_SPLIT);
    b->psmem_split = b->psmem;
    b->cache_off = (unsigned)off;
    b->cache_stride = stride;
    b->cache_rows = 0;
    for (unsigned rows = TR_SPLIT_MAX_RPB; rows > 0; rows--) {
        /* the rows, then their ids and namespace hashes (8 bytes each, from a 16-byte boundary) */
        size_t smem = (off + (size_t)rows * stride + 2 * ((rows + 1) / 2)) * 16;
        if (smem < b->psmem) smem = b->psmem;
        if (smem > b->smem_optin) continue;
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        int fit = 0;
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, TR_CUDA_BLOCK, smem);
        if (e != cudaSuccess) return e;
        if (fit >= per_sm) {
            b->cache_rows = rows;
            b->psmem_split = smem;
            return cudaSuccess;
        }
    }
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)b->psmem);
}

/* The grid every build shares (as many blocks per SM as each build can hold, at most TR_CUDA_BLOCKS_PER_SM), the
 * row cache, and the size limits of the one-trip and split builds. */
static int persist_layout(cuda_backend *b, int device, const tr_cuda_options *opt, char *err, size_t errlen) {
    int coop = 0, per_sm = TR_CUDA_BLOCKS_PER_SM; /* lowered to what every build can hold */
    CUDA_TRY(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device));
    b->psmem = batch_smem(b, 2);
    for (int build = 0; build < TR_PERSIST_BUILDS; build++) { /* one grid for all: the lists are sized by it */
        const void *k = tr_persist_kernel(build);
        int per_sm_kernel = 0;
        CUDA_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)b->psmem));
        CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_kernel, k, TR_CUDA_BLOCK, b->psmem));
        if (per_sm_kernel < per_sm) per_sm = per_sm_kernel;
    }
    long grid = (long)per_sm * b->sms;
    if (grid > b->grid_max) grid = b->grid_max;
    b->pgrid = (unsigned)grid;
    b->persist_ok = coop && grid > 0 && opt->persist;
    b->one_trip_max_rows = opt->one_trip_max_rows;
    CUDA_TRY(row_cache_layout(b, per_sm));
    /* the split scan reads its runs from the row cache: runs of at most cache_rows, and at least TR_SPLIT_RPB */
    const uint64_t split_cap = b->cache_rows >= TR_SPLIT_RPB ? (uint64_t)grid * b->cache_rows : 0;
    b->split_max_rows = opt->split_max_rows < split_cap ? opt->split_max_rows : split_cap;
    return 0;
}

/* The mailbox (pinned, mapped), the message's host copy, the device copies of a batch and the control block. */
static int persist_alloc(cuda_backend *b, char *err, size_t errlen) {
    size_t msg_chunks = persist_msg_chunks(TR_BQ_MAX, b->nvec);
    if (msg_chunks < TR_MSG_HEAD) msg_chunks = TR_MSG_HEAD; /* block 0 reads a whole head, message or not */
    const size_t mb_bytes = sizeof(PersistMailbox) + ((size_t)TR_BQ_MAX * b->nvec + msg_chunks) * sizeof(uint4);
    b->pstream = (unsigned char *)calloc(sizeof(PersistReq) + ((size_t)TR_BQ_MAX * b->nvec + 1) * sizeof(uint4), 1);
    if (!b->pstream) {
        snprintf(err, errlen, "out of host memory for the persistent kernel's queries");
        return TR_E_INTERNAL;
    }
    b->preq = reinterpret_cast<PersistReq *>(b->pstream);
    b->pq16 = reinterpret_cast<uint4 *>(b->pstream + sizeof(PersistReq));
    CUDA_TRY(cudaHostAlloc((void **)&b->pmb, mb_bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    memset(b->pmb, 0, mb_bytes);
    CUDA_TRY(cudaHostGetDevicePointer((void **)&b->pmb_dev, b->pmb, 0));
    CUDA_TRY(cudaMalloc(&b->pdreq, sizeof(PersistReq)));
    /* dq: the batch's queries (builds past the one-trip limit) or block 0's relay of the tagged message (the
     * others), zeroed: no chunk carries seq 0 */
    const size_t dq_vecs = (size_t)TR_BQ_MAX * b->nvec > msg_chunks ? (size_t)TR_BQ_MAX * b->nvec : msg_chunks;
    CUDA_TRY(cudaMalloc(&b->pdq, dq_vecs * sizeof(uint4)));
    CUDA_TRY(cudaMemset(b->pdq, 0, dq_vecs * sizeof(uint4)));
    CUDA_TRY(cudaMalloc(&b->pctl, sizeof(PersistCtl)));
    if (b->profile) {
        const size_t bytes = (size_t)b->pgrid * TR_PH_SLOTS * sizeof(unsigned long long);
        CUDA_TRY(cudaMalloc(&b->pphase, bytes));
        CUDA_TRY(cudaMemset(b->pphase, 0, bytes));
    }
    return 0;
}

int persist_setup(cuda_backend *b, int device, const tr_cuda_options *opt, char *err, size_t errlen) {
    if (b->mma_ok) {
        int rc = persist_layout(b, device, opt, err, errlen);
        if (!rc && b->persist_ok) rc = persist_alloc(b, err, errlen);
        if (rc) return rc;
    }
    if (b->verbose) {
        if (b->persist_ok)
            fprintf(stderr, "tr-sidecar: cuda: persistent kernel on (%u blocks); split scan up to %llu rows (row "
                    "cache of %u rows per block, %zu bytes of shared memory per block)\n", b->pgrid,
                    (unsigned long long)b->split_max_rows, b->cache_rows, b->psmem_split);
        else fprintf(stderr, "tr-sidecar: cuda: persistent kernel off (launch per request)\n");
    }
    return 0;
}

/* 12 bytes from src and then tag, as one 16-byte store that no reader sees in part (the persistent kernel's
 * message chunks): x86-64 CPUs with AVX carry out an aligned 16-byte SSE store atomically (Intel SDM vol. 3A
 * 9.1.1; AMD likewise), and an aligned STP of two 64-bit registers is single-copy atomic from Armv8.4
 * (FEAT_LSE2). src may be unaligned; its 16 bytes are read. */
static inline void store16_tagged(uint4 *dst, const unsigned char *src, uint32_t tag) {
#if defined(__x86_64__)
    const __m128i low12 = _mm_set_epi32(0, -1, -1, -1);
    const __m128i v = _mm_or_si128(_mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i *>(src)), low12),
                                   _mm_set_epi32((int)tag, 0, 0, 0));
    _mm_store_si128(reinterpret_cast<__m128i *>(dst), v);
#elif defined(__aarch64__)
    uint64_t lo, hi;
    memcpy(&lo, src, 8);
    memcpy(&hi, src + 8, 8);
    hi = (uint64_t)tag << 32 | (hi & 0xFFFFFFFFull);
    asm volatile("stp %0, %1, [%2]" ::"r"(lo), "r"(hi), "r"(dst) : "memory");
#else
#error "the persistent kernel's mailbox needs an atomic 16-byte store on this CPU"
#endif
}

/* Hands the batch (b->preq and nq rows of b->pq16) to the running kernel. The builds with the one-trip merge take
 * it as one message (the stream in b->pstream) in the mailbox's message area with the tag
 * seq << 8 | nq, one atomic 16-byte store per chunk: the kernel takes a chunk whose tag it sees as whole (a DMA
 * read sees an aligned 16 bytes of one cache line as the one store left them). Words past the message in its last
 * chunk are whatever the stream holds there; the kernel ignores them. */
static void persist_post(cuda_backend *b, unsigned nq) {
    if (!b->persist_tagged) { /* the rounds build: the batch, then the word */
        memcpy(&b->pmb->req, b->preq, sizeof(PersistReq));
        memcpy(b->pmb + 1, b->pq16, (size_t)nq * b->nvec * sizeof(uint4));
        __atomic_store_n(&b->pmb->word, b->pseq << 8 | nq, __ATOMIC_RELEASE);
        return;
    }
    const unsigned tag = b->pseq << 8 | nq, chunks = persist_msg_chunks(nq, b->nvec);
    uint4 *msg = persist_msg_area(b->pmb, b->nvec);
    for (unsigned c = 0; c < chunks; c++) store16_tagged(&msg[c], b->pstream + (size_t)c * 12u, tag);
    for (unsigned c = 0; c < chunks; c += 4) tr_cache_demote(&msg[c]); /* the device reads them next */
}

/* Launches the persistent kernel (asynchronously: it picks up the mailbox once it runs). */
static int persist_start(cuda_backend *b, char *err, size_t errlen) {
    unsigned seq = b->pseq, nvec = b->nvec;
    void *args[] = {&b->pmb_dev, &b->pdreq, &b->pdq, &b->pctl, &seq, &nvec, &b->pphase};
    /* chosen by the row count now: writes stop it, but a delete that moves no row only shrinks b->rows while it
     * runs. Each pass reads its row count and rows per block from its own parameters, so each build is exact at
     * any size (the split one for any rows per block, though it only ever gets 64 or fewer); the choice only
     * decides speed. */
    b->persist_split = b->rows <= b->split_max_rows;
    b->persist_tagged = b->persist_split || b->rows <= b->one_trip_max_rows;
    const void *kernel = tr_persist_kernel(b->persist_split                   ? TR_PERSIST_SPLIT
                                           : b->rows <= b->one_trip_max_rows ? TR_PERSIST_ONE_TRIP
                                                                             : TR_PERSIST_ROUNDS);
    PersistCtl ctl;
    memset(&ctl, 0, sizeof ctl);
    if (b->persist_split) {
        ctl.cache_off = b->cache_off;
        ctl.cache_rows = b->cache_rows;
        ctl.cache_stride = b->cache_stride;
    }
    /* pageable source: the copy has taken ctl before it returns */
    CUDA_TRY(cudaMemcpyAsync(b->pctl, &ctl, sizeof ctl, cudaMemcpyHostToDevice, b->stream));
    cudaError_t e = cudaLaunchCooperativeKernel(kernel, dim3(b->pgrid), dim3(TR_CUDA_BLOCK), args,
                                                b->persist_split ? b->psmem_split : b->psmem, b->stream);
    if (e != cudaSuccess) {
        cudaGetLastError();
        fprintf(stderr, "tr-sidecar: cuda: the persistent kernel cannot start (%s): launching per request from now on\n",
                cudaGetErrorString(e));
        b->persist_ok = 0;
        return 1; /* not an error: the caller uses the launch path */
    }
    b->persist_running = 1;
    b->ppolls = 0;
    if (b->verbose)
        fprintf(stderr, "tr-sidecar: cuda: persistent kernel started for %llu rows (%s)\n", (unsigned long long)b->rows,
                b->persist_split ? "split scan" : b->rows <= b->one_trip_max_rows ? "one-trip merge" : "merge in rounds");
    return 0;
}

static uint64_t host_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Logs the per-block phases (TR_PH_*) added up since the last stop and clears them: the scanning
 * blocks' mean and their slowest block's mean, and the other blocks' mean (they only take a ticket). */
static void log_block_phases(cuda_backend *b) {
    const size_t n = (size_t)b->pgrid * TR_PH_SLOTS;
    unsigned long long *h = (unsigned long long *)calloc(n, sizeof *h);
    if (!h || cudaMemcpy(h, b->pphase, n * sizeof *h, cudaMemcpyDeviceToHost) != cudaSuccess) {
        free(h);
        return;
    }
    double cyc = 0, ns = 0;
    for (unsigned blk = 0; blk < b->pgrid; blk++) {
        cyc += (double)h[blk * TR_PH_SLOTS + TR_PH_CYCLES];
        ns += (double)h[blk * TR_PH_SLOTS + TR_PH_NS];
    }
    const double us_per_cycle = cyc > 0 ? ns / cyc / 1e3 : 0;
    static const char *names[] = {"stage", "round 1", "more rounds", "lists", "fence", "ticket"};
    char line[1024];
    int at = snprintf(line, sizeof line, "tr-sidecar: cuda: block phases, mean us per batch (scanning blocks "
                      "mean/slowest, %u of %u; others mean; %.3f GHz):", b->pG, b->pgrid,
                      us_per_cycle > 0 ? 1e-3 / us_per_cycle : 0.0);
    for (int i = 0; i <= TR_PH_GO_NS && at < (int)sizeof line; i++) {
        if (i == TR_PH_CYCLES || i == TR_PH_NS) continue;
        double sum_s = 0, max_s = 0, sum_o = 0;
        unsigned ns_ = 0, no = 0;
        for (unsigned blk = 0; blk < b->pgrid; blk++) {
            const unsigned long long *ph = h + blk * TR_PH_SLOTS;
            if (!ph[TR_PH_COUNT]) continue;
            const double v = (double)ph[i] / (double)ph[TR_PH_COUNT] * (i == TR_PH_GO_NS ? 1e-3 : us_per_cycle);
            if (blk < b->pG) {
                sum_s += v;
                if (v > max_s) max_s = v;
                ns_++;
            } else {
                sum_o += v;
                no++;
            }
        }
        at += snprintf(line + at, sizeof line - at, " %s %.2f/%.2f|%.2f;", i == TR_PH_GO_NS ? "go seen" : names[i],
                       ns_ ? sum_s / ns_ : 0.0, max_s, no ? sum_o / no : 0.0);
    }
    fprintf(stderr, "%s\n", line);
    free(h);
    cudaMemset(b->pphase, 0, n * sizeof *h);
}

static void persist_profile(cuda_backend *b) {
    const unsigned long long *t = b->pmb->stamp;
    b->prof_sum[0] += host_ns() - b->psubmit_ns;
    b->prof_sum[1] += t[1] - t[0];
    b->prof_sum[2] += t[2] - t[1];
    b->prof_sum[3] += t[3] - t[2];
    b->prof_n++;
    const unsigned long long *m = b->pmb->merge_stamp;
    if (m[0] > t[2] && m[1] >= m[0] && t[3] >= m[1]) { /* this batch's fused merge (not the per-query kernels) */
        b->prof_merge[0] += m[0] - t[2];
        b->prof_merge[1] += m[1] - m[0];
        b->prof_merge[2] += m[2];
        b->prof_merge_n++;
    }
}

/* Waits (spinning when block) until the persistent kernel has answered seq: 0, 1 while it has not (block = 0), or
 * a negative tr_status when it died. */
int persist_wait(cuda_backend *b, unsigned seq, int block, char *err, size_t errlen) {
    for (;;) {
        if (__atomic_load_n(&b->pmb->done_seq, __ATOMIC_ACQUIRE) == seq) {
            if (b->profile) persist_profile(b);
            return 0;
        }
        if ((++b->ppolls & 1023u) == 0) {
            /* the kernel never returns while serving: a finished or failed stream means it died */
            cudaError_t e = cudaStreamQuery(b->stream);
            if (e != cudaErrorNotReady) {
                if (__atomic_load_n(&b->pmb->done_seq, __ATOMIC_ACQUIRE) == seq) return 0;
                b->persist_running = 0;
                if (e == cudaSuccess) {
                    snprintf(err, errlen, "internal: the persistent search kernel stopped without answering");
                    return TR_E_INTERNAL;
                }
                CUDA_TRY(e);
            }
        }
        if (!block) return 1;
    }
}


/* The stage profile since the last stop (host and kernel stamps, the fused merge's, the blocks' phases), and clears
 * it. */
static void log_profile(cuda_backend *b) {
    const double n = (double)b->prof_n;
    fprintf(stderr, "tr-sidecar: cuda: profile over %llu batches, mean us: host submit->done seen %.2f | "
            "kernel: message seen->go %.2f, go->last ticket %.2f, last ticket->done %.2f\n", b->prof_n,
            b->prof_sum[0] / n / 1e3, b->prof_sum[1] / n / 1e3, b->prof_sum[2] / n / 1e3, b->prof_sum[3] / n / 1e3);
    if (b->prof_merge_n) {
        const double mn = (double)b->prof_merge_n;
        fprintf(stderr, "tr-sidecar: cuda: profile of the fused merge over %llu batches, mean us: bounds %.2f, "
                "candidates %.2f (%.1f kept), rank and write the rest of last ticket->done\n", b->prof_merge_n,
                b->prof_merge[0] / mn / 1e3, b->prof_merge[1] / mn / 1e3, b->prof_merge[2] / mn);
    }
    memset(b->prof_sum, 0, sizeof b->prof_sum);
    memset(b->prof_merge, 0, sizeof b->prof_merge);
    b->prof_n = b->prof_merge_n = 0;
    log_block_phases(b);
}

/* Stops the persistent kernel (before anything else runs on its stream, and when the server goes to
 * sleep) and waits until it has exited. */
int persist_stop(cuda_backend *b, const char *why, char *err, size_t errlen) {
    if (!b->persist_running) return 0;
    if (b->persist_pending) { /* the server never does this; stay correct if a caller does */
        int rc = persist_wait(b, b->pseq, 1, err, errlen);
        if (rc) return rc;
    }
    b->preq->nq = 0;
    b->pseq = persist_next_seq(b->pseq);
    persist_post(b, 0);
    b->persist_running = 0;
    CUDA_TRY(cudaStreamSynchronize(b->stream));
    if (b->verbose)
        fprintf(stderr, "tr-sidecar: cuda: persistent kernel stopped (%s) after %llu batches\n", why, b->pbatches);
    if (b->profile && b->prof_n) log_profile(b);
    b->pbatches = 0;
    return 0;
}

void cuda_idle(void *self) {
    cuda_backend *b = (cuda_backend *)self;
    char e[TR_MESSAGE_BYTES];
    if (persist_stop(b, "idle", e, sizeof e)) fprintf(stderr, "tr-sidecar: cuda: %s\n", e);
}

/* Hands n requests (total queries, each k <= TR_BQ_MAX_K, total <= TR_BQ_MAX) to the persistent
 * kernel through the mailbox; results go straight into the slots (registered segment), hits into
 * the mailbox. Returns 0, a negative tr_status, or 1 when the kernel could not start. */
int persist_submit(cuda_backend *b, tr_search_request *reqs, uint32_t n, uint32_t total, char *err,
                          size_t errlen) {
    if (!b->persist_running) {
        int rc = persist_start(b, err, errlen);
        if (rc) return rc;
    }
    PersistReq *pr = b->preq;
    BatchParams &p = pr->p;
    uint4 *q16 = b->pq16;
    pr->G = batch_params_init(b, p, b->pgrid, b->persist_split ? TR_SPLIT_RPB : TR_BQ_ROUND);
    uint32_t f = 0;
    for (uint32_t i = 0; i < n; i++) {
        tr_search_request *r = &reqs[i];
        for (uint32_t q = 0; q < r->count; q++, f++) {
            stage_query_f16(b, r->queries + (size_t)q * b->dim, q16 + (size_t)f * b->nvec);
            if (b->poison) {
                memset(r->ids_out + (size_t)q * r->k, 0x7f, (size_t)r->k * sizeof(int64_t));
                memset(r->scores_out + (size_t)q * r->k, 0x7f, (size_t)r->k * sizeof(float));
                memset(&b->pmb->hits[f], 0x7f, sizeof(unsigned));
            }
            long long *oid = (long long *)seg_device_ptr(b, r->ids_out + (size_t)q * r->k, (size_t)r->k * 8);
            float *osc = (float *)seg_device_ptr(b, r->scores_out + (size_t)q * r->k, (size_t)r->k * 4);
            if (!oid || !osc) { /* not in the registered segment: let the launch path copy them out */
                return 1;
            }
            set_batch_query(p, f, r, oid, osc);
        }
    }
    pr->nq = total;
    pr->profile = (unsigned)b->profile;
    b->pG = pr->G;
    p.q = b->pdq;
    p.out_hits = reinterpret_cast<unsigned *>(reinterpret_cast<unsigned char *>(b->pmb_dev) +
                                              offsetof(PersistMailbox, hits));
    p.nq = total;
    b->pseq = persist_next_seq(b->pseq);
    if (b->profile) b->psubmit_ns = host_ns();
    persist_post(b, total);
    b->pending = 1;
    b->persist_pending = 1;
    b->pbatches++;
    b->preqs = reqs;
    b->pn = n;
    return 0;
}
