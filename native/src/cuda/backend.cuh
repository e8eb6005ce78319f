/* The CUDA backend's host side: the backend's state (struct cuda_backend) and what its host files share. */
#ifndef TR_CUDA_BACKEND_CUH
#define TR_CUDA_BACKEND_CUH

#include <stdint.h>
#include <stdio.h>

#include "backend.h"
#include "launch.h"

/* In a function with char *err and size_t errlen: on a CUDA error, say where and return TR_E_INTERNAL. */
#define CUDA_TRY(call)                                                                            \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            snprintf(err, errlen, "CUDA error %s (%s) at %s:%d in %s", cudaGetErrorName(e_),      \
                     cudaGetErrorString(e_), __FILE__, __LINE__, #call);                          \
            return TR_E_INTERNAL;                                                                 \
        }                                                                                         \
    } while (0)

typedef struct cuda_backend {
    uint32_t dim, dtype, max_k;
    uint32_t nvec, ld, elem;
    uint64_t capacity, rows;
    int device, sms, grid_max;
    cudaStream_t stream;
    uint4 *X;
    int64_t *ids;
    uint64_t *ns;
    float *part_s;
    long long *part_id;
    unsigned *part_n, *done;
    /* pinned, mapped host buffers */
    float *hq;             /* queries: max_queries x ld */
    float *hq_dev;
    uint32_t hq_cap;       /* queries */
    long long *hres_ids;   /* max_queries x max_k */
    float *hres_s;
    unsigned *hres_hits;
    long long *hres_ids_dev;
    float *hres_s_dev;
    unsigned *hres_hits_dev;
    uint32_t hres_cap;     /* queries */
    /* write staging: pinned mapped, reused once the last scatter finished */
    unsigned char *hstage;
    unsigned char *hstage_dev;
    size_t hstage_cap;     /* rows */
    cudaEvent_t stage_free;
    int poison;            /* --test-poison-results: fill result buffers with garbage before each search */
    uint64_t one_trip_max_rows; /* the persistent kernel merges in one trip up to this many rows */
    uint64_t split_max_rows;    /* ... and splits the dimensions among a block's warps up to this many (0: never) */
    int persist_split;          /* the running persistent kernel is the split one */
    int persist_tagged;         /* ... takes its batches as tagged messages (the builds with the one-trip merge) */
    unsigned passes;       /* batched passes so far: every other one walks backward (BatchParams::backward) */
    /* batched search (f16 rows, when a two-tile block's shared memory fits) */
    int mma_ok;
    size_t smem_optin;
    float *bpart_s;        /* TR_BQ_MAX x grid_max x TR_BQ_MAX_K */
    long long *bpart_id;
    unsigned *bpart_n;
    unsigned *bdone;       /* fused merge ticket counter */
    uint4 *hq16;           /* pinned f16 queries */
    uint4 *dq;             /* their device copy */
    uint32_t bq_cap;       /* queries */
    /* the shared-memory segment, registered (mapped) so kernels write results into the slots */
    unsigned char *seg_host;
    unsigned char *seg_dev;
    uint64_t seg_bytes;
    int seg_registered;
    /* the batch in flight (search_submit .. search_poll) */
    cudaEvent_t batch_done;
    int pending;
    int pending_copy;      /* some results went to the pinned buffer: copy them out when done */
    tr_search_request *preqs;
    uint32_t pn;
    /* persistent kernel (f16 rows; --cuda-persist off turns it off) */
    int persist_ok;        /* built and allowed */
    int persist_running;
    int persist_pending;   /* the batch in flight went to the persistent kernel */
    unsigned pgrid;        /* resident blocks */
    size_t psmem;
    size_t psmem_split;    /* the split build's: psmem and its row cache (row_cache_layout) */
    unsigned cache_off, cache_rows, cache_stride; /* PersistCtl's row cache fields for the split build */
    unsigned pseq;         /* last seq sent (24 bits, never 0) */
    uint32_t ppolls;
    unsigned long long pbatches; /* answered by the running kernel (--cuda-verbose logs it at each stop) */
    int profile;                 /* --cuda-profile: mean stage times logged at each stop */
    unsigned long long psubmit_ns, prof_n, prof_sum[5]; /* host submit->done seen; kernel stages */
    unsigned long long prof_merge_n, prof_merge[3];     /* fused merges: bounds, candidates, final; kept */
    int verbose;
    PersistMailbox *pmb;   /* pinned, mapped */
    PersistMailbox *pmb_dev;
    unsigned char *pstream; /* the message's content (host memory): the batch's parameters (preq), then its f16
                             * queries (pq16), and 16 bytes of slack for persist_post's last 16-byte load */
    PersistReq *preq;
    uint4 *pq16;
    PersistReq *pdreq;     /* device copies of the batch */
    uint4 *pdq;
    PersistCtl *pctl;
    unsigned long long *pphase; /* profile: pgrid x TR_PH_SLOTS per-block phase sums (device) */
    unsigned pG;                /* profile: scanning blocks of the last batch */
    /* --codes int8 (code_scan.cuh, codes.cu) */
    int codes_on;
    uint64_t codes_min_rows;
    uint32_t cvec;              /* uint4 of codes per row (a multiple of 4: 64 dimensions) */
    uint4 *C;                   /* capacity x cvec */
    float2 *cmeta;              /* capacity: scale, bound_r */
    float4 *cflat;              /* TR_BQ_MAX x TR_CODE_FLAT candidates of a pass */
    float *cbest;               /* TR_BQ_MAX x TR_CUDA_MAX_GRID: the blocks' best lower bounds of a pass */
    CodeState *cstate;
    size_t csmem1, csmem2;      /* dynamic shared memory of the codes' kernels, one and two query tiles */
    int code_pending;           /* the batch in flight went to the codes */
    uint32_t code_backoff;      /* batches left to the f16 scan after one whose candidates overflowed */
    uint32_t code_next_backoff;
    uint64_t *code_scans, *code_fallbacks; /* the header's counters */
} cuda_backend;


/* backend.cu */
void f32_to_f16(const float *src, uint16_t *dst, uint32_t n);
void f16_to_f32(const uint16_t *src, float *dst, uint32_t n);

/* codes.cu: the int8 codes' device arrays, their staging and their searches */
int codes_setup(cuda_backend *b, const tr_backend_config *cfg, char *err, size_t errlen);
void codes_free(cuda_backend *b);
size_t codes_stage_bytes(const cuda_backend *b); /* staging bytes a row's codes and meta take (0: codes off) */
void codes_stage_row(const cuda_backend *b, const uint16_t *h, uint4 *codes, float2 *meta);
bool codes_take(cuda_backend *b, const tr_search_request *reqs, uint32_t n);
int codes_submit(cuda_backend *b, tr_search_request *reqs, uint32_t n, char *err, size_t errlen);
int codes_finish(cuda_backend *b, char *err, size_t errlen);

/* search.cu: the launched searches (per query, and batched passes) */
int ensure_query_buffers(cuda_backend *b, uint32_t nq, char *err, size_t errlen);
int ensure_batch_buffers(cuda_backend *b, uint32_t nq, char *err, size_t errlen);
void stage_batched_queries(cuda_backend *b, tr_search_request *reqs, uint32_t n, uint32_t total);
int launch_batched_passes(cuda_backend *b, tr_search_request *reqs, uint32_t total, char *err, size_t errlen);
size_t batch_smem(const cuda_backend *b, int nt);
void stage_query_f16(const cuda_backend *b, const float *query, uint4 *dst);
void *seg_device_ptr(const cuda_backend *b, const void *host, size_t bytes);
unsigned batch_params_init(cuda_backend *b, BatchParams &p, unsigned max_blocks, uint64_t min_rpb = TR_BQ_ROUND);
void set_batch_query(BatchParams &p, uint32_t j, const tr_search_request *r, long long *oid, float *osc);
int cuda_search(void *self, const float *queries, uint32_t nq, uint32_t k, int filter_ns, uint64_t ns_hash,
                int64_t *ids_out, float *scores_out, uint32_t *hits, char *err, size_t errlen);
int cuda_search_submit(void *self, tr_search_request *reqs, uint32_t n, char *err, size_t errlen);
int cuda_search_poll(void *self, int block, char *err, size_t errlen);
int cuda_search_many(void *self, tr_search_request *reqs, uint32_t n, char *err, size_t errlen);

/* persist.cu: the persistent kernel's host side */
int persist_setup(cuda_backend *b, int device, const tr_cuda_options *opt, char *err, size_t errlen);
int persist_submit(cuda_backend *b, tr_search_request *reqs, uint32_t n, uint32_t total, char *err, size_t errlen);
int persist_wait(cuda_backend *b, unsigned seq, int block, char *err, size_t errlen);
int persist_stop(cuda_backend *b, const char *why, char *err, size_t errlen);
void cuda_idle(void *self);

#endif
