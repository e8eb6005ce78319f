/* The CPU backend's 8-bit codes: storage in blocks of 16 rows, the integer dot products of a block (AVX-512 VNNI,
 * AVX-VNNI, AVX2 or plain C, chosen at start), and one worker's scan of a query with its bounds and candidates.
 *
 * Every kernel computes the same integers (the signed codes' dot products with the query's two 8-bit terms), so
 * which one runs changes the speed, never a candidate or an answer. */
#include "cpu_codes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h" /* tr_cpu_isa */
#include "tiered_recall/layout.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

typedef void (*dots_fn)(const uint8_t *blk, const int8_t *q1, const int8_t *q2, uint32_t groups, int32_t sum1,
                        int32_t sum2, int32_t *o1, int32_t *o2);

static inline int32_t word_at(const int8_t *q, uint32_t g) {
    int32_t w;
    memcpy(&w, q + 4u * g, sizeof w);
    return w;
}

/* The signed codes' dot products of a block's 16 rows with the two terms, in plain C. */
static inline void dots_scalar(const uint8_t *blk, const int8_t *q1, const int8_t *q2, uint32_t groups, int32_t sum1,
                        int32_t sum2, int32_t *o1, int32_t *o2) {
    (void)sum1; (void)sum2;
    for (uint32_t l = 0; l < TR_CODE_BLOCK; l++) {
        int32_t a1 = 0, a2 = 0;
        for (uint32_t g = 0; g < groups; g++) {
            const uint8_t *x = blk + 64u * g + 4u * l;
            for (uint32_t b = 0; b < 4; b++) {
                const int32_t v = (int32_t)x[b] - (int32_t)TR_CODES_ZERO;
                a1 += v * q1[4u * g + b];
                a2 += v * q2[4u * g + b];
            }
        }
        o1[l] = a1;
        o2[l] = a2;
    }
}

#if defined(__x86_64__)
/* vpdpbusd adds unsigned codes times signed query bytes: each row's sum carries 128 times the term's codes' sum,
 * taken out at the end. groups is a multiple of 16 (dpad / 4), so unrolling by 4 needs no tail. */
__attribute__((target("avx512f,avx512bw,avx512vnni")))
static inline void dots_avx512_vnni(const uint8_t *blk, const int8_t *q1, const int8_t *q2, uint32_t groups,
                                    int32_t sum1, int32_t sum2, int32_t *o1, int32_t *o2) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (uint32_t g = 0; g < groups; g += 4) {
        const uint8_t *x = blk + 64u * g;
        const __m512i x0 = _mm512_loadu_si512((const void *)x), x1 = _mm512_loadu_si512((const void *)(x + 64));
        const __m512i x2 = _mm512_loadu_si512((const void *)(x + 128)), x3 = _mm512_loadu_si512((const void *)(x + 192));
        a0 = _mm512_dpbusd_epi32(a0, x0, _mm512_set1_epi32(word_at(q1, g)));
        b0 = _mm512_dpbusd_epi32(b0, x0, _mm512_set1_epi32(word_at(q2, g)));
        a1 = _mm512_dpbusd_epi32(a1, x1, _mm512_set1_epi32(word_at(q1, g + 1)));
        b1 = _mm512_dpbusd_epi32(b1, x1, _mm512_set1_epi32(word_at(q2, g + 1)));
        a2 = _mm512_dpbusd_epi32(a2, x2, _mm512_set1_epi32(word_at(q1, g + 2)));
        b2 = _mm512_dpbusd_epi32(b2, x2, _mm512_set1_epi32(word_at(q2, g + 2)));
        a3 = _mm512_dpbusd_epi32(a3, x3, _mm512_set1_epi32(word_at(q1, g + 3)));
        b3 = _mm512_dpbusd_epi32(b3, x3, _mm512_set1_epi32(word_at(q2, g + 3)));
    }
    const __m512i s1 = _mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3));
    const __m512i s2 = _mm512_add_epi32(_mm512_add_epi32(b0, b1), _mm512_add_epi32(b2, b3));
    _mm512_storeu_si512((void *)o1, _mm512_sub_epi32(s1, _mm512_set1_epi32(128 * sum1)));
    _mm512_storeu_si512((void *)o2, _mm512_sub_epi32(s2, _mm512_set1_epi32(128 * sum2)));
}

/* The same with 256-bit registers (AVX-VNNI): rows 0-7 of a group in its first 32 bytes, 8-15 in the next. */
__attribute__((target("avx2,avxvnni")))
static inline void dots_avx_vnni(const uint8_t *blk, const int8_t *q1, const int8_t *q2, uint32_t groups,
                                 int32_t sum1, int32_t sum2, int32_t *o1, int32_t *o2) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (uint32_t g = 0; g < groups; g += 2) {
        const uint8_t *x = blk + 64u * g;
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)x), h0 = _mm256_loadu_si256((const __m256i *)(x + 32));
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(x + 64));
        const __m256i h1 = _mm256_loadu_si256((const __m256i *)(x + 96));
        const __m256i u0 = _mm256_set1_epi32(word_at(q1, g)), v0 = _mm256_set1_epi32(word_at(q2, g));
        const __m256i u1 = _mm256_set1_epi32(word_at(q1, g + 1)), v1 = _mm256_set1_epi32(word_at(q2, g + 1));
        a0 = _mm256_dpbusd_avx_epi32(a0, l0, u0);
        a1 = _mm256_dpbusd_avx_epi32(a1, h0, u0);
        b0 = _mm256_dpbusd_avx_epi32(b0, l0, v0);
        b1 = _mm256_dpbusd_avx_epi32(b1, h0, v0);
        a2 = _mm256_dpbusd_avx_epi32(a2, l1, u1);
        a3 = _mm256_dpbusd_avx_epi32(a3, h1, u1);
        b2 = _mm256_dpbusd_avx_epi32(b2, l1, v1);
        b3 = _mm256_dpbusd_avx_epi32(b3, h1, v1);
    }
    const __m256i c1 = _mm256_set1_epi32(128 * sum1), c2 = _mm256_set1_epi32(128 * sum2);
    _mm256_storeu_si256((__m256i *)o1, _mm256_sub_epi32(_mm256_add_epi32(a0, a2), c1));
    _mm256_storeu_si256((__m256i *)(o1 + 8), _mm256_sub_epi32(_mm256_add_epi32(a1, a3), c1));
    _mm256_storeu_si256((__m256i *)o2, _mm256_sub_epi32(_mm256_add_epi32(b0, b2), c2));
    _mm256_storeu_si256((__m256i *)(o2 + 8), _mm256_sub_epi32(_mm256_add_epi32(b1, b3), c2));
}

/* AVX2 without VNNI: vpmaddubsw multiplies unsigned by signed bytes and adds pairs into 16 bits, saturating. With
 * |q| as the unsigned side and the signed code times the sign of q as the signed one, a pair is at most
 * 2 x 127 x 127 < 2^15: never saturates. vpmaddwd then adds the pairs into each row's 32 bits. */
__attribute__((target("avx2")))
static inline __m256i avx2_term(__m256i acc, __m256i xs, __m256i w, __m256i ones) {
    const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xs, w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
}

__attribute__((target("avx2")))
static inline void dots_avx2(const uint8_t *blk, const int8_t *q1, const int8_t *q2, uint32_t groups, int32_t sum1,
                      int32_t sum2, int32_t *o1, int32_t *o2) {
    (void)sum1; (void)sum2;
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, b0 = a0, b1 = a0;
    for (uint32_t g = 0; g < groups; g++) {
        const __m256i lo = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 64u * g)), flip);
        const __m256i hi = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 64u * g + 32u)), flip);
        const __m256i w1 = _mm256_set1_epi32(word_at(q1, g)), w2 = _mm256_set1_epi32(word_at(q2, g));
        a0 = avx2_term(a0, lo, w1, ones);
        a1 = avx2_term(a1, hi, w1, ones);
        b0 = avx2_term(b0, lo, w2, ones);
        b1 = avx2_term(b1, hi, w2, ones);
    }
    _mm256_storeu_si256((__m256i *)o1, a0);
    _mm256_storeu_si256((__m256i *)(o1 + 8), a1);
    _mm256_storeu_si256((__m256i *)o2, b0);
    _mm256_storeu_si256((__m256i *)(o2 + 8), b1);
}
#endif

const char *tr_cpu_isa_name(uint32_t isa) {
    switch (isa) {
    case TR_ISA_AVX512_VNNI: return "avx512-vnni";
    case TR_ISA_AVX_VNNI: return "avx-vnni";
    case TR_ISA_AVX2: return "avx2";
    case TR_ISA_SCALAR: return "scalar";
    }
    return "auto";
}

static int cpu_has(uint32_t isa) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    switch (isa) {
    case TR_ISA_AVX512_VNNI:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vnni");
    case TR_ISA_AVX_VNNI: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avxvnni");
    case TR_ISA_AVX2: return __builtin_cpu_supports("avx2");
    }
#endif
    return isa == TR_ISA_SCALAR;
}

int tr_cpu_codes_init(tr_cpu_codes *c, uint32_t dim, uint64_t capacity, uint32_t isa, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    if (isa == TR_ISA_AUTO) {
        const uint32_t order[] = {TR_ISA_AVX512_VNNI, TR_ISA_AVX_VNNI, TR_ISA_AVX2, TR_ISA_SCALAR};
        for (int i = 0; i < 4 && isa == TR_ISA_AUTO; i++)
            if (cpu_has(order[i])) isa = order[i];
    } else if (!cpu_has(isa)) {
        snprintf(err, errlen, "--test-cpu-isa %s: this CPU lacks those instructions; use auto or a lower one",
                 tr_cpu_isa_name(isa));
        return -1;
    }
    c->isa = isa;
    c->dim = dim;
    c->dpad = (dim + 63u) & ~63u;
    c->capacity = capacity;
    const uint64_t blocks = (capacity + TR_CODE_BLOCK - 1) / TR_CODE_BLOCK, slots = blocks * TR_CODE_BLOCK;
    c->codes = aligned_alloc(64, blocks ? blocks * TR_CODE_BLOCK * c->dpad : 64);
    c->scale = calloc(slots ? slots : 1, sizeof(float));
    c->bound_r = calloc(slots ? slots : 1, sizeof(float));
    c->bound_n = calloc(slots ? slots : 1, sizeof(float));
    if (!c->codes || !c->scale || !c->bound_r || !c->bound_n) {
        tr_cpu_codes_free(c);
        snprintf(err, errlen, "cannot allocate the codes of %llu rows of dim %u: lower --capacity, or --codes off",
                 (unsigned long long)capacity, dim);
        return -1;
    }
    memset(c->codes, (int)TR_CODES_ZERO, blocks * TR_CODE_BLOCK * c->dpad);
    return 0;
}

void tr_cpu_codes_free(tr_cpu_codes *c) {
    free(c->codes);
    free(c->scale);
    free(c->bound_r);
    free(c->bound_n);
    memset(c, 0, sizeof *c);
}

static uint8_t *row_group(const tr_cpu_codes *c, uint64_t row, uint32_t g) {
    return c->codes + (row / TR_CODE_BLOCK) * TR_CODE_BLOCK * c->dpad + 64u * g + 4u * (row % TR_CODE_BLOCK);
}

void tr_cpu_codes_write(tr_cpu_codes *c, uint64_t row, const float *x) {
    uint8_t codes[TR_MAX_DIM + 64];
    tr_code_row meta;
    tr_codes_encode_row(x, c->dim, codes, &meta);
    memset(codes + c->dim, (int)TR_CODES_ZERO, c->dpad - c->dim);
    for (uint32_t g = 0; g < c->dpad / 4; g++) memcpy(row_group(c, row, g), codes + 4u * g, 4);
    c->scale[row] = meta.scale;
    c->bound_r[row] = meta.bound_r;
    c->bound_n[row] = meta.bound_n;
}

void tr_cpu_codes_move(tr_cpu_codes *c, uint64_t dst, uint64_t src) {
    for (uint32_t g = 0; g < c->dpad / 4; g++) memcpy(row_group(c, dst, g), row_group(c, src, g), 4);
    c->scale[dst] = c->scale[src];
    c->bound_r[dst] = c->bound_r[src];
    c->bound_n[dst] = c->bound_n[src];
}

/* Keeps row as a candidate (lo, hi its bounds, or its exact score twice) and its lower bound among the k best.
 * A full list first drops the rows whose upper bound has fallen below the k-th best lower bound since they came
 * in; if more than half stay, the candidates are too many (rows too alike for 8 bits to tell apart): every
 * worker stops and the full scan answers. */
static int admit(tr_codes_scan *s, uint64_t row, float lo, float hi, int exact, float *thr) {
    if (s->ncand == s->cap) {
        uint32_t m = 0;
        for (uint32_t i = 0; i < s->ncand; i++)
            if (s->cand[i].hi >= *thr) s->cand[m++] = s->cand[i];
        s->ncand = m;
        if (m > s->cap / 2) {
            __atomic_store_n(s->abort, 1, __ATOMIC_RELAXED);
            return 1;
        }
    }
    s->cand[s->ncand++] = (tr_code_cand){row, hi, exact};
    if (lo >= *thr) {
        tr_topk_push(&s->heap, lo, (int64_t)row);
        *thr = tr_topk_floor(&s->heap);
    }
    return 0;
}

/* The scan of blocks [block_start, block_end), inlined into one function per instruction set (below), so that the
 * dot products and the 16 rows' bounds after them are compiled for it. */
static inline __attribute__((always_inline)) int scan_blocks(tr_codes_scan *s, uint64_t block_start,
                                                             uint64_t block_end, uint64_t rows, dots_fn dots) {
    const tr_cpu_codes *c = s->codes;
    const uint32_t groups = c->dpad / 4;
    const float t1 = s->qc.t1, t2 = s->qc.t2, qn = s->qc.qnorm, qe = s->qc.qerr;
    float thr = tr_topk_floor(&s->heap);
    int32_t d1[TR_CODE_BLOCK], d2[TR_CODE_BLOCK];
    float lo[TR_CODE_BLOCK], hi[TR_CODE_BLOCK];
    for (uint64_t blk = block_start; blk < block_end; blk++) {
        if (((blk - block_start) & 63u) == 0 && __atomic_load_n(s->abort, __ATOMIC_RELAXED)) return 1;
        const uint64_t r0 = blk * TR_CODE_BLOCK;
        const uint32_t n = rows - r0 < TR_CODE_BLOCK ? (uint32_t)(rows - r0) : TR_CODE_BLOCK;
        uint32_t mask = n == TR_CODE_BLOCK ? 0xFFFFu : (1u << n) - 1u;
        if (s->filter_ns) {
            uint32_t m = 0;
            for (uint32_t l = 0; l < n; l++) m |= (uint32_t)(s->ns[r0 + l] == s->ns_hash) << l;
            mask = m;
            if (!mask) continue;
            if ((uint32_t)__builtin_popcount(mask) <= s->exact_max) { /* cheaper from the rows themselves */
                while (mask) {
                    const uint32_t l = (uint32_t)__builtin_ctz(mask);
                    mask &= mask - 1;
                    const float sc = s->score(s->score_ctx, r0 + l);
                    if (admit(s, r0 + l, sc, sc, 1, &thr)) return 1;
                }
                continue;
            }
        }
        const uint8_t *codes = c->codes + blk * TR_CODE_BLOCK * c->dpad;
        __builtin_prefetch(codes + TR_CODE_BLOCK * c->dpad, 0, 0);
        dots(codes, s->q1, s->q2, groups, s->qc.sum1, s->qc.sum2, d1, d2);
        const float *scale = c->scale + r0, *br = c->bound_r + r0, *bn = c->bound_n + r0;
        uint32_t pass = 0;
        for (uint32_t l = 0; l < TR_CODE_BLOCK; l++) {
            const float est = scale[l] * ((float)d1[l] * t1 + (float)d2[l] * t2);
            const float err = (qn * br[l] + qe * bn[l]) * TR_CODES_BOUND_FACTOR;
            hi[l] = est + err;
            lo[l] = est - err;
            pass |= (uint32_t)(hi[l] >= thr) << l;
        }
        pass &= mask;
        while (pass) {
            const uint32_t l = (uint32_t)__builtin_ctz(pass);
            pass &= pass - 1;
            if (admit(s, r0 + l, lo[l], hi[l], 0, &thr)) return 1;
        }
    }
    return 0;
}

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bw,avx512vnni")))
static int scan_avx512_vnni(tr_codes_scan *s, uint64_t b0, uint64_t b1, uint64_t rows) {
    return scan_blocks(s, b0, b1, rows, dots_avx512_vnni);
}
__attribute__((target("avx2,avxvnni")))
static int scan_avx_vnni(tr_codes_scan *s, uint64_t b0, uint64_t b1, uint64_t rows) {
    return scan_blocks(s, b0, b1, rows, dots_avx_vnni);
}
__attribute__((target("avx2")))
static int scan_avx2(tr_codes_scan *s, uint64_t b0, uint64_t b1, uint64_t rows) {
    return scan_blocks(s, b0, b1, rows, dots_avx2);
}
#endif
static int scan_scalar(tr_codes_scan *s, uint64_t b0, uint64_t b1, uint64_t rows) {
    return scan_blocks(s, b0, b1, rows, dots_scalar);
}

int tr_codes_scan_blocks(tr_codes_scan *s, uint64_t block_start, uint64_t block_end, uint64_t rows) {
    switch (s->codes->isa) {
#if defined(__x86_64__)
    case TR_ISA_AVX512_VNNI: return scan_avx512_vnni(s, block_start, block_end, rows);
    case TR_ISA_AVX_VNNI: return scan_avx_vnni(s, block_start, block_end, rows);
    case TR_ISA_AVX2: return scan_avx2(s, block_start, block_end, rows);
#endif
    }
    return scan_scalar(s, block_start, block_end, rows);
}
