/* The 8-bit codes of the hot rows (--codes int8): how a row and a query are encoded, and the error bound of a score
 * estimated from codes, shared by the CPU and the CUDA backends.
 *
 * A row x (as stored: float32, or the float16 values) is kept beside itself as codes c_j = round(x_j / s) + 128 in
 * [1, 255], with one scale per row s = max_j |x_j| / 127, so x' = s (c - 128) approximates x. Per row the encoder
 * also gives r = |x - x'| and n = |x'| (computed in double, rounded up to float). For a query q, with Q >= |q|:
 *
 *     |q.x - q.x'| <= Q r                                        (Cauchy-Schwarz on the residual)
 *
 * The CPU scans with integer dot products, so it encodes the query too, as two 8-bit terms q' = t1 q1 + t2 q2
 * (the second encodes what the first missed), with E >= |q - q'|: |q.x' - q'.x'| <= E n. Each backend also bounds its
 * own floating-point rounding: of the estimate, and of the full-precision score the answer is ranked by (the CPU's
 * f32 sum over d products errs by at most d 2^-24 relative to sum |q_j x_j| <= Q |x| <= Q (n + r); the tensor cores'
 * f32 accumulation of the CUDA backend is allowed 2^-22 per product, four times the 2^-24 of a correctly rounded
 * sum). Both are covered by TR_CODES_SLACK(d) (Q + E)(n + r) with TR_CODES_SLACK(d) = d 2^-20, twice and more what
 * the two roundings (the estimate's and the score's) need together. So a row's estimate e and its bound b satisfy
 * |score - e| <= b, where score is the value the full scan computes, and every row whose upper bound e + b falls
 * below the k-th largest lower bound e - b is strictly worse than k rows: the rest, re-scored from the rows, hold the
 * exact top k of the full scan (docs/gpu-backend.md, "The codes").
 *
 * Per row the backends keep (float, rounded up): bound_r = r + slack (n + r) and bound_n = n + slack (n + r), so that
 * the bound is (Q bound_r + E bound_n) (1 + 2^-18): the last factor covers the rounding of that sum itself and of the
 * comparisons of e + b with e - b.
 */
#ifndef TR_CODES_H
#define TR_CODES_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TR_CODES_ZERO 128u /* the code of 0 */
#define TR_CODES_BOUND_FACTOR (1.0f + 1.0f / 262144.0f) /* 1 + 2^-18 */
/* the allowance for the floating-point rounding of the estimate and of the full scan's score, per unit of
 * (Q + E)(n + r) (the header's comment says why) */
#define TR_CODES_SLACK(d) ((double)(d) * (1.0 / 1048576.0))

typedef struct tr_code_row {
    float scale;   /* s: x' = s (c - 128) */
    float bound_r; /* r + slack (n + r), rounded up */
    float bound_n; /* n + slack (n + r), rounded up */
} tr_code_row;

/* Encodes one row of d values (x: the stored values as float) into codes[0, d) and its tr_code_row. */
void tr_codes_encode_row(const float *x, uint32_t d, uint8_t *codes, tr_code_row *row);

/* The CPU's query: two signed 8-bit terms over dpad dimensions (zero past d), their scales, the sums of their codes
 * (the scan adds 128 to each row code, which these take back out), Q >= |q| and E >= |q - q'|. */
typedef struct tr_code_query {
    float t1, t2;     /* scales of the terms */
    int32_t sum1, sum2; /* sums of the terms' codes */
    float qnorm;      /* Q */
    float qerr;       /* E */
} tr_code_query;
void tr_codes_encode_query(const float *q, uint32_t d, uint32_t dpad, int8_t *q1, int8_t *q2, tr_code_query *out);

/* The float nearest above v (v itself when v is a float). */
float tr_codes_round_up(double v);

#ifdef __cplusplus
}
#endif
#endif
