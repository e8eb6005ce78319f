/* The interface every hot-vector backend (CPU, CUDA) implements: rows of vectors, one exact search. */
#ifndef TR_BACKEND_H
#define TR_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "options.h" /* tr_cuda_options */

#ifdef __cplusplus
extern "C" {
#endif

/* The instructions the CPU backend's scan of the codes uses (--test-cpu-isa; AUTO: the best the CPU has). */
enum tr_cpu_isa { TR_ISA_AUTO = 0, TR_ISA_SCALAR = 1, TR_ISA_AVX2 = 2, TR_ISA_AVX_VNNI = 3, TR_ISA_AVX512_VNNI = 4 };

typedef struct tr_backend_config {
    uint32_t dim;
    uint32_t dtype;      /* tr_dtype */
    uint64_t capacity;   /* rows */
    uint32_t max_k;
    uint32_t threads;    /* CPU worker threads (0 = one per online core) */
    int device;          /* CUDA device ordinal */
    void *segment;       /* the mapped segment (a CUDA backend may register it) */
    uint64_t segment_bytes;
    tr_cuda_options cuda; /* the CUDA backend's options (--cuda-*, and its --test-* flags) */
    uint32_t codes;       /* tr_codes: keep 8-bit codes beside the rows and scan them first (--codes) */
    uint64_t codes_min_rows; /* ... for tiers of at least this many rows (TR_OPT_AUTO: the backend's own) */
    uint32_t cpu_isa;     /* tr_cpu_isa (--test-cpu-isa) */
    /* the header's counters, which the backend moves on (the server's thread only): queries answered through the
     * codes, and those of them whose candidates were too many, answered by the full scan */
    uint64_t *code_scans;
    uint64_t *code_fallbacks;
} tr_backend_config;

/* A backend owns the vector rows [0, rows) plus each row's id and namespace hash, so that it
 * can filter and break ties without asking the store. The store (store.c) decides which row
 * holds which id; backends only write, move and scan rows. Vectors arrive as unit-normalised
 * float32; the backend converts to its dtype. Every call returns 0 or a negative tr_status,
 * with a message in err (errlen bytes) on failure. */
/* One SEARCH request of a batch (search_many): queries are validated and unit-normalised. The
 * server points ids_out/scores_out at the request's result area inside the shared segment
 * (cfg->segment), so a backend that registered the segment may write the results there directly. */
typedef struct tr_search_request {
    const float *queries; /* count x dim float32; read only until search_many/search_submit returns */
    uint32_t count;
    uint32_t k;
    int filter_ns;
    uint64_t ns_hash;
    int64_t *ids_out;     /* count x k (usually inside the segment) */
    float *scores_out;    /* count x k (usually inside the segment) */
    uint32_t hits;        /* out: as search()'s *hits */
    int status;           /* out: 0 or a negative tr_status (then err holds the message) */
} tr_search_request;

typedef struct tr_backend_ops {
    const char *name;
    uint32_t kind; /* tr_backend_kind */
    void *(*create)(const tr_backend_config *cfg, char *err, size_t errlen);
    void (*destroy)(void *self);
    int (*write_rows)(void *self, const uint64_t *rows, uint32_t n, const float *vectors,
                      const int64_t *ids, const uint64_t *ns, char *err, size_t errlen);
    /* Copy row src over row dst (used to keep rows dense after a delete). */
    int (*move_row)(void *self, uint64_t dst, uint64_t src, char *err, size_t errlen);
    /* Rows [0, rows) are live from now on. */
    int (*set_row_count)(void *self, uint64_t rows, char *err, size_t errlen);
    /* Top-k by inner product for each of nq queries (nq x dim float32, unit-normalised).
     * ids_out/scores_out: nq x k; best first, ties by smaller id; *hits = min(k, matching rows). */
    int (*search)(void *self, const float *queries, uint32_t nq, uint32_t k, int filter_ns,
                  uint64_t ns_hash, int64_t *ids_out, float *scores_out, uint32_t *hits,
                  char *err, size_t errlen);
    /* Optional (NULL = the server calls search() per request): answers n requests, possibly in
     * one pass over the rows. Returns 0 when each request's own status says how it went, or a
     * negative tr_status that fails all of them. */
    int (*search_many)(void *self, tr_search_request *reqs, uint32_t n, char *err, size_t errlen);
    /* Optional asynchronous search_many (both or neither). search_submit starts answering n requests
     * and returns once their queries have been consumed (the caller may reuse the query memory);
     * reqs must stay valid, and the caller makes no other backend call, until search_poll has
     * reported the batch done. At most one batch is outstanding. search_poll returns 1 while the
     * batch runs (block = 0), 0 once every request's results, hits and status are in place (also
     * when nothing is outstanding), or a negative tr_status that fails the whole batch. A negative
     * return from search_submit fails the whole batch and leaves nothing outstanding. */
    int (*search_submit)(void *self, tr_search_request *reqs, uint32_t n, char *err, size_t errlen);
    int (*search_poll)(void *self, int block, char *err, size_t errlen);
    /* Optional: the server is about to sleep (no request for --idle-spin-us), or polls for a request a
     * client expects (tr_client_expect): release what only serves a busy store (the CUDA backend stops
     * its persistent kernel). Called again while nothing is held; never with a batch outstanding. */
    void (*idle)(void *self);
} tr_backend_ops;

extern const tr_backend_ops tr_cpu_backend;

/* The CUDA backend is a library of its own (src/cuda/, built as libtrcuda.so), installed beside tr-sidecar and loaded
 * only when --backend cuda asks for it: a sidecar serving from the CPU never maps CUDA code, and one build serves
 * machines with and without a GPU. The library exports the operations table and the layout it was built for. */
#define TR_CUDA_LIBRARY "libtrcuda.so"
#define TR_CUDA_BACKEND_SYMBOL "tr_cuda_backend"
#define TR_CUDA_LAYOUT_SYMBOL "tr_cuda_backend_layout"

#ifdef __cplusplus
}
#endif
#endif
