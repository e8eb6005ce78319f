/* libtrencoder: multilingual-e5-small's encoder for one query as one cooperative CUDA kernel (its shape, the order of
 * the weights the caller hands over, and the call interface; mirrored in tiered_recall/embedders/e5_fused.py and
 * checked against it by tests/native/test_encoder_layout.py). */
#ifndef TIERED_RECALL_ENCODER_H
#define TIERED_RECALL_ENCODER_H

#include <stdint.h>

#define TR_ENCODER_ABI_VERSION 1
#define TR_ENCODER_HIDDEN 384
#define TR_ENCODER_HEADS 12
#define TR_ENCODER_FFN 1536
#define TR_ENCODER_LAYERS 12
/* A query of more tokens is the caller's to run another way. */
#define TR_ENCODER_MAX_TOKENS 128

/* The weights, as device pointers in this order: first the embedding's, */
enum {
    TR_ENCODER_WORDS = 0,     /* (vocabulary, hidden) float16: the word embeddings, row per token id */
    TR_ENCODER_POSITIONS = 1, /* (TR_ENCODER_MAX_TOKENS, hidden) float32: position + token-type vectors */
    TR_ENCODER_EMB_GAMMA = 2, /* hidden float32: the embedding layer norm */
    TR_ENCODER_EMB_BETA = 3,
    TR_ENCODER_GLOBALS = 4
};
/* then each layer's at TR_ENCODER_GLOBALS + layer * TR_ENCODER_PER_LAYER + these; matrices are float16 with one row per
 * output (in-dimension contiguous), vectors float32; the biases of the two output projections folded into the layer
 * norms before them (tiered_recall/embedders/e5_torch.py: folded_layers). */
enum {
    TR_ENCODER_QKV = 0,       /* (3 hidden, hidden) */
    TR_ENCODER_QKV_BIAS = 1,  /* 3 hidden */
    TR_ENCODER_AO = 2,        /* (hidden, hidden) */
    TR_ENCODER_ALN_GAMMA = 3, /* hidden */
    TR_ENCODER_ALN_BETA = 4,  /* hidden */
    TR_ENCODER_FI = 5,        /* (ffn, hidden) */
    TR_ENCODER_FI_BIAS = 6,   /* ffn */
    TR_ENCODER_FO = 7,        /* (hidden, ffn) */
    TR_ENCODER_OLN_GAMMA = 8, /* hidden */
    TR_ENCODER_OLN_BETA = 9,  /* hidden */
    TR_ENCODER_PER_LAYER = 10
};
#define TR_ENCODER_POINTERS (TR_ENCODER_GLOBALS + TR_ENCODER_LAYERS * TR_ENCODER_PER_LAYER)

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tr_encoder tr_encoder;

uint32_t tr_encoder_abi_version(void);
/* The constants above as JSON, for the Python mirror's test. */
const char *tr_encoder_layout_json(void);
/* An encoder on CUDA device `device` reading the TR_ENCODER_POINTERS weights (device memory the caller keeps alive and
 * unchanged), with layer-norm epsilon `eps`, run on `blocks` thread blocks (0: one per multiprocessor). NULL on
 * failure, with why in error. */
tr_encoder *tr_encoder_create(int device, const void *const *weights, int count, float eps, int blocks, char *error,
                              int error_bytes);
/* One query's token ids (1 to TR_ENCODER_MAX_TOKENS, <s> and </s> included) -> out: its hidden-size mean-pooled
 * vector, unit length. 0 on success, else -1 with why in error. Calls on one encoder are serialised. */
int tr_encoder_embed(tr_encoder *encoder, const int32_t *ids, int tokens, float *out, char *error, int error_bytes);
/* The blocks the kernel runs on. */
int tr_encoder_blocks(const tr_encoder *encoder);
void tr_encoder_destroy(tr_encoder *encoder);

#ifdef __cplusplus
}
#endif

#endif
