/* The CPU encoder's kernels (kernels.h). A matrix product is register-blocked as 8 rows x 48 columns: 24 int32
 * accumulators, three registers of weights and one of four broadcast inputs, so the loop is bound by vpdpbusd. */
#include "kernels.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

enum { BLOCK_ROWS = 8, BLOCK_PANELS = TR_COLUMN_BLOCK / TR_LANES, QUERY_GROUP = 4 };
_Static_assert(TR_HIDDEN % TR_COLUMN_BLOCK == 0 && TR_FFN % TR_COLUMN_BLOCK == 0, "column blocks");
_Static_assert(BLOCK_PANELS == 3, "the blocks below name three panels");
_Static_assert(TR_HEAD_DIM == 2 * TR_LANES, "a head is two registers");

TR_VNNI void tr_quantize_rows(const float *x, int rows, int width, uint8_t *q, float *scale, int32_t *zero) {
    for (int r = 0; r < rows; ++r) {
        const float *row = x + (size_t)r * width;
        __m512 low = _mm512_setzero_ps(), high = _mm512_setzero_ps();
        for (int c = 0; c < width; c += TR_LANES) {
            __m512 v = _mm512_loadu_ps(row + c);
            low = _mm512_min_ps(low, v), high = _mm512_max_ps(high, v);
        }
        float lo = _mm512_reduce_min_ps(low), hi = _mm512_reduce_max_ps(high);
        float step = (hi - lo) / 255.0f;
        if (!(step > 0.0f) || !isfinite(step)) step = 1.0f;
        int z = (int)lrintf(-lo / step);
        z = z < 0 ? 0 : z > 255 ? 255 : z;
        scale[r] = step, zero[r] = z;
        const __m512 inverse = _mm512_set1_ps(1.0f / step);
        const __m512i offset = _mm512_set1_epi32(z), top = _mm512_set1_epi32(255), bottom = _mm512_setzero_si512();
        uint8_t *out = q + (size_t)r * width;
        for (int c = 0; c < width; c += TR_LANES) {
            __m512i v = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(row + c), inverse)), offset);
            v = _mm512_min_epi32(_mm512_max_epi32(v, bottom), top);
            _mm_storeu_si128((__m128i *)(out + c), _mm512_cvtepi32_epi8(v));
        }
    }
}

/* One output: the exact int32 sum less the zero point's share, scaled by the row's and the column's steps, plus bias. */
TR_VNNI static inline __m512 dequantized(__m512i sum, int32_t zero, float step, const tr_matrix *m, int column) {
    const __m512i exact = _mm512_sub_epi32(sum, _mm512_mullo_epi32(_mm512_set1_epi32(zero),
                                                                   _mm512_loadu_si512(m->column_sums + column)));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_mul_ps(_mm512_set1_ps(step), _mm512_loadu_ps(m->scale + column)),
                           _mm512_loadu_ps(m->bias + column));
}

/* 24 named accumulators: compilers keep an array of them in memory, and the block would wait on it */
#define ROW_ACCUMULATORS(i) __m512i acc##i##_0 = _mm512_setzero_si512(), acc##i##_1 = acc##i##_0, acc##i##_2 = acc##i##_0;
#define ROW_PRODUCTS(i)                                                                                                \
    {                                                                                                                  \
        int32_t four;                                                                                                  \
        memcpy(&four, a + (size_t)(i) * in + k, sizeof four);                                                          \
        const __m512i x = _mm512_set1_epi32(four);                                                                     \
        acc##i##_0 = _mm512_dpbusd_epi32(acc##i##_0, x, w0);                                                           \
        acc##i##_1 = _mm512_dpbusd_epi32(acc##i##_1, x, w1);                                                           \
        acc##i##_2 = _mm512_dpbusd_epi32(acc##i##_2, x, w2);                                                           \
    }

/* One register block: `count` rows (BLOCK_ROWS, or half of it for the last rows) from r0 by the column block at c0,
 * whose three weight panels are b0. Always inlined with a constant count, so the rows it does not have vanish. */
TR_VNNI static inline __attribute__((always_inline)) void row_block(const tr_matrix *m, const uint8_t *q,
                                                                    const float *scale, const int32_t *zero,
                                                                    float *out, int r0, int c0, const int8_t *b0,
                                                                    const int count) {
    const int in = m->in;
    const size_t panel_bytes = (size_t)in * TR_LANES;
    const int8_t *b1 = b0 + panel_bytes, *b2 = b1 + panel_bytes;
    ROW_ACCUMULATORS(0) ROW_ACCUMULATORS(1) ROW_ACCUMULATORS(2) ROW_ACCUMULATORS(3)
    ROW_ACCUMULATORS(4) ROW_ACCUMULATORS(5) ROW_ACCUMULATORS(6) ROW_ACCUMULATORS(7)
    const uint8_t *a = q + (size_t)r0 * in;
    for (int k = 0; k < in; k += 4) {
        const __m512i w0 = _mm512_load_si512(b0 + (size_t)k * TR_LANES),
                      w1 = _mm512_load_si512(b1 + (size_t)k * TR_LANES),
                      w2 = _mm512_load_si512(b2 + (size_t)k * TR_LANES);
        ROW_PRODUCTS(0) ROW_PRODUCTS(1) ROW_PRODUCTS(2) ROW_PRODUCTS(3)
        if (count > 4) {
            ROW_PRODUCTS(4) ROW_PRODUCTS(5) ROW_PRODUCTS(6) ROW_PRODUCTS(7)
        }
    }
    const __m512i acc[BLOCK_ROWS][BLOCK_PANELS] = {
        {acc0_0, acc0_1, acc0_2}, {acc1_0, acc1_1, acc1_2}, {acc2_0, acc2_1, acc2_2}, {acc3_0, acc3_1, acc3_2},
        {acc4_0, acc4_1, acc4_2}, {acc5_0, acc5_1, acc5_2}, {acc6_0, acc6_1, acc6_2}, {acc7_0, acc7_1, acc7_2}};
    /* the column constants are read here, not held across the loop: the loop needs 28 of the 32 registers */
    for (int i = 0; i < count; ++i)
        for (int j = 0; j < BLOCK_PANELS; ++j)
            _mm512_storeu_ps(out + (size_t)(r0 + i) * m->out + c0 + j * TR_LANES,
                             dequantized(acc[i][j], zero[r0 + i], scale[r0 + i], m, c0 + j * TR_LANES));
}

TR_VNNI void tr_multiply(const tr_matrix *m, const uint8_t *q, const float *scale, const int32_t *zero, int rows,
                         float *out, int first_block, int blocks) {
    const size_t panel_bytes = (size_t)m->in * TR_LANES;
    const int blocked = rows / BLOCK_ROWS * BLOCK_ROWS;
    for (int c0 = first_block * TR_COLUMN_BLOCK; c0 < (first_block + blocks) * TR_COLUMN_BLOCK; c0 += TR_COLUMN_BLOCK) {
        const int8_t *panels = m->packed + (size_t)(c0 / TR_LANES) * panel_bytes;
        for (int r0 = 0; r0 < blocked; r0 += BLOCK_ROWS) row_block(m, q, scale, zero, out, r0, c0, panels, BLOCK_ROWS);
        if (blocked < rows) /* the last four rows (the caller pads rows to a multiple of four) */
            row_block(m, q, scale, zero, out, blocked, c0, panels, BLOCK_ROWS / 2);
    }
}

TR_VNNI void tr_norm_rows(const float *x, const float *residual, int rows, const float *gamma, const float *beta,
                           float eps, float *out) {
    enum { CHUNKS = TR_HIDDEN / TR_LANES };
    for (int r = 0; r < rows; ++r) {
        __m512 v[CHUNKS], total = _mm512_setzero_ps();
        const float *row = x + (size_t)r * TR_HIDDEN;
        for (int c = 0; c < CHUNKS; ++c) {
            v[c] = _mm512_loadu_ps(row + c * TR_LANES);
            if (residual) v[c] = _mm512_add_ps(v[c], _mm512_loadu_ps(residual + (size_t)r * TR_HIDDEN + c * TR_LANES));
            total = _mm512_add_ps(total, v[c]);
        }
        const __m512 mean = _mm512_set1_ps(_mm512_reduce_add_ps(total) / TR_HIDDEN);
        __m512 squares = _mm512_setzero_ps();
        for (int c = 0; c < CHUNKS; ++c) {
            v[c] = _mm512_sub_ps(v[c], mean);
            squares = _mm512_fmadd_ps(v[c], v[c], squares);
        }
        const __m512 inverse = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(squares) / TR_HIDDEN + eps));
        float *target = out + (size_t)r * TR_HIDDEN;
        for (int c = 0; c < CHUNKS; ++c)
            _mm512_storeu_ps(target + c * TR_LANES, _mm512_fmadd_ps(_mm512_mul_ps(v[c], inverse),
                                                                 _mm512_loadu_ps(gamma + c * TR_LANES),
                                                                 _mm512_loadu_ps(beta + c * TR_LANES)));
    }
}

/* e^x to about 2 ulp over float32's range (Cephes' expf polynomial; ldexp by vscalefps). */
TR_VNNI static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)), _mm512_set1_ps(-88.3762626647949f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, n);
}

/* erf(x) to about 1e-7 absolute (the rational approximation Eigen's float erf uses; exactly +-1 past |x| = 4). */
TR_VNNI static inline __m512 erf16(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(4.0f)), _mm512_set1_ps(-4.0f));
    const __m512 x2 = _mm512_mul_ps(x, x);
    __m512 p = _mm512_set1_ps(-2.72614225801306e-10f);
    p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(2.77068142495902e-08f));
    p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(-2.10102402082508e-06f));
    p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(-5.69250639462346e-05f));
    p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(-7.34990630326855e-04f));
    p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(-2.95459980854025e-03f));
    p = _mm512_fmadd_ps(x2, p, _mm512_set1_ps(-1.60960333262415e-02f));
    p = _mm512_mul_ps(x, p);
    __m512 d = _mm512_set1_ps(-1.45660718464996e-05f);
    d = _mm512_fmadd_ps(x2, d, _mm512_set1_ps(-2.13374055278905e-04f));
    d = _mm512_fmadd_ps(x2, d, _mm512_set1_ps(-1.68282697438203e-03f));
    d = _mm512_fmadd_ps(x2, d, _mm512_set1_ps(-7.37332916720468e-03f));
    d = _mm512_fmadd_ps(x2, d, _mm512_set1_ps(-1.42647390514189e-02f));
    return _mm512_div_ps(p, d);
}

TR_VNNI void tr_gelu(float *x, int rows, int width, int c0, int columns) {
    const __m512 half = _mm512_set1_ps(0.5f), root_half = _mm512_set1_ps(0.70710678118654752f),
                 one = _mm512_set1_ps(1.0f);
    for (int r = 0; r < rows; ++r) {
        float *row = x + (size_t)r * width + c0;
        for (int c = 0; c < columns; c += TR_LANES) {
            const __m512 v = _mm512_loadu_ps(row + c);
            const __m512 e = erf16(_mm512_mul_ps(v, root_half));
            _mm512_storeu_ps(row + c, _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, e)));
        }
    }
}

static int padded_tokens(int tokens) { return (tokens + TR_LANES - 1) / TR_LANES * TR_LANES; }

size_t tr_attention_work(int tokens) {
    return ((size_t)TR_HEAD_DIM + QUERY_GROUP + 1) * (size_t)padded_tokens(tokens);
}

/* Queries are taken QUERY_GROUP at a time, so that each key and value loaded serves four of them; each query's sums
 * run in the same order as one at a time would run them. */
TR_VNNI void tr_attend(const float *qkv, const int32_t *mask, int b, int h, int tokens, float *ctx, float *work) {
    const int padded = padded_tokens(tokens);
    float *keys = work, *scores = keys + (size_t)TR_HEAD_DIM * padded, *bias = scores + (size_t)QUERY_GROUP * padded;
    const __m512 scaled = _mm512_set1_ps(1.0f / sqrtf((float)TR_HEAD_DIM)), none = _mm512_set1_ps(-INFINITY);
    const float *text = qkv + (size_t)b * tokens * TR_QKV_WIDTH;
    for (int j = 0; j < padded; ++j) bias[j] = j < tokens && mask[(size_t)b * tokens + j] ? 0.0f : -INFINITY;
    /* the keys transposed (head dimension by token), so that a query's scores come 16 at a time */
    for (int d = 0; d < TR_HEAD_DIM; ++d) {
        float *row = keys + (size_t)d * padded;
        for (int j = 0; j < tokens; ++j) row[j] = text[(size_t)j * TR_QKV_WIDTH + TR_HIDDEN + h * TR_HEAD_DIM + d];
        for (int j = tokens; j < padded; ++j) row[j] = 0.0f;
    }
    for (int i = 0; i < tokens; i += QUERY_GROUP) {
        const float *query[QUERY_GROUP];
        for (int r = 0; r < QUERY_GROUP; ++r) /* past the last query, the last again, its answer not kept */
            query[r] = text + (size_t)(i + r < tokens ? i + r : tokens - 1) * TR_QKV_WIDTH + h * TR_HEAD_DIM;
        __m512 top[QUERY_GROUP];
        for (int r = 0; r < QUERY_GROUP; ++r) top[r] = none;
        for (int c = 0; c < padded; c += TR_LANES) {
            __m512 sum[QUERY_GROUP];
            for (int r = 0; r < QUERY_GROUP; ++r) sum[r] = _mm512_setzero_ps();
            for (int d = 0; d < TR_HEAD_DIM; ++d) {
                const __m512 key = _mm512_loadu_ps(keys + (size_t)d * padded + c);
#pragma GCC unroll 4
                for (int r = 0; r < QUERY_GROUP; ++r) sum[r] = _mm512_fmadd_ps(_mm512_set1_ps(query[r][d]), key, sum[r]);
            }
            for (int r = 0; r < QUERY_GROUP; ++r) {
                const __m512 s = _mm512_add_ps(_mm512_mul_ps(sum[r], scaled), _mm512_loadu_ps(bias + c));
                _mm512_storeu_ps(scores + (size_t)r * padded + c, s);
                top[r] = _mm512_max_ps(top[r], s);
            }
        }
        float inverse[QUERY_GROUP];
        for (int r = 0; r < QUERY_GROUP; ++r) {
            float *row = scores + (size_t)r * padded;
            const __m512 largest = _mm512_set1_ps(_mm512_reduce_max_ps(top[r]));
            __m512 total = _mm512_setzero_ps();
            for (int c = 0; c < padded; c += TR_LANES) {
                const __m512 s = _mm512_loadu_ps(row + c);
                const __mmask16 live = _mm512_cmp_ps_mask(s, none, _CMP_NEQ_OQ);
                const __m512 e = _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(s, largest)));
                _mm512_storeu_ps(row + c, e);
                total = _mm512_add_ps(total, e);
            }
            inverse[r] = 1.0f / _mm512_reduce_add_ps(total);
        }
        __m512 low[QUERY_GROUP], high[QUERY_GROUP];
        for (int r = 0; r < QUERY_GROUP; ++r) low[r] = high[r] = _mm512_setzero_ps();
        for (int j = 0; j < tokens; ++j) {
            const float *value = text + (size_t)j * TR_QKV_WIDTH + 2 * TR_HIDDEN + h * TR_HEAD_DIM;
            const __m512 first = _mm512_loadu_ps(value), second = _mm512_loadu_ps(value + TR_LANES);
#pragma GCC unroll 4
            for (int r = 0; r < QUERY_GROUP; ++r) {
                const __m512 p = _mm512_set1_ps(scores[(size_t)r * padded + j]);
                low[r] = _mm512_fmadd_ps(p, first, low[r]);
                high[r] = _mm512_fmadd_ps(p, second, high[r]);
            }
        }
        for (int r = 0; r < QUERY_GROUP && i + r < tokens; ++r) {
            float *out = ctx + ((size_t)b * tokens + i + r) * TR_HIDDEN + h * TR_HEAD_DIM;
            const __m512 scale = _mm512_set1_ps(inverse[r]);
            _mm512_storeu_ps(out, _mm512_mul_ps(low[r], scale));
            _mm512_storeu_ps(out + TR_LANES, _mm512_mul_ps(high[r], scale));
        }
    }
}
