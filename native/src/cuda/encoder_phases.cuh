/* The encoder kernel's phases (encoder.cu's one translation unit includes this): its shape constants and arguments,
 * staging rows into shared memory (with the layer norms), the tensor-core products, attention, and the pooling. */
#ifndef TR_ENCODER_PHASES_CUH
#define TR_ENCODER_PHASES_CUH

#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include "tiered_recall/encoder.h"

namespace cg = cooperative_groups;

namespace {

constexpr int H = TR_ENCODER_HIDDEN;
constexpr int HEADS = TR_ENCODER_HEADS;
constexpr int HEAD_DIM = H / HEADS;
constexpr int FFN = TR_ENCODER_FFN;
constexpr int LAYERS = TR_ENCODER_LAYERS;
constexpr int MAX_TOKENS = TR_ENCODER_MAX_TOKENS;
constexpr int THREADS = 384;
constexpr int WARPS = THREADS / 32;
// A product's staged input rows: M_TILES tiles of 16 rows (one chunk holds a typical query), float16, each row padded
// by PAD halves so that the 8 rows a fragment load reads fall in distinct banks. Two tiles where the GPU lends a block
// the shared memory (9.0, 8.0), one where it does not (8.6, 8.9: 99 KiB); the kernel is built for both, the host picks.
constexpr int PAD = 8;
constexpr int PARTIAL_FLOATS = WARPS * 2 * 16 * 8;  // each warp's partial 8-column tile, up to two row tiles
__host__ __device__ constexpr int stage_bytes(int m_tiles) { return m_tiles * 16 * (FFN + PAD) * 2; }
__host__ __device__ constexpr int shared_bytes(int m_tiles) { return stage_bytes(m_tiles) + PARTIAL_FLOATS * 4; }
constexpr int KEY_STRIDE = HEAD_DIM + 1;    // staged keys padded: lane j reads key j's dimension d conflict-free
constexpr int LOAD_BATCH = 8;               // loads in flight per thread while staging (stores wait for all of them)
constexpr int PRELOADED_STEPS = 8;          // k-steps of weights a warp keeps in registers across the grid barrier
constexpr unsigned FULL = 0xffffffffu;
static_assert(HEAD_DIM == 32, "attention keeps one head dimension per lane");
static_assert(H % 64 == 0 && FFN % 64 == 0, "rows are read as float2 by 32 lanes, and in 16-column k-steps");
static_assert(MAX_TOKENS * (KEY_STRIDE + HEAD_DIM) * 4 <= stage_bytes(1), "a head's keys and values fit the stage");
static_assert((WARPS * H + WARPS) * 4 <= stage_bytes(1), "the pooling's per-warp sums fit the stage");
static_assert(((H + PAD) / 2) % 32 == 4 && ((FFN + PAD) / 2) % 32 == 4, "padded rows start 4 banks apart");

struct Args {
    const void *weights[TR_ENCODER_POINTERS];
    int32_t ids[MAX_TOKENS];
    int tokens;
    float eps;
    float *pre;      // (tokens, H): the residual stream before its layer norm
    float *normed;   // (tokens, H): after it, what the next residual sum adds into
    float *qkv;      // (tokens, 3H)
    float *context;  // (tokens, H): attention's output
    float *inner;    // (tokens, FFN): the feed-forward's hidden activations
    float *out;      // H: the pooled unit vector (mapped host memory)
};

__device__ __forceinline__ const float *vec(const Args &a, int index) {
    return static_cast<const float *>(a.weights[index]);
}
__device__ __forceinline__ const __half *mat(const Args &a, int index) {
    return static_cast<const __half *>(a.weights[index]);
}
__device__ __forceinline__ int layer_index(int layer, int item) {
    return TR_ENCODER_GLOBALS + layer * TR_ENCODER_PER_LAYER + item;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset >= 1; offset >>= 1) v += __shfl_xor_sync(FULL, v, offset);
    return v;
}

/* A layer norm's statistics of one row of H, held by a warp as H / 64 float2 a lane: (mean, 1 / standard deviation). */
__device__ __forceinline__ float2 row_norm(const float2 (&v)[H / 64], float eps) {
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < H / 64; ++i) sum += v[i].x + v[i].y;
    const float mean = warp_sum(sum) / H;
    float squares = 0.f;
#pragma unroll
    for (int i = 0; i < H / 64; ++i) {
        const float dx = v[i].x - mean, dy = v[i].y - mean;
        squares += dx * dx + dy * dy;
    }
    return make_float2(mean, rsqrtf(warp_sum(squares) / H + eps));
}

/* Where a staged row comes from: the embedding (word + position, layer 0's input), a residual stream before its layer
 * norm, or a plain activation (context, inner). */
enum Source { EMBEDDING, PRE, PLAIN };

/* Rows [t0, t0 + count) of the input of a product with K inputs, into stage (float16, K + PAD per row). A layer
 * norm's rows are normalised on the way; of the `working` blocks that stage them, the one that owns row t
 * (t % working) also writes it (float32) to a.normed, where the next residual sum reads it. What other blocks wrote
 * in this launch is read through L2 (__ldcg): this multiprocessor's L1 may hold an older copy. */
template <int K>
__device__ void stage_rows(const Args &a, Source source, const float *plain, const float *gamma, const float *beta,
                           int t0, int count, int working, __half *stage) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (source == PLAIN) {
        // Loads batched ahead of their stores: stored one by one, each load would wait for the store before it.
        const float4 *from = reinterpret_cast<const float4 *>(plain + (size_t)t0 * K);
        const int n = count * K / 4;
        for (int base = threadIdx.x; base < n; base += THREADS * LOAD_BATCH) {
            float4 v[LOAD_BATCH];
#pragma unroll
            for (int b = 0; b < LOAD_BATCH; ++b) {
                if (base + b * THREADS < n) v[b] = __ldcg(from + base + b * THREADS);
            }
#pragma unroll
            for (int b = 0; b < LOAD_BATCH; ++b) {
                const int i = base + b * THREADS;
                if (i < n) {
                    __half2 *to = reinterpret_cast<__half2 *>(stage + (i / (K / 4)) * (K + PAD) + (i % (K / 4)) * 4);
                    to[0] = __floats2half2_rn(v[b].x, v[b].y);
                    to[1] = __floats2half2_rn(v[b].z, v[b].w);
                }
            }
        }
        return;
    }
    constexpr int PER_LANE = H / 64;  // float2 per lane
    // The norm's weights read once, all at once: read beside each row's stores, every read would wait for the
    // stores before it.
    float2 g[PER_LANE], b[PER_LANE];
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        g[i] = __ldg(reinterpret_cast<const float2 *>(gamma) + lane + 32 * i);
        b[i] = __ldg(reinterpret_cast<const float2 *>(beta) + lane + 32 * i);
    }
    for (int r = warp; r < count; r += WARPS) {
        const int t = t0 + r;
        float2 v[PER_LANE];
        if (source == EMBEDDING) {
            const __half2 *word = reinterpret_cast<const __half2 *>(mat(a, TR_ENCODER_WORDS) + (size_t)a.ids[t] * H);
            const float2 *position = reinterpret_cast<const float2 *>(vec(a, TR_ENCODER_POSITIONS) + (size_t)t * H);
#pragma unroll
            for (int i = 0; i < PER_LANE; ++i) {
                const float2 w = __half22float2(word[lane + 32 * i]);
                const float2 p = position[lane + 32 * i];
                v[i] = make_float2(w.x + p.x, w.y + p.y);
            }
        } else {
            const float2 *row = reinterpret_cast<const float2 *>(a.pre + (size_t)t * H);
#pragma unroll
            for (int i = 0; i < PER_LANE; ++i) v[i] = __ldcg(row + lane + 32 * i);
        }
        const float2 norm = row_norm(v, a.eps);  // mean, 1 / standard deviation
        const float mean = norm.x, scale = norm.y;
        const bool owner = (t % working) == (int)blockIdx.x;
        __half2 *staged = reinterpret_cast<__half2 *>(stage + r * (H + PAD));
        float2 *normed = reinterpret_cast<float2 *>(a.normed + (size_t)t * H);
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) {
            const int j = lane + 32 * i;
            const float2 n = make_float2((v[i].x - mean) * scale * g[i].x + b[i].x,
                                         (v[i].y - mean) * scale * g[i].y + b[i].y);
            staged[j] = __float22half2_rn(n);
            if (owner) normed[j] = n;
        }
    }
}

enum Epilogue { QKV, RESIDUAL, GELU };

__device__ __forceinline__ void finish(const Args &a, Epilogue epilogue, const float *bias, float *out, int N, int t,
                                       int column, float total) {
    if (epilogue == QKV) {
        out[(size_t)t * N + column] = total + bias[column];
    } else if (epilogue == GELU) {
        const float x = total + bias[column];
        out[(size_t)t * N + column] = 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    } else {
        out[(size_t)t * N + column] = __ldcg(a.normed + (size_t)t * N + column) + total;
    }
}

/* D += A B for one 16 x 16 tile of rows (A, row-major) and one 16 x 8 tile of weights (B, column-major: a weight row
 * is an output's inputs), float16 in, float32 sums. */
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* out = input @ W^T for W (N, K) float16, on the tensor cores. The outputs are tiles of 8 columns, dealt to the
 * blocks in turn; a block's warps split each of its tiles' K inputs into `split` runs of 16-input k-steps, and their
 * partial sums meet in shared memory. A warp with one run of at most PRELOADED_STEPS steps reads its weights before
 * the grid barrier that precedes the product (`barrier`, null for none): they do not depend on what it waits for. */
template <int K, int M_TILES>
__device__ void product(const Args &a, cg::grid_group *barrier, Source source, const float *plain,
                        const float *gamma, const float *beta, const __half *W, int N, Epilogue epilogue,
                        const float *bias, float *out, __half *stage, float *partial) {
    constexpr int ROWS = M_TILES * 16, STEPS = K / 16, STRIDE = K + PAD;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = lane / 4, pair = lane % 4;  // the fragments' row (or column) and column pair
    const int tiles = N / 8;
    const int mine = tiles > (int)blockIdx.x ? (tiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int working = min(tiles, (int)gridDim.x);
    const int split = mine > 0 && mine <= WARPS ? WARPS / mine : 1;
    const int run = (STEPS + split - 1) / split;  // k-steps per warp
    const int units = mine * split;               // (tile, run) pairs, one warp each in a round of WARPS
    const bool preloaded = units <= WARPS && run <= PRELOADED_STEPS;
    auto weight_row = [&](int unit) { return W + (size_t)(((unit / split) * gridDim.x + blockIdx.x) * 8 + group) * K; };
    uint32_t held[2 * PRELOADED_STEPS];
    if (preloaded && warp < units) {
        const __half *row = weight_row(warp);
        const int first_step = (warp % split) * run;
#pragma unroll
        for (int s = 0; s < PRELOADED_STEPS; ++s) {
            if (s < run && first_step + s < STEPS) {
                const int k = (first_step + s) * 16 + 2 * pair;
                held[2 * s] = __ldg(reinterpret_cast<const uint32_t *>(row + k));
                held[2 * s + 1] = __ldg(reinterpret_cast<const uint32_t *>(row + k + 8));
            }
        }
    }
    if (barrier) barrier->sync();
    if (mine == 0) return;  // no outputs here, and no rows of a.normed to own
    for (int t0 = 0; t0 < a.tokens; t0 += ROWS) {
        const int count = min(ROWS, a.tokens - t0);
        __syncthreads();
        stage_rows<K>(a, source, plain, gamma, beta, t0, count, working, stage);
        __syncthreads();
        for (int round = 0; round < units; round += WARPS) {
            const int unit = round + warp;
            if (unit < units) {
                // Rows past `count` are summed too (left from an earlier chunk, or never written): a row's sums never
                // mix with another row's, and those are not written out.
                float d[M_TILES][4] = {};
                const int first_step = (unit % split) * run;
                const int steps = min(run, STEPS - first_step);
                const __half *row = weight_row(unit);
                auto step = [&](int s, uint32_t b0, uint32_t b1) {
                    const int k = (first_step + s) * 16 + 2 * pair;
#pragma unroll
                    for (int m = 0; m < M_TILES; ++m) {
                        const __half *top = stage + (m * 16 + group) * STRIDE + k;
                        const uint32_t fragment[4] = {
                            *reinterpret_cast<const uint32_t *>(top),
                            *reinterpret_cast<const uint32_t *>(top + 8 * STRIDE),
                            *reinterpret_cast<const uint32_t *>(top + 8),
                            *reinterpret_cast<const uint32_t *>(top + 8 * STRIDE + 8)};
                        mma_16x8x16(d[m], fragment, b0, b1);
                    }
                };
                if (preloaded) {
#pragma unroll
                    for (int s = 0; s < PRELOADED_STEPS; ++s) {
                        if (s < steps) step(s, held[2 * s], held[2 * s + 1]);
                    }
                } else {
                    for (int s = 0; s < steps; ++s) {
                        const int k = (first_step + s) * 16 + 2 * pair;
                        step(s, __ldg(reinterpret_cast<const uint32_t *>(row + k)),
                             __ldg(reinterpret_cast<const uint32_t *>(row + k + 8)));
                    }
                }
                float *mine_partial = partial + warp * (ROWS * 8);
#pragma unroll
                for (int m = 0; m < M_TILES; ++m) {
                    mine_partial[(m * 16 + group) * 8 + 2 * pair] = d[m][0];
                    mine_partial[(m * 16 + group) * 8 + 2 * pair + 1] = d[m][1];
                    mine_partial[(m * 16 + group + 8) * 8 + 2 * pair] = d[m][2];
                    mine_partial[(m * 16 + group + 8) * 8 + 2 * pair + 1] = d[m][3];
                }
            }
            __syncthreads();
            // The round's tiles: the runs of each summed in a fixed order, then the epilogue, one output a thread.
            const int round_tiles = min(units - round, WARPS) / split;
            for (int i = threadIdx.x; i < round_tiles * count * 8; i += THREADS) {
                const int tile = i / (count * 8), t = (i / 8) % count, c = i % 8;
                float total = 0.f;
                for (int r = 0; r < split; ++r) total += partial[(tile * split + r) * (ROWS * 8) + t * 8 + c];
                const int column = ((round / split + tile) * gridDim.x + blockIdx.x) * 8 + c;
                finish(a, epilogue, bias, out, N, t0 + t, column, total);
            }
            __syncthreads();
        }
    }
}

/* Softmax attention. A block takes one head (or, on a grid of fewer blocks than heads, several in turn) and a share of
 * the query rows: the head's keys and values staged in shared memory, one query row per warp; lane j scores key j (and
 * j + 32, ...), then lane d sums head dimension d of the weighted values. */
__device__ void attention(const Args &a, float *shared) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float scale = rsqrtf((float)HEAD_DIM);
    constexpr int KEY_GROUPS = MAX_TOKENS / 32;
    int head = blockIdx.x, head_step = gridDim.x, group = 0, groups = 1;
    if (gridDim.x >= HEADS) {
        groups = gridDim.x / HEADS;
        if ((int)blockIdx.x >= groups * HEADS) return;
        head = blockIdx.x % HEADS, head_step = HEADS, group = blockIdx.x / HEADS;
    }
    float *keys = shared;
    float *values = shared + MAX_TOKENS * KEY_STRIDE;
    for (; head < HEADS; head += head_step) {
        __syncthreads();
        const int n = a.tokens * HEAD_DIM;
        for (int base = threadIdx.x; base < n; base += THREADS * LOAD_BATCH / 2) {
            float k[LOAD_BATCH / 2], v[LOAD_BATCH / 2];
#pragma unroll
            for (int b = 0; b < LOAD_BATCH / 2; ++b) {
                const int i = base + b * THREADS;
                if (i < n) {
                    const float *row = a.qkv + (size_t)(i / HEAD_DIM) * 3 * H + head * HEAD_DIM + i % HEAD_DIM;
                    k[b] = __ldcg(row + H);
                    v[b] = __ldcg(row + 2 * H);
                }
            }
#pragma unroll
            for (int b = 0; b < LOAD_BATCH / 2; ++b) {
                const int i = base + b * THREADS;
                if (i < n) {
                    keys[(i / HEAD_DIM) * KEY_STRIDE + i % HEAD_DIM] = k[b];
                    values[i] = v[b];
                }
            }
        }
        __syncthreads();
        for (int t = group * WARPS + warp; t < a.tokens; t += groups * WARPS) {
            const float q = __ldcg(a.qkv + (size_t)t * 3 * H + head * HEAD_DIM + lane);
            float score[KEY_GROUPS];
            float best = -INFINITY;
#pragma unroll
            for (int g = 0; g < KEY_GROUPS; ++g) {
                score[g] = -INFINITY;
                if (32 * g < a.tokens) {  // the same for every lane
                    const int key = lane + 32 * g;
                    const float *k = keys + min(key, a.tokens - 1) * KEY_STRIDE;
                    float s = 0.f;
#pragma unroll
                    for (int d = 0; d < HEAD_DIM; ++d) s = fmaf(__shfl_sync(FULL, q, d), k[d], s);
                    if (key < a.tokens) score[g] = s * scale;
                }
                best = fmaxf(best, score[g]);
            }
#pragma unroll
            for (int offset = 16; offset >= 1; offset >>= 1) best = fmaxf(best, __shfl_xor_sync(FULL, best, offset));
            float total = 0.f;
#pragma unroll
            for (int g = 0; g < KEY_GROUPS; ++g) {
                score[g] = lane + 32 * g < a.tokens ? expf(score[g] - best) : 0.f;
                total += score[g];
            }
            total = warp_sum(total);
            float context = 0.f;
#pragma unroll
            for (int g = 0; g < KEY_GROUPS; ++g) {
                const int count = min(32, a.tokens - 32 * g);
                for (int j = 0; j < count; ++j) {
                    context = fmaf(__shfl_sync(FULL, score[g], j), values[(32 * g + j) * HEAD_DIM + lane], context);
                }
            }
            a.context[(size_t)t * H + head * HEAD_DIM + lane] = context / total;
        }
    }
}

/* Block 0: the last layer norm of every row, their mean, scaled to unit length. */
__device__ void pool(const Args &a, float *stage) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    constexpr int PER_LANE = H / 64;
    const float2 *g = reinterpret_cast<const float2 *>(vec(a, layer_index(LAYERS - 1, TR_ENCODER_OLN_GAMMA)));
    const float2 *b = reinterpret_cast<const float2 *>(vec(a, layer_index(LAYERS - 1, TR_ENCODER_OLN_BETA)));
    float2 sums[PER_LANE];
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) sums[i] = make_float2(0.f, 0.f);
    for (int t = warp; t < a.tokens; t += WARPS) {
        const float2 *row = reinterpret_cast<const float2 *>(a.pre + (size_t)t * H);
        float2 v[PER_LANE];
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) v[i] = __ldcg(row + lane + 32 * i);
        const float2 norm = row_norm(v, a.eps);
        const float mean = norm.x, scale = norm.y;
#pragma unroll
        for (int i = 0; i < PER_LANE; ++i) {
            const int j = lane + 32 * i;
            sums[i].x += (v[i].x - mean) * scale * g[j].x + b[j].x;
            sums[i].y += (v[i].y - mean) * scale * g[j].y + b[j].y;
        }
    }
    __syncthreads();  // the stage's last readers were the product's warps
    float2 *mine = reinterpret_cast<float2 *>(stage + warp * H);
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) mine[lane + 32 * i] = sums[i];
    __syncthreads();
    float *partial = stage + WARPS * H;
    constexpr int PER_THREAD = (H + THREADS - 1) / THREADS;
    float pooled[PER_THREAD];
    float squares = 0.f;
#pragma unroll
    for (int n = 0; n < PER_THREAD; ++n) {  // a fixed order of sums: the same ids give the same vector
        const int j = threadIdx.x + n * THREADS;
        float s = 0.f;
        if (j < H) {
            for (int w = 0; w < WARPS; ++w) s += stage[w * H + j];
        }
        pooled[n] = s / a.tokens;
        squares += pooled[n] * pooled[n];
    }
    squares = warp_sum(squares);
    if (lane == 0) partial[warp] = squares;
    __syncthreads();
    float norm2 = 0.f;
    for (int w = 0; w < WARPS; ++w) norm2 += partial[w];
    const float inverse = rsqrtf(norm2);
#pragma unroll
    for (int n = 0; n < PER_THREAD; ++n) {
        const int j = threadIdx.x + n * THREADS;
        if (j < H) a.out[j] = pooled[n] * inverse;
    }
    __threadfence_system();
}

}  // namespace

#endif
