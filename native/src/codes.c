/* Encoding rows and queries into 8-bit codes, with the norms their error bounds need (codes.h says how).
 *
 * Compiled without -ffast-math: the bounds' own arithmetic must round as written. */
#include "codes.h"

#include <math.h>
#include <string.h>

#include "tiered_recall/layout.h"

_Static_assert(sizeof(tr_code_row) == TR_CODES_ROW_META_CPU, "the CPU's per-row code metadata is what layout.h counts");

/* The encoders' loops vectorise: compiled for AVX-512, AVX2 and the baseline, the loader picks (as the CPU scan). */
#if defined(__x86_64__) && !defined(TR_NATIVE_ARCH_BUILD)
#define TR_ENCODE_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TR_ENCODE_CLONES
#endif

float tr_codes_round_up(double v) {
    float f = (float)v;
    if ((double)f < v) f = nextafterf(f, INFINITY);
    return f;
}

/* The nearest integer to v in [-127, 127] (halves away from zero): plain float arithmetic, which vectorises (a call
 * of rint per element did not). Any integer near v would do: the bounds are computed from the codes chosen. */
static inline int code_of(float v) {
    float c = v + (v >= 0.0f ? 0.5f : -0.5f);
    c = c > 127.0f ? 127.0f : (c < -127.0f ? -127.0f : c);
    return (int)c;
}

/* max_j |v_j| (v finite: the server checks every vector), in a loop that vectorises (fmaxf is a call here). */
static inline float max_abs(const float *v, uint32_t d) {
    float m = 0.0f;
    for (uint32_t j = 0; j < d; j++) {
        const float a = v[j] < 0.0f ? -v[j] : v[j];
        m = a > m ? a : m;
    }
    return m;
}

/* One 8-bit term of v (d values): codes in [-127, 127] with scale t = max |v_j| / 127 (0 when v is 0); rest gets
 * v minus what the term holds, in float (it only chooses the next term's codes; the bound is computed from the
 * codes chosen). */
static inline float encode_term(const float *v, uint32_t d, int8_t *codes, float *rest) {
    const float m = max_abs(v, d);
    const float t = m / 127.0f, inv = m > 1e-30f ? 127.0f / m : 0.0f; /* tinier: all codes 0 */
    for (uint32_t j = 0; j < d; j++) {
        const int c = code_of(v[j] * inv);
        codes[j] = (int8_t)c;
        rest[j] = v[j] - t * (float)c;
    }
    return t;
}

TR_ENCODE_CLONES void tr_codes_encode_row(const float *x, uint32_t d, uint8_t *codes, tr_code_row *row) {
    const float m = max_abs(x, d);
    const float s = m / 127.0f, inv = m > 1e-30f ? 127.0f / m : 0.0f; /* tinier: all codes 0 */
    double r2 = 0.0, n2 = 0.0;
    for (uint32_t j = 0; j < d; j++) {
        const int c = code_of(x[j] * inv);
        codes[j] = (uint8_t)(c + (int)TR_CODES_ZERO);
        const double xq = (double)s * (double)c;
        r2 += ((double)x[j] - xq) * ((double)x[j] - xq);
        n2 += xq * xq;
    }
    /* the sums and their square roots round by parts in 2^50 at most: 1e-9 more covers them */
    const double r = sqrt(r2) * (1.0 + 1e-9), n = sqrt(n2) * (1.0 + 1e-9);
    const double slack = TR_CODES_SLACK(d) * (n + r);
    row->scale = s;
    row->bound_r = tr_codes_round_up(r + slack);
    row->bound_n = tr_codes_round_up(n + slack);
}

TR_ENCODE_CLONES void tr_codes_encode_query(const float *q, uint32_t d, uint32_t dpad, int8_t *q1, int8_t *q2, tr_code_query *out) {
    float rest[TR_MAX_DIM];
    memset(q1, 0, dpad);
    memset(q2, 0, dpad);
    out->t1 = encode_term(q, d, q1, rest);
    out->t2 = encode_term(rest, d, q2, rest);
    /* |q| and |q - q'| in double, from the codes chosen: each term below is exact but for one rounding */
    const double t1 = out->t1, t2 = out->t2;
    double qn2 = 0.0, e2 = 0.0;
    int32_t s1 = 0, s2 = 0;
    for (uint32_t j = 0; j < d; j++) {
        const double e = ((double)q[j] - t1 * q1[j]) - t2 * q2[j];
        qn2 += (double)q[j] * q[j];
        e2 += e * e;
        s1 += q1[j];
        s2 += q2[j];
    }
    out->sum1 = s1;
    out->sum2 = s2;
    out->qnorm = tr_codes_round_up(sqrt(qn2) * (1.0 + 1e-9));
    out->qerr = tr_codes_round_up(sqrt(e2) * (1.0 + 1e-9));
}
