/* The CUDA backend (tr_cuda_backend): create and destroy, row writes, and the operations table.
 *
 * Search paths (search.cu, persist.cu): batches of up to TR_BQ_MAX f16 queries with k <= TR_BQ_MAX_K go to the
 * persistent kernel while it runs (no launch per request); everything else, and every search when the persistent
 * kernel is off, is launched per batch (batch_scan_kernel) or per query (search_kernel).
 * Writes: rows are converted on the host into a pinned staging buffer and scattered by one kernel per batch on the
 * same stream as searches, so a search never sees a half-written row; the row count used by a search is the
 * host's, published only after the write was enqueued before it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_fp16.h>

#include "backend.cuh"

static void cuda_destroy(void *self) {
    cuda_backend *b = (cuda_backend *)self;
    if (!b) return;
    if (b->persist_running) {
        char e[TR_MESSAGE_BYTES];
        persist_stop(b, "exit", e, sizeof e);
    }
    if (b->stream) cudaStreamSynchronize(b->stream);
    if (b->seg_registered) cudaHostUnregister(b->seg_host);
    if (b->batch_done) cudaEventDestroy(b->batch_done);
    cudaFree(b->X); cudaFree(b->ids); cudaFree(b->ns);
    cudaFree(b->part_s); cudaFree(b->part_id); cudaFree(b->part_n); cudaFree(b->done);
    cudaFree(b->bpart_s); cudaFree(b->bpart_id); cudaFree(b->bpart_n); cudaFree(b->bdone); cudaFree(b->dq);
    cudaFree(b->pdreq); cudaFree(b->pdq); cudaFree(b->pctl); cudaFree(b->pphase);
    codes_free(b);
    if (b->pmb) cudaFreeHost(b->pmb);
    free(b->pstream);
    if (b->hq16) cudaFreeHost(b->hq16);
    if (b->hq) cudaFreeHost(b->hq);
    if (b->hres_ids) cudaFreeHost(b->hres_ids);
    if (b->hres_s) cudaFreeHost(b->hres_s);
    if (b->hres_hits) cudaFreeHost(b->hres_hits);
    if (b->hstage) cudaFreeHost(b->hstage);
    if (b->stage_free) cudaEventDestroy(b->stage_free);
    if (b->stream) cudaStreamDestroy(b->stream);
    free(b);
}

/* The device, its stream and events. */
static int open_device(cuda_backend *b, int device, char *err, size_t errlen) {
    /* Spin while waiting: the search path waits a few microseconds, a yield costs more. */
    if (cudaInitDevice(device, cudaDeviceScheduleSpin | cudaDeviceMapHost, 0) != cudaSuccess)
        cudaGetLastError(); /* already initialised with other flags: still usable */
    CUDA_TRY(cudaSetDevice(device));
    CUDA_TRY(cudaDeviceGetAttribute(&b->sms, cudaDevAttrMultiProcessorCount, device));
    b->grid_max = b->sms * TR_CUDA_BLOCKS_PER_SM;
    if (b->grid_max > TR_CUDA_MAX_GRID) b->grid_max = TR_CUDA_MAX_GRID;
    CUDA_TRY(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking));
    CUDA_TRY(cudaEventCreateWithFlags(&b->stage_free, cudaEventDisableTiming));
    CUDA_TRY(cudaEventCreateWithFlags(&b->batch_done, cudaEventDisableTiming));
    return 0;
}

/* Zero-copy results: register the segment once (mapped) so the merge kernel writes each query's ids and scores
 * straight into its slot; the host then only publishes DONE. A failed registration (or --test-no-zero-copy) leaves
 * the results to the pinned buffer, copied into the slots at poll. */
static void register_segment(cuda_backend *b, const tr_backend_config *cfg) {
    if (cfg->segment && cfg->segment_bytes && !cfg->cuda.test_no_zero_copy) {
        if (cudaHostRegister(cfg->segment, cfg->segment_bytes, cudaHostRegisterMapped | cudaHostRegisterPortable) ==
            cudaSuccess) {
            void *dev = NULL;
            if (cudaHostGetDevicePointer(&dev, cfg->segment, 0) == cudaSuccess) {
                b->seg_host = (unsigned char *)cfg->segment;
                b->seg_dev = (unsigned char *)dev;
                b->seg_bytes = cfg->segment_bytes;
                b->seg_registered = 1;
            } else {
                cudaGetLastError();
                cudaHostUnregister(cfg->segment);
            }
        } else {
            cudaError_t re = cudaGetLastError();
            fprintf(stderr, "tr-sidecar: cuda: cannot register the segment (%s): results go through a "
                    "pinned buffer\n", cudaGetErrorString(re));
        }
    }
    if (b->verbose) fprintf(stderr, "tr-sidecar: cuda: zero-copy results %s\n", b->seg_registered ? "on" : "off");
}

/* The rows, their ids and namespaces, and the per-query scan's partial lists. */
static int alloc_rows(cuda_backend *b, const tr_backend_config *cfg, char *err, size_t errlen) {
    size_t cap = cfg->capacity ? cfg->capacity : 1;
    if (cudaMalloc(&b->X, cap * b->nvec * sizeof(uint4)) != cudaSuccess) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        snprintf(err, errlen, "cannot allocate %llu rows x %u (%s) on the GPU: %.1f GiB needed, %.1f GiB free; "
                 "lower --capacity or use --dtype f16", (unsigned long long)cap, cfg->dim,
                 cfg->dtype == TR_DTYPE_F16 ? "f16" : "f32", cap * b->nvec * 16.0 / (1 << 30), free_b / (double)(1 << 30));
        return TR_E_INTERNAL;
    }
    CUDA_TRY(cudaMalloc(&b->ids, cap * sizeof(int64_t)));
    CUDA_TRY(cudaMalloc(&b->ns, cap * sizeof(uint64_t)));
    CUDA_TRY(cudaMalloc(&b->part_s, (size_t)b->grid_max * b->max_k * sizeof(float)));
    CUDA_TRY(cudaMalloc(&b->part_id, (size_t)b->grid_max * b->max_k * sizeof(long long)));
    CUDA_TRY(cudaMalloc(&b->part_n, (size_t)b->grid_max * sizeof(unsigned)));
    CUDA_TRY(cudaMalloc(&b->done, sizeof(unsigned)));
    CUDA_TRY(cudaMemset(b->done, 0, sizeof(unsigned)));
    return 0;
}

/* The batched tensor-core scan (f16 rows, when a two-tile block's shared memory fits): its lists and ticket. */
static int setup_batched(cuda_backend *b, int device, char *err, size_t errlen) {
    int optin = 0;
    CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    b->smem_optin = (size_t)optin;
    b->mma_ok = b->dtype == TR_DTYPE_F16 && batch_smem(b, 2) <= b->smem_optin;
    if (!b->mma_ok) return 0;
    const size_t parts = (size_t)TR_BQ_MAX * b->grid_max * TR_BQ_MAX_K;
    CUDA_TRY(cudaMalloc(&b->bpart_s, parts * sizeof(float)));
    CUDA_TRY(cudaMalloc(&b->bpart_id, parts * sizeof(long long)));
    CUDA_TRY(cudaMalloc(&b->bpart_n, (size_t)TR_BQ_MAX * b->grid_max * sizeof(unsigned)));
    CUDA_TRY(cudaMemset(b->bpart_s, 0, parts * sizeof(float)));
    CUDA_TRY(cudaMemset(b->bpart_id, 0, parts * sizeof(long long)));
    CUDA_TRY(cudaMemset(b->bpart_n, 0, (size_t)TR_BQ_MAX * b->grid_max * sizeof(unsigned)));
    CUDA_TRY(cudaMalloc(&b->bdone, sizeof(unsigned)));
    CUDA_TRY(cudaMemset(b->bdone, 0, sizeof(unsigned)));
    CUDA_TRY(tr_batch_kernels_allow_smem((int)batch_smem(b, 1), (int)batch_smem(b, 2)));
    return 0;
}

static void *cuda_create(const tr_backend_config *cfg, char *err, size_t errlen) {
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        snprintf(err, errlen, "no CUDA device is visible (%s): check nvidia-smi and CUDA_VISIBLE_DEVICES, "
                 "or use --backend cpu", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return NULL;
    }
    if (cfg->device < 0 || cfg->device >= ndev) {
        snprintf(err, errlen, "--device %d does not exist: %d CUDA device(s) visible", cfg->device, ndev);
        return NULL;
    }
    cuda_backend *b = (cuda_backend *)calloc(1, sizeof *b);
    if (!b) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    b->dim = cfg->dim;
    b->dtype = cfg->dtype;
    b->capacity = cfg->capacity;
    b->max_k = cfg->max_k;
    b->device = cfg->device;
    b->elem = cfg->dtype == TR_DTYPE_F16 ? 2 : 4;
    b->poison = cfg->cuda.test_poison_results;
    b->verbose = cfg->cuda.verbose;
    b->profile = cfg->cuda.profile;
    const uint32_t per_vec = 16 / b->elem;
    b->nvec = (cfg->dim + per_vec - 1) / per_vec;
    b->ld = b->nvec * per_vec;
    int rc = open_device(b, cfg->device, err, errlen);
    if (!rc) register_segment(b, cfg);
    if (!rc) rc = alloc_rows(b, cfg, err, errlen);
    if (!rc) rc = setup_batched(b, cfg->device, err, errlen);
    if (!rc) rc = codes_setup(b, cfg, err, errlen);
    if (!rc) rc = persist_setup(b, cfg->device, &cfg->cuda, err, errlen);
    if (!rc && cudaDeviceSynchronize() != cudaSuccess) {
        snprintf(err, errlen, "CUDA error at start-up: %s", cudaGetErrorString(cudaGetLastError()));
        rc = TR_E_INTERNAL;
    }
    if (rc) {
        cuda_destroy(b);
        return NULL;
    }
    return b;
}

/* The staging buffer of n rows: cap x vector (ld elements), cap x codes (with --codes int8), then cap ids, namespaces,
 * row numbers and code meta (staged_rows). */
static int ensure_stage(cuda_backend *b, uint32_t n, char *err, size_t errlen) {
    if (n <= b->hstage_cap) return 0;
    CUDA_TRY(cudaStreamSynchronize(b->stream));
    if (b->hstage) cudaFreeHost(b->hstage);
    b->hstage = NULL;
    b->hstage_cap = 0;
    size_t cap = n < 256 ? 256 : n;
    size_t bytes = cap * ((size_t)b->nvec * 16 + 8 + 8 + 8 + codes_stage_bytes(b));
    CUDA_TRY(cudaHostAlloc((void **)&b->hstage, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    CUDA_TRY(cudaHostGetDevicePointer((void **)&b->hstage_dev, b->hstage, 0));
    b->hstage_cap = cap;
    return 0;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
__attribute__((target("f16c,avx"))) static void f32_to_f16_f16c(const float *src, uint16_t *dst, uint32_t n) {
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) {
        __half h = __float2half_rn(src[i]);
        memcpy(dst + i, &h, 2);
    }
}

__attribute__((target("f16c,avx"))) static void f16_to_f32_f16c(const uint16_t *src, float *dst, uint32_t n) {
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) {
        __half h;
        memcpy(&h, src + i, 2);
        dst[i] = __half2float(h);
    }
}
#endif

/* f16 -> float (exact), F16C where the CPU has it: the codes are encoded from the rows as stored. */
void f16_to_f32(const uint16_t *src, float *dst, uint32_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    static int f16c = -1;
    if (f16c < 0) f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
    if (f16c) {
        f16_to_f32_f16c(src, dst, n);
        return;
    }
#endif
    for (uint32_t i = 0; i < n; i++) {
        __half h;
        memcpy(&h, src + i, 2);
        dst[i] = __half2float(h);
    }
}

/* F16C where the CPU has it: __float2half_rn element by element is several times slower on the write path. */
void f32_to_f16(const float *src, uint16_t *dst, uint32_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
    static int f16c = -1;
    if (f16c < 0) f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
    if (f16c) {
        f32_to_f16_f16c(src, dst, n);
        return;
    }
#endif
    for (uint32_t i = 0; i < n; i++) {
        __half h = __float2half_rn(src[i]);
        memcpy(dst + i, &h, 2);
    }
}

/* The device arrays a row write changes (the codes only with --codes int8). */
static RowArrays row_arrays(const cuda_backend *b) {
    RowArrays a = {b->X, b->ids, b->ns, b->codes_on ? b->C : nullptr, b->codes_on ? b->cmeta : nullptr, b->nvec,
                   b->cvec};
    return a;
}

static int cuda_write_rows(void *self, const uint64_t *rows, uint32_t n, const float *vectors,
                           const int64_t *ids, const uint64_t *ns, char *err, size_t errlen) {
    cuda_backend *b = (cuda_backend *)self;
    if (n == 0) return 0;
    for (uint32_t i = 0; i < n; i++) {
        if (rows[i] >= b->capacity) {
            snprintf(err, errlen, "internal: row %llu beyond capacity", (unsigned long long)rows[i]);
            return TR_E_INTERNAL;
        }
    }
    int rc = persist_stop(b, "write", err, errlen); /* the scatter runs on the stream the kernel holds */
    if (rc) return rc;
    rc = ensure_stage(b, n, err, errlen);
    if (rc) return rc;
    /* the previous scatter may still read the staging buffer */
    CUDA_TRY(cudaEventSynchronize(b->stage_free));
    const size_t cap = b->hstage_cap;
    unsigned char *vec = b->hstage;
    uint4 *codes = reinterpret_cast<uint4 *>(b->hstage + cap * (size_t)b->nvec * 16);
    int64_t *sids = (int64_t *)(codes + (b->codes_on ? cap * (size_t)b->cvec : 0));
    uint64_t *sns = (uint64_t *)(sids + cap);
    uint64_t *srows = sns + cap;
    float2 *smeta = reinterpret_cast<float2 *>(srows + cap);
    for (uint32_t i = 0; i < n; i++) {
        const float *src = vectors + (size_t)i * b->dim;
        if (b->dtype == TR_DTYPE_F16) {
            uint16_t *dst = (uint16_t *)(vec + (size_t)i * b->nvec * 16);
            f32_to_f16(src, dst, b->dim);
            memset(dst + b->dim, 0, (size_t)(b->ld - b->dim) * sizeof(uint16_t)); /* +0.0 in f16 */
            if (b->codes_on) codes_stage_row(b, dst, codes + (size_t)i * b->cvec, smeta + i);
        } else {
            float *dst = (float *)(vec + (size_t)i * b->nvec * 16);
            memcpy(dst, src, (size_t)b->dim * 4);
            for (uint32_t j = b->dim; j < b->ld; j++) dst[j] = 0.f;
        }
        sids[i] = ids[i];
        sns[i] = ns[i];
        srows[i] = rows[i];
    }
    /* the same places in the buffer's device mapping */
    const unsigned char *dev = b->hstage_dev;
    const size_t off_codes = cap * (size_t)b->nvec * 16;
    const size_t off_ids = off_codes + (b->codes_on ? cap * (size_t)b->cvec * 16 : 0);
    const StagedRows staged = {(const uint4 *)dev, (const int64_t *)(dev + off_ids),
                               (const uint64_t *)(dev + off_ids + cap * 8), (const uint64_t *)(dev + off_ids + cap * 16),
                               (const uint4 *)(dev + off_codes), (const float2 *)(dev + off_ids + cap * 24)};
    CUDA_TRY(tr_launch_scatter_rows(row_arrays(b), staged, n, b->stream));
    CUDA_TRY(cudaEventRecord(b->stage_free, b->stream));
    return 0;
}

static int cuda_move_row(void *self, uint64_t dst, uint64_t src, char *err, size_t errlen) {
    cuda_backend *b = (cuda_backend *)self;
    if (dst >= b->capacity || src >= b->capacity) {
        snprintf(err, errlen, "internal: move %llu -> %llu beyond capacity", (unsigned long long)src,
                 (unsigned long long)dst);
        return TR_E_INTERNAL;
    }
    int rc = persist_stop(b, "write", err, errlen);
    if (rc) return rc;
    CUDA_TRY(tr_launch_move_row(row_arrays(b), dst, src, b->stream));
    return 0;
}

static int cuda_set_row_count(void *self, uint64_t rows, char *err, size_t errlen) {
    cuda_backend *b = (cuda_backend *)self;
    (void)err; (void)errlen;
    /* Searches are enqueued on the same stream after the writes that made these rows. */
    b->rows = rows;
    return 0;
}

/* The library's only exported symbols (backend.h: TR_CUDA_BACKEND_SYMBOL, TR_CUDA_LAYOUT_SYMBOL). */
extern "C" __attribute__((visibility("default"))) const uint32_t tr_cuda_backend_layout = TR_LAYOUT_VERSION;
extern "C" __attribute__((visibility("default"))) const tr_backend_ops tr_cuda_backend = {
    "cuda",
    TR_BACKEND_CUDA,
    cuda_create,
    cuda_destroy,
    cuda_write_rows,
    cuda_move_row,
    cuda_set_row_count,
    cuda_search,
    cuda_search_many,
    cuda_search_submit,
    cuda_search_poll,
    cuda_idle,
};
