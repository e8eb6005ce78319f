/* The CPU backend's 8-bit codes: kept in blocks of 16 rows, scanned with the integer dot products the CPU has.
 *
 * Layout: rows in blocks of TR_CODE_BLOCK; inside a block, for each group of 4 dimensions, the 16 rows' 4 codes side
 * by side (64 bytes): one 512-bit load holds a group of every row of the block, and one dot-product instruction
 * with the query's 4 codes of that group broadcast adds it to the 16 rows' sums at once (no sums across lanes). */
#ifndef TR_CPU_CODES_H
#define TR_CPU_CODES_H

#include <stddef.h>
#include <stdint.h>

#include "codes.h"
#include "topk.h"

#define TR_CODE_BLOCK 16u

typedef struct tr_cpu_codes {
    uint32_t dim;
    uint32_t dpad;        /* dim rounded up to 64: codes per row in a block */
    uint64_t capacity;    /* rows */
    uint32_t isa;         /* tr_cpu_isa in use (never AUTO) */
    uint8_t *codes;       /* ceil(capacity / 16) blocks of 16 x dpad */
    float *scale;         /* per row: tr_code_row's fields, as arrays so a block's 16 load at once */
    float *bound_r;
    float *bound_n;
} tr_cpu_codes;

/* isa: tr_cpu_isa asked (AUTO: the best this CPU has); one the CPU lacks is refused, the message naming the flag. */
int tr_cpu_codes_init(tr_cpu_codes *c, uint32_t dim, uint64_t capacity, uint32_t isa, char *err, size_t errlen);
void tr_cpu_codes_free(tr_cpu_codes *c);
const char *tr_cpu_isa_name(uint32_t isa);
/* Encodes row `row` from its stored values (as float). */
void tr_cpu_codes_write(tr_cpu_codes *c, uint64_t row, const float *x);
void tr_cpu_codes_move(tr_cpu_codes *c, uint64_t dst, uint64_t src);

/* A row that may still be in the top k: its upper bound, or its exact score when it was scored from the row. */
typedef struct tr_code_cand {
    uint64_t row;
    float hi;
    int exact; /* hi is the row's score (a filtered block with few matching rows was scored from the rows) */
} tr_code_cand;

/* One worker's scan of one query over a range of blocks. */
typedef struct tr_codes_scan {
    const tr_cpu_codes *codes;
    const uint64_t *ns;       /* row -> namespace hash */
    int filter_ns;
    uint64_t ns_hash;
    const int8_t *q1, *q2;    /* the query's two terms, dpad codes each */
    tr_code_query qc;
    uint32_t exact_max;       /* a filtered block with at most this many matching rows is scored from its rows */
    float (*score)(void *ctx, uint64_t row); /* the full scan's score of a row */
    void *score_ctx;
    int *abort;               /* set (relaxed) by a worker whose candidates overflow: every worker stops */
    /* state: the k best lower bounds seen (ids: rows), the candidates */
    tr_topk heap;
    tr_code_cand *cand;
    uint32_t ncand, cap;
} tr_codes_scan;

/* Scans blocks [block_start, block_end) of a tier of `rows` rows. Returns 0, or 1 when the candidates overflowed
 * (or another worker's did): the query is then answered by the full scan. */
int tr_codes_scan_blocks(tr_codes_scan *s, uint64_t block_start, uint64_t block_end, uint64_t rows);

#endif
