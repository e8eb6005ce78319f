/* The CPU encoder's kernels (kernels.c): int8 matrix products with AVX-512 VNNI, the per-row quantization they read,
 * layer norm, GELU and one head's attention; encoder.c strings them into the model. */
#ifndef TR_CPU_ENCODER_KERNELS_H
#define TR_CPU_ENCODER_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "tiered_recall/cpu_encoder.h"

/* Only the functions marked so use these instructions: the library loads on any x86-64 CPU and says what it lacks. */
#define TR_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")))

enum {
    TR_HIDDEN = TR_CPU_ENCODER_HIDDEN,
    TR_HEADS = TR_CPU_ENCODER_HEADS,
    TR_HEAD_DIM = TR_CPU_ENCODER_HIDDEN / TR_CPU_ENCODER_HEADS,
    TR_FFN = TR_CPU_ENCODER_FFN,
    TR_QKV_WIDTH = 3 * TR_CPU_ENCODER_HIDDEN,
    TR_LANES = 16,          /* float32 / int32 lanes of one 512-bit register */
    TR_COLUMN_BLOCK = 48,   /* a matrix product's columns per block (three registers), the unit of its tasks */
    TR_ROW_STEP = 4         /* rows are padded to a multiple of this: a product's last row block may be half a block */
};

typedef struct {
    int in, out;
    int8_t *packed;       /* [out / 16][in / 4][16][4]: four consecutive inputs of 16 columns, as vpdpbusd reads them */
    int32_t *column_sums; /* sum of each column's int8 weights: the zero point's share of the product */
    float *scale, *bias;
} tr_matrix;

/* Each row of x (rows x width) as uint8 with its own scale and zero point, the range widened to hold 0 exactly. */
TR_VNNI void tr_quantize_rows(const float *x, int rows, int width, uint8_t *q, float *scale, int32_t *zero);
/* out's column blocks first_block .. first_block + blocks - 1 (rows x m->out, row-major) = the dequantized product of
 * q (rows x m->in) and the matrix, plus bias; rows a multiple of TR_ROW_STEP. */
TR_VNNI void tr_multiply(const tr_matrix *m, const uint8_t *q, const float *scale, const int32_t *zero, int rows,
                         float *out, int first_block, int blocks);
/* out = LayerNorm(x + residual) row by row (residual may be NULL); out may not alias x. */
TR_VNNI void tr_norm_rows(const float *x, const float *residual, int rows, const float *gamma, const float *beta,
                          float eps, float *out);
/* x = 0.5 x (1 + erf(x / sqrt 2)), the model's exact GELU, over columns c0 .. c0 + columns - 1 (multiples of 16) of
 * rows x width. */
TR_VNNI void tr_gelu(float *x, int rows, int width, int c0, int columns);
/* Head h of text b's self-attention over the query / key / value columns of qkv -> its columns of ctx. work: at least
 * tr_attention_work(tokens) floats of the caller's own. */
TR_VNNI void tr_attend(const float *qkv, const int32_t *mask, int b, int h, int tokens, float *ctx, float *work);
size_t tr_attention_work(int tokens);

#endif
