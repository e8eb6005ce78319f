/* The CUDA backend's constants and the structs that host and device code share (kernel parameters, the mailbox). */
#ifndef TR_CUDA_PARAMS_CUH
#define TR_CUDA_PARAMS_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "tiered_recall/layout.h"

#define TR_CUDA_BLOCK 256                 /* threads per scan block: 8 warps */
#define TR_CUDA_WARPS (TR_CUDA_BLOCK / 32)
#define TR_CUDA_ROWS_PER_WARP 16           /* rows one warp scores per round */
#define TR_CUDA_ROUND (TR_CUDA_WARPS * TR_CUDA_ROWS_PER_WARP) /* 128 rows per block round */
#define TR_CUDA_CAND 512                   /* candidate buffer; >= TR_MAX_K + TR_CUDA_ROUND */
#define TR_CUDA_MIN_ROWS_PER_BLOCK 32
#define TR_CUDA_BLOCKS_PER_SM 2
#define TR_CUDA_MAX_GRID (2 * TR_CUDA_BLOCK) /* the merge walks at most two lists per thread */
#define TR_CUDA_INLINE_DIM 1024            /* queries up to this dim ride in kernel parameters */
#define TR_CUDA_CHUNK 4                    /* 16-byte loads per lane per step of a row */

static_assert(TR_CUDA_CAND >= TR_MAX_K + TR_CUDA_ROUND, "candidate buffer too small for max k");
static_assert((TR_CUDA_CAND & (TR_CUDA_CAND - 1)) == 0, "candidate buffer must be a power of two");

/* ------------------------------------------------------------------------------------------ */
/* the per-query scan (query_scan.cuh)                                                          */

struct SearchParams {
    const uint4 *X;          /* rows x nvec uint4 */
    const int64_t *ids;      /* row -> id */
    const uint64_t *ns;      /* row -> namespace hash */
    const float *qptr;       /* device view of the query (non-inline variant) */
    float *part_s;           /* grid x k partial scores */
    long long *part_id;      /* grid x k partial ids */
    unsigned *part_n;        /* grid */
    unsigned *done;          /* ticket counter, reset by the last block */
    long long *out_ids;      /* mapped host memory: k ids */
    float *out_s;            /* mapped host memory: k scores */
    unsigned *out_hits;      /* mapped host memory: 1 */
    unsigned long long rows;
    unsigned long long rows_per_block;
    unsigned long long ns_hash;
    unsigned nvec;           /* uint4 per row */
    unsigned ld;             /* elements per row (padded) */
    unsigned dim;
    unsigned k;
    int filter;
};

template <int N>
struct QueryInline {
    float q[N];
};
/* ------------------------------------------------------------------------------------------ */
/* the batched scan and its merge (batch_scan.cuh, merge.cuh)                                   */

#define TR_BQ_MAX 16     /* queries per pass (two n-tiles of 8) */
#define TR_BQ_MAX_K 64   /* larger k goes through the per-query kernel */
#define TR_BQ_CB 256     /* per-query candidate buffer in a scan block */
#define TR_BQ_ROUND 128  /* rows per block round: 8 warps x 16 */
#define TR_BQ_STAGE 4    /* 32-half chunks per register stage (two stages: one loading, one in the mmas) */
#define TR_BQ_INLINE 128 /* uint4 of f16 queries that ride in the kernel parameters (2 KB) */
#define TR_BQ_MCB 2304   /* merge buffer: one 2048-entry round + kept */
#define TR_MERGE_SLOTS 12       /* the merge's one-trip path: up to this many list slots per thread (G x k) */
#define TR_MERGE_BOUND_GROUPS 2 /* ... and up to this many groups of 32 lists per warp (G <= 512) */
/* The persistent kernel has three builds (launch.h: tr_persist_build). The one-trip merge is its own build, taken by
 * tiers of up to --cuda-one-trip-max-rows: in one kernel with the scan, its code slowed the scan of larger tiers (the
 * more, the more rounds each block walks), path taken or not; as its own build the other compiles as before. Tiers of
 * up to grid x the row cache's rows (row_cache_layout: at most TR_SPLIT_MAX_RPB a block; --cuda-split-max-rows lowers
 * the limit, 0 turns it off) get the split build, whose scan reads each block's run from shared memory (RowCache) and
 * splits the dimensions among a block's warps (batch_scan_block<1, true>), with scan blocks of TR_SPLIT_RPB rows:
 * fewer rows a block means more blocks reading at once but more lists to merge (of 16, 32 and 64, 32 answered a
 * small tier soonest on an H200). */
#define TR_SPLIT_RPB 32ull
#define TR_SPLIT_MAX_RPB 64u
#define TR_BQ_FUSE_MAX 2 /* up to this many queries per pass: the scan's last block merges (one launch);
                          * more: a merge kernel, one block per query */
static_assert(TR_BQ_CB - TR_BQ_ROUND >= TR_BQ_MAX_K, "a flush must leave room for a round");
static_assert(TR_BQ_MCB - 2048 >= TR_BQ_MAX_K, "merge flush must leave room for a round");

struct BatchQuery {
    unsigned long long ns_hash;
    long long *oid;           /* where the k ids go: the slot's result area (registered segment) */
    float *osc;               /* or the pinned mapped result buffer; same for the k scores */
    unsigned k;
    int filter;
};

struct BatchParams {
    const uint4 *X;
    const int64_t *ids;
    const uint64_t *ns;
    const uint4 *q;           /* device copy of the f16 queries (nq x nvec) unless inline */
    float *part_s;            /* [TR_BQ_MAX][grid][TR_BQ_MAX_K] */
    long long *part_id;
    unsigned *part_n;         /* [TR_BQ_MAX][grid] */
    unsigned *out_hits;       /* mapped host memory, query i at i */
    unsigned *done;           /* fused merge: ticket counter, reset by the last block */
    unsigned long long rows;
    unsigned long long rows_per_block;
    unsigned nvec, nchunk, qstride, nq, any_filter;
    unsigned backward;        /* scan each block's rounds last to first (alternates per pass: batch_params_init) */
    BatchQuery bq[TR_BQ_MAX];
};

template <int N>
struct BatchInline {
    uint4 v[N];
};

/* ------------------------------------------------------------------------------------------ */
/* the scan of the int8 codes and its re-rank (code_scan.cuh; --codes int8, codes.h for the bounds)           */

#define TR_CODE_MAX_K 32      /* a block's threshold is the k-th of its lanes' best lower bounds: k <= 32 */
#define TR_CODE_CB 256        /* per query and scan block: candidates (lower bound, upper bound, row) */
#define TR_CODE_FLAT 32768    /* per query and pass: candidates the scan blocks leave for the merge */
#define TR_CODE_ACAP 2048     /* per query, in the merge: candidates whose upper bound reaches the blocks' bound */
#define TR_CODE_RANK 256      /* ... whose lower bounds are ranked for the exact k-th (more: the blocks' bound) */
#define TR_CODE_RCAP 1024     /* ... and re-scored from the f16 rows (more: the query fails over to the f16 scan) */
#define TR_CODE_FAIL 0xFFFFFFFFu /* out_hits of a query the codes could not answer: the host runs the f16 scan */
static_assert(TR_CODE_CB - TR_BQ_ROUND >= TR_CODE_MAX_K, "a selection must leave room for a round");

struct CodeQuery {
    unsigned long long ns_hash;
    long long *oid;           /* where the k ids go (as BatchQuery) */
    float *osc;
    float qbound;             /* |q16| (1 + 2^-18), rounded up: a row's bound is qbound x its bound_r */
    unsigned k;
    int filter;
};

/* A pass's shared state in device memory: zero before every launch (the fused kernel's last block, or a memset
 * after the separate merge, leaves it so). */
struct CodeState {
    unsigned count[TR_BQ_MAX];  /* candidates in the flat list */
    unsigned bound[TR_BQ_MAX];  /* the best block threshold, as an ordered key (code_key; 0: none yet) */
    unsigned abort;             /* a block's candidates overflowed: every query of the pass fails over */
    unsigned done;              /* fused merge: ticket counter */
};

/* The merge's dynamic shared memory (code_merge_layout): the candidates, the lower bounds ranked, the rows re-scored
 * with their scores and ids, and the query's f16 (nvec uint4). */
__host__ __device__ inline size_t code_merge_smem(unsigned nvec) {
    return (size_t)TR_CODE_ACAP * 16 + (size_t)TR_CODE_RANK * 4 + (size_t)TR_CODE_RCAP * (8 + 4 + 8) +
           (size_t)nvec * 16 + 64;
}

struct CodeParams {
    const uint4 *C;           /* rows x cvec: the codes, 16 a uint4 (code_scan.cuh says the order) */
    const float2 *meta;       /* per row: scale, bound_r (codes.h) */
    const uint4 *X;           /* rows x nvec: the f16 rows, for the re-rank */
    const int64_t *ids;
    const uint64_t *ns;
    const uint4 *q;           /* nq x nvec f16 queries (device) */
    float4 *flat;             /* [TR_BQ_MAX][TR_CODE_FLAT]: lower bound, upper bound, row (two words) */
    float *best;              /* [TR_BQ_MAX][TR_CUDA_MAX_GRID]: each block's best lower bound (-inf: none) */
    CodeState *state;
    unsigned *out_hits;       /* query i at i (mapped host memory) */
    unsigned long long rows;
    unsigned long long rows_per_block;
    unsigned nvec, nchunk16;  /* f16 row: uint4, and chunks of 4 uint4 (the f16 scan's) */
    unsigned cvec, cchunk;    /* code row: uint4 (a multiple of 4), and chunks of 4 uint4 */
    unsigned qstride;         /* staged query row: 2 cvec + 1 uint4 */
    unsigned nq, any_filter, backward;
    CodeQuery cq[TR_BQ_MAX];
};

/* --cuda-profile: each block of the persistent kernel adds up where its part of a batch goes
 * (clock64 between barriers, so per block and exact; one %globaltimer total per batch calibrates them),
 * and the sidecar logs the means at each stop: which part of a small tier's scan is fixed cost. */
enum {
    TR_PH_STAGE,      /* go seen -> parameters and queries staged (block 0: the mailbox over PCIe) */
    TR_PH_ROUND1,     /* -> first round scored and admitted */
    TR_PH_ROUNDS,     /* -> every further round (and its selections) */
    TR_PH_LISTS,      /* -> final selection and partial lists written */
    TR_PH_FENCE,      /* -> the ticket's release fence */
    TR_PH_TICKET,     /* -> the ticket's atomic returned */
    TR_PH_CYCLES,     /* go seen -> ticket, in cycles, and ... */
    TR_PH_NS,         /* ... in ns (%globaltimer): the clock of the other phases */
    TR_PH_GO_NS,      /* block 0 raised go -> this block saw it (ns; 0 for block 0) */
    TR_PH_COUNT,      /* batches added up */
    TR_PH_SLOTS
};

/* ------------------------------------------------------------------------------------------ */
/* the persistent kernel's hand-over (persist_kernel.cuh: the kernel; persist.cu: the host side)  */

#define TR_PERSIST_SEQ_MASK 0xFFFFFFu /* seq lives in the top 24 bits of the message tag and of go; 0 is never used */

struct alignas(16) PersistReq {
    unsigned nq, G, profile, pad1;     /* profile: stamp the stages into mb->stamp (--cuda-profile) */
    BatchParams p;
};

/* The message: the PersistReq and then nq rows of nvec uint4 of f16 queries, as a stream of 32-bit words cut
 * into 12-byte pieces, each sent in a chunk whose fourth word is the tag. Block 0 polls the chunks themselves: one
 * PCIe round trip before go, where polling a word and then reading the batch takes two. The tag in every chunk
 * is what makes that safe: reads of separate words may be served in any order, so a batch read beside a word
 * read could be older than the word. */
#define TR_MSG_HEAD TR_CUDA_BLOCK /* chunks block 0 polls at most, one per thread: the parameters and one query of
                                   * up to 1,216 dims; the rest of a longer message is read once the head is there */
#define TR_MSG_LOADS 8            /* ... in rounds of this many chunks per thread */
static_assert((TR_MSG_HEAD * 3 - sizeof(PersistReq) / 4) * 2 == 1216, "say how many dims the head carries");
__host__ __device__ inline unsigned persist_msg_words(unsigned nq, unsigned nvec) {
    return (unsigned)(sizeof(PersistReq) / 4) + nq * nvec * 4u;
}
__host__ __device__ inline unsigned persist_msg_chunks(unsigned nq, unsigned nvec) {
    return (persist_msg_words(nq, nvec) + 2u) / 3u;
}

struct PersistMailbox {
    alignas(128) unsigned word;        /* host -> device, the rounds build (tiers past the one-trip limit): seq << 8 | nq (nq = 0:
                                        * stop), after req and the queries */
    alignas(128) unsigned done_seq;    /* device -> host: the last seq answered */
    unsigned hits[TR_BQ_MAX];          /* device -> host: hits per query of that batch */
    unsigned long long stamp[4];       /* device -> host (profile): %globaltimer at message seen, go (the tagged
                                        * builds: block 0's relay written), last
                                        * ticket, done */
    unsigned long long merge_stamp[3]; /* device -> host (profile, merged by the last block): %globaltimer
                                        * after the merge's bounds, after its candidates; candidates kept */
    alignas(128) PersistReq req;       /* host -> device, the rounds build (tiers past the one-trip limit) */
    /* then TR_BQ_MAX x nvec uint4 of f16 queries (those builds), then the tagged message (the others):
     * max(TR_MSG_HEAD, persist_msg_chunks(TR_BQ_MAX, nvec)) uint4 (persist_msg_area) */
};
__host__ __device__ inline uint4 *persist_msg_area(PersistMailbox *mb, unsigned nvec) {
    return reinterpret_cast<uint4 *>(mb + 1) + (size_t)TR_BQ_MAX * nvec;
}

struct PersistCtl {                    /* device memory, zeroed before each launch */
    unsigned go;                       /* the rounds build (tiers past the one-trip limit): seq of the batch copied into dreq/dq */
    unsigned ticket;                   /* scan tickets (atomicInc wraps it back to 0) */
    unsigned merge_go;                 /* seq whose per-query merges may start */
    unsigned merge_ticket;
    unsigned long long go_ns;          /* profile: %globaltimer when block 0 raised go */
    /* the split build's row cache (RowCache), set by persist_start: where it starts in the dynamic shared memory
     * (uint4), how many rows it holds (0: off) and their stride (uint4) */
    unsigned cache_off, cache_rows, cache_stride;
};

__host__ __device__ inline unsigned persist_next_seq(unsigned s) {
    return (s & TR_PERSIST_SEQ_MASK) == TR_PERSIST_SEQ_MASK ? 1u : (s & TR_PERSIST_SEQ_MASK) + 1u;
}
#endif
