/* libtrcpuencoder's interface (native/include/tiered_recall/cpu_encoder.h): multilingual-e5-small on x86 CPUs with
 * AVX-512 VNNI. Each matrix product quantizes its input rows to uint8 (one scale and zero point per row) and multiplies
 * them by int8 weights (one scale per output column) with exact int32 sums; layer norms, attention, GELU and pooling
 * run in float32 (kernels.c). A call runs on the calling thread, with the encoder's helper threads where it asks for
 * more than one (pool.c). Loaded by tiered_recall/embedders/e5_cpu.py through ctypes. */
#include "tiered_recall/cpu_encoder.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "pool.h"

#define API __attribute__((visibility("default")))

enum {
    LAYERS = TR_CPU_ENCODER_LAYERS,
    SCRATCH_SLOTS = 8, /* calls that run side by side without allocating */
    MAX_THREADS = 8,
    ALIGN = 64
};

typedef struct {
    tr_matrix qkv, ao, fi, fo;
    float *aln_gamma, *aln_beta, *oln_gamma, *oln_beta;
} layer;

typedef struct {
    atomic_int busy;
    size_t bytes;
    unsigned char *memory;
} scratch_slot;

struct tr_cpu_encoder {
    float eps;
    float *emb_gamma, *emb_beta;
    layer layers[LAYERS];
    scratch_slot slots[SCRATCH_SLOTS];
    const uint8_t *word_blocks; /* the caller's, read in place (tr_cpu_encoder_set_inputs) */
    int64_t vocabulary;
    float *positions, *token_type;
    int position_count;
    atomic_int pool_busy; /* one call at a time shares its tasks with the helpers; another runs alone */
    tr_pool *pool;        /* made by the first call that asks for threads; its helpers are threads - 1 */
};

static void say(char *error, int error_bytes, const char *what) {
    if (error && error_bytes > 0) snprintf(error, (size_t)error_bytes, "%s", what);
}

API uint32_t tr_cpu_encoder_abi_version(void) { return TR_CPU_ENCODER_ABI_VERSION; }

API const char *tr_cpu_encoder_layout_json(void) {
    static char json[1024];
    snprintf(json, sizeof json,
             "{\"TR_CPU_ENCODER_ABI_VERSION\": %d, \"TR_CPU_ENCODER_HIDDEN\": %d, \"TR_CPU_ENCODER_HEADS\": %d, "
             "\"TR_CPU_ENCODER_FFN\": %d, \"TR_CPU_ENCODER_LAYERS\": %d, \"TR_CPU_ENCODER_MAX_TOKENS\": %d, "
             "\"TR_CPU_ENCODER_GLOBALS\": %d, \"TR_CPU_ENCODER_PER_LAYER\": %d, \"TR_CPU_ENCODER_Q4_BLOCK\": %d, "
             "\"TR_CPU_ENCODER_Q4_BLOCK_BYTES\": %d, "
             "\"order\": [\"EMB_GAMMA\", \"EMB_BETA\"], "
             "\"layer_order\": [\"QKV\", \"QKV_SCALE\", \"QKV_BIAS\", \"AO\", \"AO_SCALE\", \"AO_BIAS\", \"ALN_GAMMA\", "
             "\"ALN_BETA\", \"FI\", \"FI_SCALE\", \"FI_BIAS\", \"FO\", \"FO_SCALE\", \"FO_BIAS\", \"OLN_GAMMA\", "
             "\"OLN_BETA\"]}",
             TR_CPU_ENCODER_ABI_VERSION, TR_HIDDEN, TR_HEADS, TR_FFN, LAYERS, TR_CPU_ENCODER_MAX_TOKENS,
             (int)TR_CPU_ENCODER_GLOBALS, (int)TR_CPU_ENCODER_PER_LAYER, TR_CPU_ENCODER_Q4_BLOCK,
             TR_CPU_ENCODER_Q4_BLOCK_BYTES);
    return json;
}

_Static_assert(TR_CPU_ENCODER_EMB_GAMMA == 0 && TR_CPU_ENCODER_EMB_BETA == 1, "tr_cpu_encoder_layout_json's order");
_Static_assert(TR_CPU_ENCODER_QKV == 0 && TR_CPU_ENCODER_QKV_SCALE == 1 && TR_CPU_ENCODER_QKV_BIAS == 2 &&
                   TR_CPU_ENCODER_AO == 3 && TR_CPU_ENCODER_AO_SCALE == 4 && TR_CPU_ENCODER_AO_BIAS == 5 &&
                   TR_CPU_ENCODER_ALN_GAMMA == 6 && TR_CPU_ENCODER_ALN_BETA == 7 && TR_CPU_ENCODER_FI == 8 &&
                   TR_CPU_ENCODER_FI_SCALE == 9 && TR_CPU_ENCODER_FI_BIAS == 10 && TR_CPU_ENCODER_FO == 11 &&
                   TR_CPU_ENCODER_FO_SCALE == 12 && TR_CPU_ENCODER_FO_BIAS == 13 && TR_CPU_ENCODER_OLN_GAMMA == 14 &&
                   TR_CPU_ENCODER_OLN_BETA == 15,
               "tr_cpu_encoder_layout_json's layer_order");

API int tr_cpu_encoder_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma");
}

static void *aligned(size_t bytes) {
    void *memory = NULL;
    return posix_memalign(&memory, ALIGN, (bytes + ALIGN - 1) / ALIGN * ALIGN) == 0 ? memory : NULL;
}

static float *copy_floats(const void *source, int count) {
    float *copy = aligned((size_t)count * sizeof(float));
    if (copy) memcpy(copy, source, (size_t)count * sizeof(float));
    return copy;
}

static int pack_matrix(tr_matrix *m, const void *const *weights, int in, int out) {
    const int8_t *rows = weights[0];
    m->in = in, m->out = out;
    m->packed = aligned((size_t)in * out);
    m->column_sums = aligned((size_t)out * sizeof(int32_t));
    m->scale = copy_floats(weights[1], out);
    m->bias = copy_floats(weights[2], out);
    if (!m->packed || !m->column_sums || !m->scale || !m->bias) return -1;
    for (int column = 0; column < out; ++column) {
        int32_t sum = 0;
        int8_t *panel = m->packed + (size_t)(column / TR_LANES) * in * TR_LANES;
        for (int k = 0; k < in; ++k) {
            int8_t weight = rows[(size_t)k * out + column];
            panel[((size_t)(k / 4) * TR_LANES + column % TR_LANES) * 4 + k % 4] = weight;
            sum += weight;
        }
        m->column_sums[column] = sum;
    }
    return 0;
}

static void free_matrix(tr_matrix *m) {
    free(m->packed), free(m->column_sums), free(m->scale), free(m->bias);
}

API void tr_cpu_encoder_destroy(tr_cpu_encoder *encoder) {
    if (!encoder) return;
    tr_pool_destroy(encoder->pool);
    free(encoder->emb_gamma), free(encoder->emb_beta), free(encoder->positions), free(encoder->token_type);
    for (int l = 0; l < LAYERS; ++l) {
        layer *ly = &encoder->layers[l];
        free_matrix(&ly->qkv), free_matrix(&ly->ao), free_matrix(&ly->fi), free_matrix(&ly->fo);
        free(ly->aln_gamma), free(ly->aln_beta), free(ly->oln_gamma), free(ly->oln_beta);
    }
    for (int s = 0; s < SCRATCH_SLOTS; ++s) free(encoder->slots[s].memory);
    free(encoder);
}

API tr_cpu_encoder *tr_cpu_encoder_create(const void *const *weights, int count, float eps, char *error,
                                          int error_bytes) {
    if (!tr_cpu_encoder_supported()) {
        say(error, error_bytes, "this CPU lacks AVX-512 VNNI (avx512f, avx512bw, avx512vl, avx512dq, avx512vnni)");
        return NULL;
    }
    if (!weights || count != TR_CPU_ENCODER_POINTERS) {
        if (error && error_bytes > 0)
            snprintf(error, (size_t)error_bytes, "expected %d weight pointers, got %d", TR_CPU_ENCODER_POINTERS, count);
        return NULL;
    }
    for (int i = 0; i < count; ++i) {
        if (!weights[i]) {
            if (error && error_bytes > 0) snprintf(error, (size_t)error_bytes, "weight %d is null", i);
            return NULL;
        }
    }
    if (!(eps > 0.0f) || !isfinite(eps)) {
        say(error, error_bytes, "the layer norms' epsilon must be a positive finite number");
        return NULL;
    }
    tr_cpu_encoder *encoder = calloc(1, sizeof *encoder);
    if (!encoder) {
        say(error, error_bytes, "out of memory");
        return NULL;
    }
    encoder->eps = eps;
    encoder->emb_gamma = copy_floats(weights[TR_CPU_ENCODER_EMB_GAMMA], TR_HIDDEN);
    encoder->emb_beta = copy_floats(weights[TR_CPU_ENCODER_EMB_BETA], TR_HIDDEN);
    int failed = !encoder->emb_gamma || !encoder->emb_beta;
    for (int l = 0; l < LAYERS && !failed; ++l) {
        const void *const *w = weights + TR_CPU_ENCODER_GLOBALS + l * TR_CPU_ENCODER_PER_LAYER;
        layer *ly = &encoder->layers[l];
        failed = pack_matrix(&ly->qkv, w + TR_CPU_ENCODER_QKV, TR_HIDDEN, TR_QKV_WIDTH) ||
                 pack_matrix(&ly->ao, w + TR_CPU_ENCODER_AO, TR_HIDDEN, TR_HIDDEN) ||
                 pack_matrix(&ly->fi, w + TR_CPU_ENCODER_FI, TR_HIDDEN, TR_FFN) ||
                 pack_matrix(&ly->fo, w + TR_CPU_ENCODER_FO, TR_FFN, TR_HIDDEN);
        ly->aln_gamma = copy_floats(w[TR_CPU_ENCODER_ALN_GAMMA], TR_HIDDEN);
        ly->aln_beta = copy_floats(w[TR_CPU_ENCODER_ALN_BETA], TR_HIDDEN);
        ly->oln_gamma = copy_floats(w[TR_CPU_ENCODER_OLN_GAMMA], TR_HIDDEN);
        ly->oln_beta = copy_floats(w[TR_CPU_ENCODER_OLN_BETA], TR_HIDDEN);
        failed = failed || !ly->aln_gamma || !ly->aln_beta || !ly->oln_gamma || !ly->oln_beta;
    }
    if (failed) {
        tr_cpu_encoder_destroy(encoder);
        say(error, error_bytes, "out of memory");
        return NULL;
    }
    return encoder;
}


/* ---- a call ----------------------------------------------------------------------------------------------------- */

typedef struct {
    float *x, *x1, *projected, *ctx, *qkv, *inner, *scale, *work;
    int32_t *zero;
    uint8_t *quantized;
} buffers;

static size_t lay_out(buffers *to, unsigned char *memory, int rows, int tokens) {
    const size_t sizes[] = {(size_t)rows * TR_HIDDEN * 4, (size_t)rows * TR_HIDDEN * 4, (size_t)rows * TR_HIDDEN * 4,
                            (size_t)rows * TR_HIDDEN * 4, (size_t)rows * TR_QKV_WIDTH * 4, (size_t)rows * TR_FFN * 4,
                            (size_t)rows * 4, tr_attention_work(tokens) * MAX_THREADS * 4, (size_t)rows * 4,
                            (size_t)rows * TR_FFN};
    void **slots[] = {(void **)&to->x, (void **)&to->x1, (void **)&to->projected, (void **)&to->ctx,
                      (void **)&to->qkv, (void **)&to->inner, (void **)&to->scale, (void **)&to->work,
                      (void **)&to->zero, (void **)&to->quantized};
    size_t offset = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; ++i) {
        if (memory) *slots[i] = memory + offset;
        offset += (sizes[i] + ALIGN - 1) / ALIGN * ALIGN;
    }
    return offset;
}

/* A matrix product's tasks: one column block each, GELU applied to its own columns where asked. */
typedef struct {
    const tr_matrix *matrix;
    const buffers *m;
    int rows, gelu;
    float *out;
} product_job;

static void product_task(void *context, int task, int worker) {
    const product_job *job = context;
    tr_multiply(job->matrix, job->m->quantized, job->m->scale, job->m->zero, job->rows, job->out, task, 1);
    if (job->gelu) tr_gelu(job->out, job->rows, job->matrix->out, task * TR_COLUMN_BLOCK, TR_COLUMN_BLOCK);
}

static void product(tr_pool *pool, const tr_matrix *matrix, const buffers *m, int rows, float *out, int gelu) {
    product_job job = {matrix, m, rows, gelu, out};
    tr_pool_run(pool, product_task, &job, matrix->out / TR_COLUMN_BLOCK);
}

/* Attention's tasks: one (text, head) each, on the worker's own scratch. */
typedef struct {
    const buffers *m;
    const int32_t *mask;
    int tokens;
} attention_job;

static void attention_task(void *context, int task, int worker) {
    const attention_job *job = context;
    tr_attend(job->m->qkv, job->mask, task / TR_HEADS, task % TR_HEADS, job->tokens, job->m->ctx,
              job->m->work + tr_attention_work(job->tokens) * (size_t)worker);
}

static void encode(const tr_cpu_encoder *encoder, tr_pool *pool, const float *embeddings, const int32_t *mask,
                   int batch, int tokens, int rows, const buffers *m, float *summed) {
    const int real = batch * tokens;
    tr_norm_rows(embeddings, NULL, real, encoder->emb_gamma, encoder->emb_beta, encoder->eps, m->x);
    /* the padding rows: zero, so that every product and norm over them stays finite */
    memset(m->x + (size_t)real * TR_HIDDEN, 0, (size_t)(rows - real) * TR_HIDDEN * sizeof(float));
    memset(m->ctx + (size_t)real * TR_HIDDEN, 0, (size_t)(rows - real) * TR_HIDDEN * sizeof(float));
    attention_job attention = {m, mask, tokens};
    for (int l = 0; l < LAYERS; ++l) {
        const layer *ly = &encoder->layers[l];
        tr_quantize_rows(m->x, rows, TR_HIDDEN, m->quantized, m->scale, m->zero);
        product(pool, &ly->qkv, m, rows, m->qkv, 0);
        tr_pool_run(pool, attention_task, &attention, batch * TR_HEADS);
        tr_quantize_rows(m->ctx, rows, TR_HIDDEN, m->quantized, m->scale, m->zero);
        product(pool, &ly->ao, m, rows, m->projected, 0);
        tr_norm_rows(m->projected, m->x, rows, ly->aln_gamma, ly->aln_beta, encoder->eps, m->x1);
        tr_quantize_rows(m->x1, rows, TR_HIDDEN, m->quantized, m->scale, m->zero);
        product(pool, &ly->fi, m, rows, m->inner, 1);
        tr_quantize_rows(m->inner, rows, TR_FFN, m->quantized, m->scale, m->zero);
        product(pool, &ly->fo, m, rows, m->projected, 0);
        tr_norm_rows(m->projected, m->x1, rows, ly->oln_gamma, ly->oln_beta, encoder->eps, m->x);
    }
    for (int b = 0; b < batch; ++b) {
        float *out = summed + (size_t)b * TR_HIDDEN;
        memset(out, 0, TR_HIDDEN * sizeof(float));
        for (int t = 0; t < tokens; ++t) {
            if (!mask[(size_t)b * tokens + t]) continue;
            const float *row = m->x + ((size_t)b * tokens + t) * TR_HIDDEN;
            for (int c = 0; c < TR_HIDDEN; ++c) out[c] += row[c];
        }
    }
}

/* The encoder's pool for a call that asks for `threads`, claimed for the call (released by release_pool); NULL (run
 * alone) for one thread, while another call holds it, or where the helpers cannot be started. */
static tr_pool *claim_pool(tr_cpu_encoder *encoder, int threads) {
    if (threads <= 1 || atomic_exchange(&encoder->pool_busy, 1)) return NULL;
    if (encoder->pool && tr_pool_helpers(encoder->pool) != threads - 1) {
        tr_pool_destroy(encoder->pool);
        encoder->pool = NULL;
    }
    if (!encoder->pool) encoder->pool = tr_pool_create(threads - 1);
    if (!encoder->pool) atomic_store(&encoder->pool_busy, 0);
    return encoder->pool;
}

static void release_pool(tr_cpu_encoder *encoder, tr_pool *pool) {
    if (pool) atomic_store(&encoder->pool_busy, 0);
}

/* The checks both calls share: 0 when the call may run, else -1 with why in error. */
static int check_call(const tr_cpu_encoder *encoder, const void *input, const int32_t *mask, int batch, int tokens,
                      int threads, const float *summed, const char *input_name, char *error, int error_bytes) {
    if (!encoder || !input || !mask || !summed) {
        if (error && error_bytes > 0)
            snprintf(error, (size_t)error_bytes, "the encoder, %s, mask and output must not be null", input_name);
        return -1;
    }
    if (batch < 1 || tokens < 1 || tokens > TR_CPU_ENCODER_MAX_TOKENS || (size_t)batch * tokens > (1u << 24) ||
        batch * TR_HEADS > 65535) {
        if (error && error_bytes > 0)
            snprintf(error, (size_t)error_bytes,
                     "batch must be 1 to %d and tokens 1 to %d, at most %d tokens in all (got %d x %d)",
                     65535 / TR_HEADS, TR_CPU_ENCODER_MAX_TOKENS, 1 << 24, batch, tokens);
        return -1;
    }
    if (threads < 1 || threads > MAX_THREADS) {
        if (error && error_bytes > 0)
            snprintf(error, (size_t)error_bytes, "threads must be 1 to %d, got %d", MAX_THREADS, threads);
        return -1;
    }
    for (int b = 0; b < batch; ++b) {
        int any = 0;
        for (int t = 0; t < tokens; ++t) {
            int32_t v = mask[(size_t)b * tokens + t];
            if (v != 0 && v != 1) {
                say(error, error_bytes, "the mask holds a value other than 0 and 1");
                return -1;
            }
            any |= v;
        }
        if (!any) {
            if (error && error_bytes > 0) snprintf(error, (size_t)error_bytes, "text %d of the batch has no token", b);
            return -1;
        }
    }
    return 0;
}

/* An IEEE half as float, exactly (every half is a float). */
static float half_to_float(uint16_t half) {
    const uint32_t sign = (uint32_t)(half & 0x8000u) << 16, exponent = (half >> 10) & 0x1Fu, mantissa = half & 0x3FFu;
    uint32_t bits;
    if (exponent == 0) {
        const float magnitude = ldexpf((float)mantissa, -24);
        return sign ? -magnitude : magnitude;
    }
    bits = exponent == 31 ? sign | 0x7F800000u | mantissa << 13 : sign | (exponent + 112) << 23 | mantissa << 13;
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* One token's input: its word vector dequantized, plus its position's vector, plus the token-type vector. */
static void token_input(const tr_cpu_encoder *encoder, int64_t id, int position, float *out) {
    enum { BLOCKS = TR_HIDDEN / TR_CPU_ENCODER_Q4_BLOCK, HALF = TR_CPU_ENCODER_Q4_BLOCK / 2 };
    const uint8_t *block = encoder->word_blocks + (size_t)id * BLOCKS * TR_CPU_ENCODER_Q4_BLOCK_BYTES;
    for (int b = 0; b < BLOCKS; ++b, block += TR_CPU_ENCODER_Q4_BLOCK_BYTES) {
        const float scale = half_to_float((uint16_t)(block[0] | block[1] << 8));
        float *values = out + b * TR_CPU_ENCODER_Q4_BLOCK;
        for (int i = 0; i < HALF; ++i) {
            values[i] = ((float)(block[2 + i] & 0x0F) - 8.0f) * scale;
            values[HALF + i] = ((float)(block[2 + i] >> 4) - 8.0f) * scale;
        }
    }
    const float *position_vector = encoder->positions + (size_t)position * TR_HIDDEN;
    for (int c = 0; c < TR_HIDDEN; ++c) out[c] += position_vector[c];
    for (int c = 0; c < TR_HIDDEN; ++c) out[c] += encoder->token_type[c];
}

/* A call that passed check_call: 0, or -1 when out of memory. Its input is `embeddings`, or, where that is NULL, made
 * from `ids` in the scratch's projection rows, which the first layer only writes after the embedding norm has read
 * them. */
static int run_checked(tr_cpu_encoder *encoder, const float *embeddings, const int64_t *ids, const int32_t *mask,
                       int batch, int tokens, int threads, float *summed, char *error, int error_bytes) {
    const int rows = (batch * tokens + TR_ROW_STEP - 1) / TR_ROW_STEP * TR_ROW_STEP;
    buffers m;
    const size_t bytes = lay_out(&m, NULL, rows, tokens);
    scratch_slot *slot = NULL;
    for (int s = 0; s < SCRATCH_SLOTS && !slot; ++s)
        if (!atomic_exchange(&encoder->slots[s].busy, 1)) slot = &encoder->slots[s];
    unsigned char *memory;
    if (slot && slot->bytes >= bytes) {
        memory = slot->memory;
    } else {
        memory = aligned(bytes);
        if (!memory) {
            if (slot) atomic_store(&slot->busy, 0);
            say(error, error_bytes, "out of memory");
            return -1;
        }
        if (slot) free(slot->memory), slot->memory = memory, slot->bytes = bytes;
    }
    lay_out(&m, memory, rows, tokens);
    if (!embeddings) {
        for (size_t i = 0; i < (size_t)batch * tokens; ++i)
            token_input(encoder, ids[i], (int)(i % (size_t)tokens), m.projected + i * TR_HIDDEN);
        embeddings = m.projected;
    }
    tr_pool *pool = claim_pool(encoder, threads);
    encode(encoder, pool, embeddings, mask, batch, tokens, rows, &m, summed);
    release_pool(encoder, pool);
    if (slot)
        atomic_store(&slot->busy, 0);
    else
        free(memory);
    return 0;
}

API int tr_cpu_encoder_run(tr_cpu_encoder *encoder, const float *embeddings, const int32_t *mask, int batch,
                           int tokens, int threads, float *summed, char *error, int error_bytes) {
    if (check_call(encoder, embeddings, mask, batch, tokens, threads, summed, "embeddings", error, error_bytes))
        return -1;
    return run_checked(encoder, embeddings, NULL, mask, batch, tokens, threads, summed, error, error_bytes);
}

API int tr_cpu_encoder_set_inputs(tr_cpu_encoder *encoder, const void *word_blocks, int64_t vocabulary,
                                  const float *positions, int position_count, const float *token_type, char *error,
                                  int error_bytes) {
    if (!encoder || !word_blocks || !positions || !token_type) {
        say(error, error_bytes, "the encoder, word blocks, positions and token type must not be null");
        return -1;
    }
    if (vocabulary < 1 || position_count < 1) {
        if (error && error_bytes > 0)
            snprintf(error, (size_t)error_bytes, "the vocabulary and the positions must be positive (got %lld, %d)",
                     (long long)vocabulary, position_count);
        return -1;
    }
    /* a text has at most TR_CPU_ENCODER_MAX_TOKENS tokens: positions past them are never read */
    if (position_count > TR_CPU_ENCODER_MAX_TOKENS) position_count = TR_CPU_ENCODER_MAX_TOKENS;
    float *copied_positions = copy_floats(positions, position_count * TR_HIDDEN);
    float *copied_type = copy_floats(token_type, TR_HIDDEN);
    if (!copied_positions || !copied_type) {
        free(copied_positions), free(copied_type);
        say(error, error_bytes, "out of memory");
        return -1;
    }
    free(encoder->positions), free(encoder->token_type);
    encoder->word_blocks = word_blocks, encoder->vocabulary = vocabulary;
    encoder->positions = copied_positions, encoder->token_type = copied_type, encoder->position_count = position_count;
    return 0;
}

API int tr_cpu_encoder_run_ids(tr_cpu_encoder *encoder, const int64_t *ids, const int32_t *mask, int batch, int tokens,
                               int threads, float *summed, char *error, int error_bytes) {
    if (check_call(encoder, ids, mask, batch, tokens, threads, summed, "ids", error, error_bytes)) return -1;
    if (!encoder->word_blocks) {
        say(error, error_bytes, "the encoder has no token tables: call tr_cpu_encoder_set_inputs first");
        return -1;
    }
    if (tokens > encoder->position_count) {
        if (error && error_bytes > 0)
            snprintf(error, (size_t)error_bytes, "%d tokens a text, past the model's %d positions", tokens,
                     encoder->position_count);
        return -1;
    }
    for (size_t i = 0; i < (size_t)batch * tokens; ++i) {
        if (ids[i] < 0 || ids[i] >= encoder->vocabulary) {
            if (error && error_bytes > 0)
                snprintf(error, (size_t)error_bytes, "token id %lld (text %zu, position %zu) is outside the vocabulary "
                         "(0 to %lld)", (long long)ids[i], i / (size_t)tokens, i % (size_t)tokens,
                         (long long)encoder->vocabulary - 1);
            return -1;
        }
    }
    return run_checked(encoder, NULL, ids, mask, batch, tokens, threads, summed, error, error_bytes);
}
