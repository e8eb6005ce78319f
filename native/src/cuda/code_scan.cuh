/* The scan of the int8 codes with its bounds, and the merge that re-scores the candidates from the f16 rows
 * (--codes int8; the bounds: native/src/codes.h; the design: docs/gpu-backend.md, "The codes").
 *
 * A code row holds c_j = round(x_j / s) + 128 for the row's f16 values x, one byte a dimension, padded with 128 to a
 * multiple of 64 dimensions; each row also has meta = (s, bound_r). Lane (g, t) of a warp loads 16 codes of rows g
 * and g + 8 (dimensions 16 cc .. 16 cc + 15, cc = 4 c + t for chunk c of 64 dimensions) and turns them into f16
 * exactly (the byte under the exponent of 1024, then 1152 subtracted: c - 128 in [-127, 127]); the mma against the
 * f16 query (the very one the f16 scan uses) sums q16 . (c - 128) in f32, and est = s x that sum. A row whose upper
 * bound est + qbound bound_r reaches the query's threshold (the k-th best lower bound est - qbound bound_r its block
 * has seen, or a better one another block published) is kept as a candidate.
 *
 * The merge (one block a query) takes the blocks' candidates, finds the k-th best lower bound among them, re-scores
 * those whose upper bound reaches it from the f16 rows with the f16 scan's own arithmetic (the same mma steps, in the
 * same order, as batch_scan_block<1>), so their scores are that scan's to the bit, and ranks them. Too many
 * candidates (rows too alike for 8 bits) mark the query TR_CODE_FAIL: the host answers it with the f16 scan. */
#ifndef TR_CUDA_CODE_SCAN_CUH
#define TR_CUDA_CODE_SCAN_CUH

#include "batch_scan.cuh" /* mma16816 */

/* 4 codes (bytes of w) -> two f16 pairs (c0 - 128, c1 - 128) and (c2 - 128, c3 - 128), exact. */
__device__ __forceinline__ void codes_to_f16(unsigned w, unsigned &h01, unsigned &h23) {
    asm("prmt.b32 %0, %1, %2, 0x5150;" : "=r"(h01) : "r"(w), "r"(0x64646464u));
    asm("prmt.b32 %0, %1, %2, 0x5352;" : "=r"(h23) : "r"(w), "r"(0x64646464u));
    asm("sub.f16x2 %0, %0, %1;" : "+r"(h01) : "r"(0x64806480u));
    asm("sub.f16x2 %0, %0, %1;" : "+r"(h23) : "r"(0x64806480u));
}

/* 16 codes -> the f16 of their dimensions 0-7 (lo) and 8-15 (hi), as the mma's A fragments want them. */
__device__ __forceinline__ void code_vec_to_f16(uint4 v, uint4 &lo, uint4 &hi) {
    codes_to_f16(v.x, lo.x, lo.y);
    codes_to_f16(v.y, lo.z, lo.w);
    codes_to_f16(v.z, hi.x, hi.y);
    codes_to_f16(v.w, hi.z, hi.w);
}

/* Floats as unsigned keys in the same order, shifted so that 0 is below every float (CodeState's "none yet"). */
__device__ __forceinline__ unsigned code_key(float f) {
    const unsigned b = __float_as_uint(f);
    return ((b & 0x80000000u) ? ~b : (b | 0x80000000u)) + 1u;
}
__device__ __forceinline__ float code_unkey(unsigned k) {
    if (k == 0) return -INFINITY;
    const unsigned b = k - 1u;
    return __uint_as_float((b & 0x80000000u) ? (b & 0x7FFFFFFFu) : ~b);
}

/* Query qi's candidates in a scan block (one warp): its threshold raised to the k-th best of the lanes' best lower
 * bounds (a lower bound on the k-th best of the block: k lanes, k distinct rows) and to the best any block published
 * (this one's published too); the candidates whose upper bound fell below it dropped. Returns how many stay (every
 * lane); more than TR_CODE_CB - TR_BQ_ROUND: rows too alike, the pass fails over. */
__device__ unsigned code_select(const CodeParams &p, unsigned qi, float *clo, float *chi, unsigned *crow, unsigned *cnt,
                            float *thr, float *best = nullptr) {
    constexpr unsigned PER = TR_CODE_CB / 32;
    const unsigned lane = threadIdx.x & 31u, k = p.cq[qi].k, n = cnt[qi];
    float lo[PER], hi[PER];
    unsigned row[PER];
    float lane_max = -INFINITY;
#pragma unroll
    for (unsigned i = 0; i < PER; i++) {
        const unsigned j = lane + 32u * i;
        lo[i] = j < n ? clo[qi * TR_CODE_CB + j] : -INFINITY;
        hi[i] = j < n ? chi[qi * TR_CODE_CB + j] : -INFINITY;
        row[i] = j < n ? crow[qi * TR_CODE_CB + j] : 0u;
        lane_max = fmaxf(lane_max, lo[i]);
    }
    const float sorted = warp_sort_desc(lane_max);
    const float bound = __shfl_sync(0xffffffffu, sorted, k - 1);
    if (best && lane == 0) *best = sorted; /* the block's best lower bound: a real row's, whatever is kept */
    unsigned published = 0;
    if (lane == 0) published = atomicMax(&p.state->bound[qi], code_key(bound));
    float t = fmaxf(fmaxf(thr[qi], bound), code_unkey(__shfl_sync(0xffffffffu, published, 0)));
    unsigned mine = 0;
#pragma unroll
    for (unsigned i = 0; i < PER; i++) mine += (lane + 32u * i < n && hi[i] >= t) ? 1u : 0u;
    unsigned upto = mine;
#pragma unroll
    for (unsigned o = 1; o < 32; o <<= 1) {
        const unsigned v = __shfl_up_sync(0xffffffffu, upto, o);
        if (lane >= o) upto += v;
    }
    const unsigned m = __shfl_sync(0xffffffffu, upto, 31);
    __syncwarp(); /* every lane has read its entries */
    unsigned pos = upto - mine;
#pragma unroll
    for (unsigned i = 0; i < PER; i++) {
        if (lane + 32u * i < n && hi[i] >= t) {
            clo[qi * TR_CODE_CB + pos] = lo[i];
            chi[qi * TR_CODE_CB + pos] = hi[i];
            crow[qi * TR_CODE_CB + pos] = row[i];
            pos++;
        }
    }
    __syncwarp();
    if (lane == 0) {
        cnt[qi] = m;
        thr[qi] = t;
    }
    return m;
}

/* One block's share of a pass over the codes (block blk of G): stages the queries (qsrc: p.q, or the kernel's
 * parameters), scans its run of rows in rounds of 128 (8 warps x 16 rows), keeps each query's candidates and leaves
 * them in the flat list. bsm: the dynamic shared memory (code_smem). */
template <int NT>
__device__ void code_scan_block(const CodeParams &p, const uint4 *qsrc, unsigned blk, uint4 *bsm) {
    constexpr unsigned QR = NT * 8;
    uint4 *sq = bsm;                                                  /* QR x qstride f16 queries */
    float *clo = reinterpret_cast<float *>(bsm + QR * p.qstride);     /* QR x CB */
    float *chi = clo + QR * TR_CODE_CB;
    unsigned *crow = reinterpret_cast<unsigned *>(chi + QR * TR_CODE_CB);
    __shared__ unsigned cnt[QR];
    __shared__ float thr[QR];
    __shared__ unsigned s_abort;

    const unsigned tid = threadIdx.x;
    for (unsigned i = tid; i < QR * p.qstride; i += blockDim.x) {
        const unsigned r = i / p.qstride, c = i - r * p.qstride;
        sq[i] = (r < p.nq && c < p.nvec) ? qsrc[r * p.nvec + c] : make_uint4(0, 0, 0, 0);
    }
    if (tid < QR) {
        cnt[tid] = 0;
        thr[tid] = -INFINITY;
    }
    if (tid == 0) s_abort = 0;
    __syncthreads();

    const unsigned warp = tid >> 5, lane = tid & 31u, g = lane >> 2, t = lane & 3u;
    const unsigned long long start = (unsigned long long)blk * p.rows_per_block;
    unsigned long long end = start + p.rows_per_block;
    if (end > p.rows) end = p.rows;
    constexpr bool kPrefetch = NT == 1;
    uint4 a0[TR_BQ_STAGE], b0[TR_BQ_STAGE];
    bool prefetched = false;
    const unsigned nrounds = end > start ? (unsigned)((end - start + TR_BQ_ROUND - 1) / TR_BQ_ROUND) : 0u;
    const long long step = p.backward ? -(long long)TR_BQ_ROUND : (long long)TR_BQ_ROUND;
    unsigned long long base = p.backward && nrounds ? start + (nrounds - 1ull) * TR_BQ_ROUND : start;
    for (unsigned r = 0; r < nrounds; r++, base += step) {
        /* another block's overflow, read now and acted on after this round's barrier */
        const unsigned aborted = tid == 0 ? *(volatile unsigned *)&p.state->abort : 0u;
        const unsigned long long row0 = base + warp * 16ull;
        if (row0 < end) { /* warp-uniform */
            const unsigned long long rg = row0 + g, rh = rg + 8;
            const bool vg = rg < end, vh = rh < end;
            const uint4 *cg = p.C + (vg ? rg : 0) * p.cvec, *ch = p.C + (vh ? rh : 0) * p.cvec;
            float acc[NT][4], acc2[NT][4];
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[n][e] = acc2[n][e] = 0.f;
            auto load_from = [&](unsigned c0, uint4 (&a)[TR_BQ_STAGE], uint4 (&b)[TR_BQ_STAGE], const uint4 *fg,
                                 const uint4 *fh) {
#pragma unroll
                for (int u = 0; u < TR_BQ_STAGE; u++) {
                    const bool ok = c0 + u < p.cchunk;
                    const unsigned cc = (c0 + u) * 4u + t;
                    a[u] = ok ? __ldg(fg + cc) : make_uint4(0, 0, 0, 0);
                    b[u] = ok ? __ldg(fh + cc) : make_uint4(0, 0, 0, 0);
                }
            };
            auto multiply = [&](unsigned c0, const uint4 (&a)[TR_BQ_STAGE], const uint4 (&b)[TR_BQ_STAGE]) {
#pragma unroll
                for (int u = 0; u < TR_BQ_STAGE; u++) {
                    if (c0 + u < p.cchunk) {
                        const unsigned cc = (c0 + u) * 4u + t;
                        uint4 alo, ahi, blo, bhi;
                        code_vec_to_f16(a[u], alo, ahi);
                        code_vec_to_f16(b[u], blo, bhi);
#pragma unroll
                        for (int n = 0; n < NT; n++) {
                            const uint4 q0 = sq[(n * 8 + g) * p.qstride + 2u * cc];
                            const uint4 q1 = sq[(n * 8 + g) * p.qstride + 2u * cc + 1u];
                            mma16816(acc[n], alo.x, blo.x, alo.y, blo.y, q0.x, q0.y);
                            mma16816(acc2[n], alo.z, blo.z, alo.w, blo.w, q0.z, q0.w);
                            mma16816(acc[n], ahi.x, bhi.x, ahi.y, bhi.y, q1.x, q1.y);
                            mma16816(acc2[n], ahi.z, bhi.z, ahi.w, bhi.w, q1.z, q1.w);
                        }
                    }
                }
            };
            uint4 a1[TR_BQ_STAGE], b1[TR_BQ_STAGE];
            if (!prefetched) load_from(0u, a0, b0, cg, ch);
            const float2 mg = vg ? __ldg(p.meta + rg) : make_float2(0.f, 0.f);
            const float2 mh = vh ? __ldg(p.meta + rh) : make_float2(0.f, 0.f);
            uint64_t nsg = 0, nsh = 0;
            if (p.any_filter) {
                nsg = vg ? p.ns[rg] : 0;
                nsh = vh ? p.ns[rh] : 0;
            }
            for (unsigned c0 = 0; c0 < p.cchunk; c0 += 2 * TR_BQ_STAGE) {
                load_from(c0 + TR_BQ_STAGE, a1, b1, cg, ch);
                multiply(c0, a0, b0);
                load_from(c0 + 2 * TR_BQ_STAGE, a0, b0, cg, ch);
                multiply(c0 + TR_BQ_STAGE, a1, b1);
            }
            if constexpr (kPrefetch) {
                const unsigned long long next = r + 1 < nrounds ? row0 + step : end;
                const unsigned long long ng = next + g, nh = ng + 8;
                prefetched = next < end; /* warp-uniform */
                if (prefetched)
                    load_from(0, a0, b0, p.C + (ng < end ? ng : 0) * p.cvec, p.C + (nh < end ? nh : 0) * p.cvec);
            }
#pragma unroll
            for (int n = 0; n < NT; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const unsigned qi = n * 8 + 2 * t + (e & 1);
                    const bool hi_row = e >= 2;
                    if (qi < p.nq && (hi_row ? vh : vg)) {
                        const CodeQuery &cq = p.cq[qi];
                        if (cq.filter && (hi_row ? nsh : nsg) != cq.ns_hash) continue;
                        const float2 m = hi_row ? mh : mg;
                        const float est = m.x * (acc[n][e] + acc2[n][e]);
                        const float err = cq.qbound * m.y;
                        const float up = est + err;
                        if (up >= thr[qi]) {
                            const unsigned pos = atomicAdd(&cnt[qi], 1u);
                            clo[qi * TR_CODE_CB + pos] = est - err;
                            chi[qi * TR_CODE_CB + pos] = up;
                            crow[qi * TR_CODE_CB + pos] = (unsigned)((hi_row ? rh : rg) - start);
                        }
                    }
                }
            }
        }
        if (aborted) s_abort = 1;
        __syncthreads();
        for (unsigned qi = warp; qi < p.nq; qi += TR_CUDA_WARPS) {
            if (cnt[qi] > TR_CODE_CB - TR_BQ_ROUND &&
                code_select(p, qi, clo, chi, crow, cnt, thr) > TR_CODE_CB - TR_BQ_ROUND) {
                if (lane == 0) {
                    s_abort = 1;
                    atomicExch(&p.state->abort, 1u);
                }
            }
        }
        __syncthreads();
        if (s_abort) return; /* block-uniform */
    }
    /* the block's candidates of each query, against its final threshold, into the flat list */
    for (unsigned qi = warp; qi < p.nq; qi += TR_CUDA_WARPS) {
        const unsigned m = code_select(p, qi, clo, chi, crow, cnt, thr, p.best + qi * TR_CUDA_MAX_GRID + blk);
        if (m > TR_CODE_CB - TR_BQ_ROUND) {
            if (lane == 0) atomicExch(&p.state->abort, 1u);
            continue;
        }
        unsigned at = 0;
        if (lane == 0 && m) at = atomicAdd(&p.state->count[qi], m);
        at = __shfl_sync(0xffffffffu, at, 0);
        float4 *flat = p.flat + (size_t)qi * TR_CODE_FLAT;
        for (unsigned j = lane; j < m; j += 32) {
            if (at + j >= TR_CODE_FLAT) break; /* the merge sees the count past the list and fails over */
            const unsigned long long row = start + crow[qi * TR_CODE_CB + j];
            flat[at + j] = make_float4(clo[qi * TR_CODE_CB + j], chi[qi * TR_CODE_CB + j],
                                       __uint_as_float((unsigned)row), __uint_as_float((unsigned)(row >> 32)));
        }
    }
}

/* The merge's shared memory (dynamic, at bsm), for one query. */
struct CodeMergeSmem {
    float *alo, *ahi;              /* TR_CODE_ACAP: candidates whose upper bound reaches the blocks' bound */
    unsigned long long *arow;
    float *lv;                     /* TR_CODE_RANK: lower bounds at or above the blocks' bound */
    unsigned long long *rrow;      /* TR_CODE_RCAP: the candidates to re-score */
    float *ms;                     /* TR_CODE_RCAP: their scores and ids */
    long long *mid;
    uint4 *qf;                     /* the query's f16, nvec uint4 */
};
__device__ inline CodeMergeSmem code_merge_layout(uint4 *bsm) {
    CodeMergeSmem m;
    m.arow = reinterpret_cast<unsigned long long *>(bsm);
    m.rrow = m.arow + TR_CODE_ACAP;
    m.mid = reinterpret_cast<long long *>(m.rrow + TR_CODE_RCAP);
    m.qf = reinterpret_cast<uint4 *>(m.mid + TR_CODE_RCAP);
    /* the query's f16 is at most TR_MAX_DIM / 8 uint4; the floats after it (code_merge_smem counts nvec only) */
    return m;
}

/* The whole block merges query qi (of a pass of G scan blocks): the k-th best lower bound over the candidates, the
 * re-score of those whose upper bound reaches it, the top k into the query's results (or TR_CODE_FAIL into its hits).
 * Not inlined: inlined into the fused scan kernel, its registers made the scan spill. */
__device__ __noinline__ void code_merge_query(const CodeParams &p, const uint4 *qsrc, unsigned qi, unsigned G,
                                              uint4 *bsm) {
    __shared__ unsigned s_acnt, s_lcnt, s_rcnt, s_fail, s_count;
    __shared__ float s_kth;
    __shared__ float s_group[TR_CUDA_WARPS];
    const unsigned tid = threadIdx.x, warp = tid >> 5, lane = tid & 31u, g = lane >> 2, t = lane & 3u;
    CodeMergeSmem m = code_merge_layout(bsm);
    m.alo = reinterpret_cast<float *>(m.qf + p.nvec);
    m.ahi = m.alo + TR_CODE_ACAP;
    m.lv = m.ahi + TR_CODE_ACAP;
    m.ms = m.lv + TR_CODE_RANK;
    const CodeQuery &cq = p.cq[qi];
    const unsigned k = cq.k;
    const unsigned n_flat = __ldcg(&p.state->count[qi]);
    const float threshold = code_unkey(__ldcg(&p.state->bound[qi]));
    /* a lower bound on the k-th best lower bound: the best block threshold, and the k-th best of the blocks' best
     * lower bounds within each group of 32 blocks (k rows of k blocks) */
    float group = -INFINITY;
    for (unsigned g0 = warp * 32u; g0 < G; g0 += TR_CUDA_WARPS * 32u) { /* warp-uniform */
        const float v = g0 + lane < G ? __ldcg(p.best + qi * TR_CUDA_MAX_GRID + g0 + lane) : -INFINITY;
        group = fmaxf(group, __shfl_sync(0xffffffffu, warp_sort_desc(v), k - 1));
    }
    __syncthreads(); /* the previous query's readers of the shared memory are done */
    if (lane == 0) s_group[warp] = group;
    if (tid == 0) {
        s_acnt = s_lcnt = s_rcnt = 0;
        s_fail = __ldcg(&p.state->abort) != 0 || n_flat > TR_CODE_FLAT;
    }
    for (unsigned i = tid; i < p.nvec; i += blockDim.x) m.qf[i] = qsrc[(size_t)qi * p.nvec + i];
    __syncthreads();
    float bound = threshold;
#pragma unroll
    for (unsigned w = 0; w < TR_CUDA_WARPS; w++) bound = fmaxf(bound, s_group[w]);
    if (tid == 0) s_kth = bound; /* read after the barriers below */
    if (!s_fail) {
        /* the blocks' candidates, 8 loads a thread in flight before any is used (one trip to L2, not 8) */
        const float4 *flat = p.flat + (size_t)qi * TR_CODE_FLAT;
        for (unsigned base = 0; base < n_flat; base += 8u * blockDim.x) {
            float4 e[8];
#pragma unroll
            for (unsigned u = 0; u < 8; u++) {
                const unsigned i = base + u * blockDim.x + tid;
                e[u] = i < n_flat ? __ldcg(flat + i) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (unsigned u = 0; u < 8; u++) {
                if (base + u * blockDim.x + tid < n_flat && e[u].y >= bound) {
                    const unsigned at = atomicAdd(&s_acnt, 1u);
                    if (at < TR_CODE_ACAP) {
                        m.alo[at] = e[u].x;
                        m.ahi[at] = e[u].y;
                        m.arow[at] = (unsigned long long)__float_as_uint(e[u].z) |
                                     ((unsigned long long)__float_as_uint(e[u].w) << 32);
                    }
                    if (e[u].x >= bound) {
                        const unsigned l = atomicAdd(&s_lcnt, 1u);
                        if (l < TR_CODE_RANK) m.lv[l] = e[u].x;
                    }
                }
            }
        }
    }
    __syncthreads();
    const unsigned na = s_acnt, nl = s_lcnt;
    bool fail = s_fail || na > TR_CODE_ACAP; /* the same in every thread */
    /* the exact k-th best lower bound when few reach the blocks' bound (each ranked against all); else the bound */
    if (!fail && nl <= TR_CODE_RANK) {
        if (nl < k) {
            if (tid == 0) s_kth = -INFINITY; /* fewer than k rows in scope: every candidate stays */
        } else if (tid < nl) {
            const float v = m.lv[tid];
            unsigned rank = 0;
            for (unsigned j = 0; j < nl; j++) {
                const float w = m.lv[j];
                rank += (w > v || (w == v && j < tid)) ? 1u : 0u;
            }
            if (rank == k - 1) s_kth = v;
        }
    } else if (!fail) {
        /* many at or above the bound: the k-th best lower bound of the candidates, bit by bit (the largest key that
         * k of them reach) */
        unsigned prefix = 0;
        for (int bit = 31; bit >= 0; bit--) {
            const unsigned cand = prefix | (1u << bit);
            unsigned c = 0;
            for (unsigned i = tid; i < na; i += blockDim.x) c += code_key(m.alo[i]) >= cand ? 1u : 0u;
            c = __reduce_add_sync(0xffffffffu, c);
            if (tid == 0) s_count = 0;
            __syncthreads();
            if (lane == 0) atomicAdd(&s_count, c);
            __syncthreads();
            if (s_count >= k) prefix = cand;
            __syncthreads();
        }
        if (tid == 0) s_kth = code_unkey(prefix);
    }
    __syncthreads();
    if (!fail) {
        const float kth = s_kth;
        for (unsigned i = tid; i < na; i += blockDim.x) {
            if (m.ahi[i] >= kth) {
                const unsigned at = atomicAdd(&s_rcnt, 1u);
                if (at < TR_CODE_RCAP) m.rrow[at] = m.arow[i];
            }
        }
    }
    __syncthreads();
    const unsigned nr = s_rcnt;
    if (fail || nr > TR_CODE_RCAP) { /* block-uniform */
        if (tid == 0) p.out_hits[qi] = TR_CODE_FAIL;
        return;
    }
    /* the re-score: batch_scan_block<1>'s steps for one 16-row tile, with this query in the mma's column 0 */
    for (unsigned tile = warp; tile * 16u < nr; tile += TR_CUDA_WARPS) {
        const unsigned ig = tile * 16u + g, ih = ig + 8u;
        const bool vg = ig < nr, vh = ih < nr;
        const unsigned long long rg = vg ? m.rrow[ig] : 0ull, rh = vh ? m.rrow[ih] : 0ull;
        const uint4 *xg = p.X + rg * p.nvec, *xh = p.X + rh * p.nvec;
        float acc[4] = {0.f, 0.f, 0.f, 0.f}, acc2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
        for (unsigned c = 0; c < p.nchunk16; c++) {
            const unsigned cc = c * 4u + t;
            const bool ok = cc < p.nvec;
            const uint4 a = (ok && vg) ? __ldg(xg + cc) : make_uint4(0, 0, 0, 0);
            const uint4 b = (ok && vh) ? __ldg(xh + cc) : make_uint4(0, 0, 0, 0);
            const uint4 qv = (ok && g == 0) ? m.qf[cc] : make_uint4(0, 0, 0, 0);
            mma16816(acc, a.x, b.x, a.y, b.y, qv.x, qv.y);
            mma16816(acc2, a.z, b.z, a.w, b.w, qv.z, qv.w);
        }
#pragma unroll
        for (int e = 0; e < 4; e++) acc[e] += acc2[e];
        if (t == 0) { /* column 0: the query */
            if (vg) {
                m.ms[ig] = acc[0];
                m.mid[ig] = (long long)__ldg(p.ids + rg);
            }
            if (vh) {
                m.ms[ih] = acc[2];
                m.mid[ih] = (long long)__ldg(p.ids + rh);
            }
        }
    }
    __syncthreads();
    long long *oi = cq.oid;
    float *os = cq.osc;
    const unsigned hits = nr < k ? nr : k;
    if (nr <= TR_CUDA_BLOCK) {
        block_rank_place(m.ms, m.mid, nr, k, os, oi);
        for (unsigned j = hits + tid; j < k; j += blockDim.x) {
            oi[j] = -1;
            os[j] = -INFINITY;
        }
    } else if (warp == 0) {
        warp_select(m.ms, m.mid, nr, k);
        for (unsigned j = lane; j < k; j += 32) {
            oi[j] = j < hits ? m.mid[j] : -1;
            os[j] = j < hits ? m.ms[j] : -INFINITY;
        }
    }
    if (tid == 0) p.out_hits[qi] = hits;
}

/* FUSE: the last block to finish (a device-scope ticket, fences on both sides) merges every query and leaves the
 * pass's state zero for the next launch; otherwise code_merge_kernel merges, one block a query. INL: the queries ride
 * in the parameters (qin; a pass that fits TR_BQ_INLINE uint4, always fused), with no copy before the launch. */
template <int NT, int FUSE, int INL>
__global__ void __launch_bounds__(TR_CUDA_BLOCK, 2)
code_scan_kernel(const __grid_constant__ CodeParams p, const __grid_constant__ BatchInline<INL ? TR_BQ_INLINE : 1> qin) {
    extern __shared__ uint4 bsm[];
    const uint4 *qsrc = INL ? qin.v : p.q;
    code_scan_block<NT>(p, qsrc, blockIdx.x, bsm);
    if (!FUSE) return;
    __shared__ bool is_last;
    __threadfence(); /* this block's candidates and counts are visible device-wide before its ticket */
    __syncthreads();
    if (threadIdx.x == 0) is_last = atomicAdd(&p.state->done, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence(); /* acquire: every other block's candidates */
    for (unsigned qi = 0; qi < p.nq; qi++) code_merge_query(p, qsrc, qi, gridDim.x, bsm);
    __syncthreads();
    if (threadIdx.x < TR_BQ_MAX) {
        p.state->count[threadIdx.x] = 0;
        p.state->bound[threadIdx.x] = 0;
    }
    if (threadIdx.x == 0) {
        p.state->abort = 0;
        p.state->done = 0;
    }
}

__global__ void __launch_bounds__(TR_CUDA_BLOCK) code_merge_kernel(const __grid_constant__ CodeParams p, unsigned G) {
    extern __shared__ uint4 bsm[];
    code_merge_query(p, p.q, blockIdx.x, G, bsm);
}

#endif
