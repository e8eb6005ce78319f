/* Encoding rows and queries into 8-bit codes, with the norms their error bounds need (codes.h says how).
 *
 * Compiled without -ffast-math: the bounds' own arithmetic must round as written. */
#include "codes.h"

#include <math.h>
#include <string.h>

#include "tiered_recall/layout.h"

float tr_codes_round_up(double v) {
    float f = (float)v;
    if ((double)f < v) f = nextafterf(f, INFINITY);
    return f;
}

/* One 8-bit term of v (d values): codes in [-127, 127] with scale t = max |v_j| / 127 (0 when v is 0), and v minus
 * what the term holds, in place. */
static float encode_term(double *v, uint32_t d, int8_t *codes) {
    double m = 0.0;
    for (uint32_t j = 0; j < d; j++) m = fmax(m, fabs(v[j]));
    const float t = (float)(m / 127.0);
    for (uint32_t j = 0; j < d; j++) {
        double c = t > 0.0f ? nearbyint(v[j] / (double)t) : 0.0;
        c = c > 127.0 ? 127.0 : (c < -127.0 ? -127.0 : c);
        codes[j] = (int8_t)c;
        v[j] -= (double)t * c; /* exact: a float times an integer below 2^8 fits a double */
    }
    return t;
}

void tr_codes_encode_row(const float *x, uint32_t d, uint8_t *codes, tr_code_row *row) {
    double m = 0.0;
    for (uint32_t j = 0; j < d; j++) m = fmax(m, fabs((double)x[j]));
    const float s = (float)(m / 127.0);
    double r2 = 0.0, n2 = 0.0;
    for (uint32_t j = 0; j < d; j++) {
        double c = s > 0.0f ? nearbyint((double)x[j] / (double)s) : 0.0;
        c = c > 127.0 ? 127.0 : (c < -127.0 ? -127.0 : c);
        codes[j] = (uint8_t)((int)c + (int)TR_CODES_ZERO);
        const double xq = (double)s * c;
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

void tr_codes_encode_query(const float *q, uint32_t d, uint32_t dpad, int8_t *q1, int8_t *q2, tr_code_query *out) {
    double v[TR_MAX_DIM];
    double qn2 = 0.0;
    for (uint32_t j = 0; j < d; j++) {
        v[j] = (double)q[j];
        qn2 += v[j] * v[j];
    }
    memset(q1, 0, dpad);
    memset(q2, 0, dpad);
    out->t1 = encode_term(v, d, q1);
    out->t2 = encode_term(v, d, q2);
    double e2 = 0.0;
    int32_t s1 = 0, s2 = 0;
    for (uint32_t j = 0; j < d; j++) {
        e2 += v[j] * v[j];
        s1 += q1[j];
        s2 += q2[j];
    }
    out->sum1 = s1;
    out->sum2 = s2;
    out->qnorm = tr_codes_round_up(sqrt(qn2) * (1.0 + 1e-9));
    out->qerr = tr_codes_round_up(sqrt(e2) * (1.0 + 1e-9));
}
