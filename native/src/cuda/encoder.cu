/* libtrencoder: one query through multilingual-e5-small's encoder as one cooperative kernel. A query is a few dozen
 * tokens: run as a chain of library kernels, its twelve layers are about a hundred launches of a few microseconds
 * each. Here every block stays resident and the phases of a layer (the qkv product, attention, the output
 * projection, the feed-forward pair) are separated by grid-wide barriers; each layer norm is applied by every block
 * as it stages its input rows into shared memory, so it costs no phase of its own. The products run on the tensor
 * cores (float16 weights and staged rows, float32 sums); the residual stream stays float32. */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "encoder_phases.cuh"

namespace {

template <int M_TILES>
__global__ void __launch_bounds__(THREADS, 1) encode(const Args a) {
    extern __shared__ __align__(16) unsigned char shared[];
    __half *stage = reinterpret_cast<__half *>(shared);
    float *staged_floats = reinterpret_cast<float *>(shared);
    float *partial = reinterpret_cast<float *>(shared + stage_bytes(M_TILES));
    cg::grid_group grid = cg::this_grid();
    for (int layer = 0; layer < LAYERS; ++layer) {
        const int L = layer_index(layer, 0);
        if (layer == 0) {
            product<H, M_TILES>(a, nullptr, EMBEDDING, nullptr, vec(a, TR_ENCODER_EMB_GAMMA),
                                vec(a, TR_ENCODER_EMB_BETA), mat(a, L + TR_ENCODER_QKV), 3 * H, QKV,
                                vec(a, L + TR_ENCODER_QKV_BIAS), a.qkv, stage, partial);
        } else {
            const int P = layer_index(layer - 1, 0);
            product<H, M_TILES>(a, &grid, PRE, nullptr, vec(a, P + TR_ENCODER_OLN_GAMMA),
                                vec(a, P + TR_ENCODER_OLN_BETA), mat(a, L + TR_ENCODER_QKV), 3 * H, QKV,
                                vec(a, L + TR_ENCODER_QKV_BIAS), a.qkv, stage, partial);
        }
        grid.sync();
        attention(a, staged_floats);
        product<H, M_TILES>(a, &grid, PLAIN, a.context, nullptr, nullptr, mat(a, L + TR_ENCODER_AO), H, RESIDUAL,
                            nullptr, a.pre, stage, partial);
        product<H, M_TILES>(a, &grid, PRE, nullptr, vec(a, L + TR_ENCODER_ALN_GAMMA), vec(a, L + TR_ENCODER_ALN_BETA),
                            mat(a, L + TR_ENCODER_FI), FFN, GELU, vec(a, L + TR_ENCODER_FI_BIAS), a.inner, stage,
                            partial);
        product<FFN, M_TILES>(a, &grid, PLAIN, a.inner, nullptr, nullptr, mat(a, L + TR_ENCODER_FO), H, RESIDUAL,
                              nullptr, a.pre, stage, partial);
    }
    grid.sync();
    if (blockIdx.x == 0) pool(a, staged_floats);
}

}  // namespace

struct tr_encoder {
    int device;
    int blocks;
    int shared_bytes;
    const void *kernel;  // encode<2> or encode<1>
    cudaStream_t stream;
    Args args;
    float *scratch;
    float *host_out;  // mapped: the kernel writes the vector straight into it
    pthread_mutex_t lock;
};

static void say(char *error, int error_bytes, const char *what, cudaError_t status) {
    if (error && error_bytes > 0) {
        snprintf(error, (size_t)error_bytes, "%s: %s", what, status == cudaSuccess ? "invalid" : cudaGetErrorString(status));
    }
}

extern "C" __attribute__((visibility("default"))) uint32_t tr_encoder_abi_version(void) { return TR_ENCODER_ABI_VERSION; }

extern "C" __attribute__((visibility("default"))) const char *tr_encoder_layout_json(void) {
    static char json[1024];
    snprintf(json, sizeof json,
             "{\"TR_ENCODER_ABI_VERSION\": %d, \"TR_ENCODER_HIDDEN\": %d, \"TR_ENCODER_HEADS\": %d, "
             "\"TR_ENCODER_FFN\": %d, \"TR_ENCODER_LAYERS\": %d, \"TR_ENCODER_MAX_TOKENS\": %d, "
             "\"TR_ENCODER_GLOBALS\": %d, \"TR_ENCODER_PER_LAYER\": %d, "
             "\"order\": [\"WORDS\", \"POSITIONS\", \"EMB_GAMMA\", \"EMB_BETA\"], "
             "\"layer_order\": [\"QKV\", \"QKV_BIAS\", \"AO\", \"ALN_GAMMA\", \"ALN_BETA\", \"FI\", "
             "\"FI_BIAS\", \"FO\", \"OLN_GAMMA\", \"OLN_BETA\"]}",
             TR_ENCODER_ABI_VERSION, TR_ENCODER_HIDDEN, TR_ENCODER_HEADS, TR_ENCODER_FFN, TR_ENCODER_LAYERS,
             TR_ENCODER_MAX_TOKENS, (int)TR_ENCODER_GLOBALS, (int)TR_ENCODER_PER_LAYER);
    return json;
}

static_assert(TR_ENCODER_WORDS == 0 && TR_ENCODER_POSITIONS == 1 && TR_ENCODER_EMB_GAMMA == 2 &&
                  TR_ENCODER_EMB_BETA == 3,
              "tr_encoder_layout_json's order");
static_assert(TR_ENCODER_QKV == 0 && TR_ENCODER_QKV_BIAS == 1 && TR_ENCODER_AO == 2 && TR_ENCODER_ALN_GAMMA == 3 &&
                  TR_ENCODER_ALN_BETA == 4 && TR_ENCODER_FI == 5 && TR_ENCODER_FI_BIAS == 6 && TR_ENCODER_FO == 7 &&
                  TR_ENCODER_OLN_GAMMA == 8 && TR_ENCODER_OLN_BETA == 9,
              "tr_encoder_layout_json's layer_order");

extern "C" __attribute__((visibility("default"))) void tr_encoder_destroy(tr_encoder *encoder) {
    if (!encoder) return;
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(encoder->device);
    if (encoder->stream) cudaStreamSynchronize(encoder->stream), cudaStreamDestroy(encoder->stream);
    cudaFree(encoder->scratch);
    cudaFreeHost(encoder->host_out);
    pthread_mutex_destroy(&encoder->lock);
    cudaSetDevice(previous);
    free(encoder);
}

extern "C" __attribute__((visibility("default"))) tr_encoder *tr_encoder_create(int device, const void *const *weights,
                                                                                int count, float eps, int blocks,
                                                                                char *error, int error_bytes) {
    if (!weights || count != TR_ENCODER_POINTERS) {
        if (error && error_bytes > 0)
            snprintf(error, (size_t)error_bytes, "expected %d weight pointers, got %d", TR_ENCODER_POINTERS, count);
        return nullptr;
    }
    for (int i = 0; i < count; ++i) {
        if (!weights[i] || ((uintptr_t)weights[i] % 16) != 0) {
            if (error && error_bytes > 0) snprintf(error, (size_t)error_bytes, "weight %d is null or not 16-byte aligned", i);
            return nullptr;
        }
    }
    int previous = 0;
    cudaGetDevice(&previous);
    cudaError_t status = cudaSetDevice(device);
    if (status != cudaSuccess) {
        say(error, error_bytes, "cudaSetDevice", status);
        return nullptr;
    }
    tr_encoder *encoder = (tr_encoder *)calloc(1, sizeof(tr_encoder));
    encoder->device = device;
    pthread_mutex_init(&encoder->lock, nullptr);
    int cooperative = 0, multiprocessors = 0, per_sm = 0;
    cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device);
    cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device);
    int shared_most = 0;
    cudaDeviceGetAttribute(&shared_most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    const bool wide = shared_most >= shared_bytes(2);
    encoder->kernel = wide ? (const void *)encode<2> : (const void *)encode<1>;
    encoder->shared_bytes = shared_bytes(wide ? 2 : 1);
    status = cudaFuncSetAttribute(encoder->kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, encoder->shared_bytes);
    if (status == cudaSuccess) {
        status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, encoder->kernel, THREADS, encoder->shared_bytes);
    }
    const char *failed = nullptr;
    if (shared_most < shared_bytes(1)) {
        failed = "this GPU lends a block too little shared memory for the encoder";
    } else if (status != cudaSuccess) {
        failed = "cudaOccupancyMaxActiveBlocksPerMultiprocessor";
    } else if (!cooperative || per_sm < 1) {
        failed = "this GPU cannot run the encoder's cooperative kernel";
    } else {
        const int most = per_sm * multiprocessors;
        encoder->blocks = blocks <= 0 ? multiprocessors : (blocks < most ? blocks : most);
        const size_t floats = (size_t)MAX_TOKENS * (H + H + 3 * H + H + FFN);
        if ((status = cudaMalloc(&encoder->scratch, floats * sizeof(float))) != cudaSuccess) {
            failed = "cudaMalloc";
        } else if ((status = cudaHostAlloc(&encoder->host_out, H * sizeof(float), cudaHostAllocMapped)) != cudaSuccess) {
            failed = "cudaHostAlloc";
        } else if ((status = cudaStreamCreateWithFlags(&encoder->stream, cudaStreamNonBlocking)) != cudaSuccess) {
            failed = "cudaStreamCreate";
        }
    }
    if (!failed) {
        Args &a = encoder->args;
        memcpy(a.weights, weights, sizeof(a.weights));
        a.eps = eps;
        a.pre = encoder->scratch;
        a.normed = a.pre + (size_t)MAX_TOKENS * H;
        a.qkv = a.normed + (size_t)MAX_TOKENS * H;
        a.context = a.qkv + (size_t)MAX_TOKENS * 3 * H;
        a.inner = a.context + (size_t)MAX_TOKENS * H;
        void *device_out = nullptr;
        if ((status = cudaHostGetDevicePointer(&device_out, encoder->host_out, 0)) != cudaSuccess) {
            failed = "cudaHostGetDevicePointer";
        }
        a.out = (float *)device_out;
    }
    if (failed) {
        say(error, error_bytes, failed, status);
        tr_encoder_destroy(encoder);
        cudaSetDevice(previous);
        return nullptr;
    }
    cudaSetDevice(previous);
    return encoder;
}

extern "C" __attribute__((visibility("default"))) int tr_encoder_blocks(const tr_encoder *encoder) {
    return encoder ? encoder->blocks : 0;
}

extern "C" __attribute__((visibility("default"))) int tr_encoder_embed(tr_encoder *encoder, const int32_t *ids,
                                                                       int tokens, float *out, char *error,
                                                                       int error_bytes) {
    if (!encoder || !ids || !out) {
        if (error && error_bytes > 0) snprintf(error, (size_t)error_bytes, "the encoder, ids and out must not be NULL");
        return -1;
    }
    if (tokens < 1 || tokens > MAX_TOKENS) {
        if (error && error_bytes > 0)
            snprintf(error, (size_t)error_bytes, "a query of %d tokens: the encoder takes 1 to %d", tokens, MAX_TOKENS);
        return -1;
    }
    pthread_mutex_lock(&encoder->lock);
    int previous = 0;
    cudaGetDevice(&previous);
    if (previous != encoder->device) cudaSetDevice(encoder->device);
    Args &a = encoder->args;
    memcpy(a.ids, ids, (size_t)tokens * sizeof(int32_t));
    a.tokens = tokens;
    void *params[] = {&a};
    cudaError_t status = cudaLaunchCooperativeKernel(encoder->kernel, dim3(encoder->blocks), dim3(THREADS), params,
                                                     encoder->shared_bytes, encoder->stream);
    if (status == cudaSuccess) status = cudaStreamSynchronize(encoder->stream);
    if (status == cudaSuccess) memcpy(out, encoder->host_out, H * sizeof(float));
    if (previous != encoder->device) cudaSetDevice(previous);
    pthread_mutex_unlock(&encoder->lock);
    if (status != cudaSuccess) {
        say(error, error_bytes, "the encoder kernel", status);
        return -1;
    }
    return 0;
}
