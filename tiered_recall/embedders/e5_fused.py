"""Runs one query through libtrencoder, E5's encoder as one cooperative CUDA kernel (native/src/cuda/encoder.cu), on
weights laid out here in torch tensors on the GPU. The constants mirror native/include/tiered_recall/encoder.h
(tests/native/test_encoder_layout.py checks them against the compiled library)."""
from __future__ import annotations

import ctypes as C
from functools import lru_cache

import numpy as np

from ..errors import InvalidInput
from ..native_files import installed_file
from .e5_weights import EncoderUnavailable

LIBRARY = "libtrencoder.so"
QUERY_PATHS = ("auto", "fused", "graphs")  # how a GPU embeds one query (E5Embedder's gpu_queries)
ABI_VERSION = 1
HIDDEN, HEADS, FFN, LAYERS = 384, 12, 1536, 12
MAX_TOKENS = 128  # a longer query is the torch encoder's to run
GLOBAL_ORDER = ("WORDS", "POSITIONS", "EMB_GAMMA", "EMB_BETA")
LAYER_ORDER = ("QKV", "QKV_BIAS", "AO", "ALN_GAMMA", "ALN_BETA", "FI", "FI_BIAS", "FO", "OLN_GAMMA", "OLN_BETA")
POINTERS = len(GLOBAL_ORDER) + LAYERS * len(LAYER_ORDER)
_ERROR_BYTES = 512


class FusedEncoderUnavailable(EncoderUnavailable):
    """libtrencoder is not installed (installed False), or cannot run on this GPU (installed True)."""


@lru_cache(maxsize=1)
def encoder_library() -> C.CDLL:
    """libtrencoder loaded once, with its calls' types set; FusedEncoderUnavailable when it is not installed (a build
    without the CUDA toolkit) or is from another build than this package."""
    path = installed_file(LIBRARY)
    if path is None:
        raise FusedEncoderUnavailable(
            f"{LIBRARY} is not installed next to the package: the package was built without the CUDA toolkit; install "
            "it (nvcc) and reinstall the package, or pass gpu_queries='graphs'", installed=False)
    lib = C.CDLL(str(path))
    lib.tr_encoder_abi_version.restype = C.c_uint32
    lib.tr_encoder_abi_version.argtypes = []
    lib.tr_encoder_layout_json.restype = C.c_char_p
    lib.tr_encoder_layout_json.argtypes = []
    lib.tr_encoder_create.restype = C.c_void_p
    lib.tr_encoder_create.argtypes = [C.c_int, C.POINTER(C.c_void_p), C.c_int, C.c_float, C.c_int, C.c_char_p,
                                      C.c_int]
    lib.tr_encoder_embed.restype = C.c_int
    lib.tr_encoder_embed.argtypes = [C.c_void_p, C.c_void_p, C.c_int, C.c_void_p, C.c_char_p, C.c_int]
    lib.tr_encoder_blocks.restype = C.c_int
    lib.tr_encoder_blocks.argtypes = [C.c_void_p]
    lib.tr_encoder_destroy.restype = None
    lib.tr_encoder_destroy.argtypes = [C.c_void_p]
    if lib.tr_encoder_abi_version() != ABI_VERSION:
        raise FusedEncoderUnavailable(f"{path} has ABI {lib.tr_encoder_abi_version()}, the package {ABI_VERSION}: "
                                      "reinstall the package so both come from one build", installed=True)
    return lib


class FusedQueryEncoder:
    """One query's ids -> its unit mean-pooled vector, by one kernel launch. Built from the folded layers
    (e5_torch.folded_layers, float64), the embedding norm, the position + type rows, and the word table already on
    the device (float16, one row per token id); all are kept alive here as long as the encoder is."""

    def __init__(self, torch, device, *, word_table, positions: np.ndarray, embedding_norm, layers, eps: float,
                 blocks: int = 0) -> None:
        if word_table.shape[1] != HIDDEN or len(layers) != LAYERS or layers[0]["fi"].shape != (FFN, HIDDEN):
            raise FusedEncoderUnavailable(f"the fused encoder runs a {LAYERS}-layer, {HIDDEN}-wide model with "
                                          f"{FFN} feed-forward units; this one is {len(layers)} x "
                                          f"{word_table.shape[1]} x {layers[0]['fi'].shape[0]}", installed=True)
        lib = encoder_library()
        self._lib = lib

        def on_device(array: np.ndarray, dtype):
            return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)).to(device, dtype).contiguous()

        f16, f32 = torch.float16, torch.float32
        tensors = [word_table.contiguous(), on_device(positions[:MAX_TOKENS], f32),
                   on_device(embedding_norm[0], f32), on_device(embedding_norm[1], f32)]
        for layer in layers:
            tensors += [on_device(layer["qkv"], f16), on_device(layer["qkv_b"], f32), on_device(layer["ao"], f16),
                        on_device(layer["aln"][0], f32), on_device(layer["aln"][1], f32),
                        on_device(layer["fi"], f16), on_device(layer["fi_b"], f32), on_device(layer["fo"], f16),
                        on_device(layer["oln"][0], f32), on_device(layer["oln"][1], f32)]
        assert len(tensors) == POINTERS
        self._tensors = tensors
        torch.cuda.synchronize(device)  # the kernel runs on its own stream: the weights must be written first
        pointers = (C.c_void_p * POINTERS)(*[t.data_ptr() for t in tensors])
        error = C.create_string_buffer(_ERROR_BYTES)
        handle = lib.tr_encoder_create(device.index, pointers, POINTERS, eps, blocks, error, _ERROR_BYTES)
        if not handle:
            raise FusedEncoderUnavailable(f"the fused encoder cannot run on {device}: {error.value.decode()}; pass "
                                          "gpu_queries='graphs'", installed=True)
        self._handle = handle
        self.blocks = lib.tr_encoder_blocks(handle)

    def one(self, ids: list[int]) -> np.ndarray:
        """One query's token ids (at most MAX_TOKENS) -> (1, hidden) float32, unit length. Calls are serialised in
        the library; the returned array is the caller's."""
        tokens = len(ids)
        if not 1 <= tokens <= MAX_TOKENS:
            raise InvalidInput(f"the fused encoder takes 1 to {MAX_TOKENS} tokens, got {tokens}")
        ids_buffer = np.asarray(ids, dtype=np.int32)
        out = np.empty((1, HIDDEN), dtype=np.float32)
        error = C.create_string_buffer(_ERROR_BYTES)
        if self._lib.tr_encoder_embed(self._handle, ids_buffer.ctypes.data, tokens, out.ctypes.data, error,
                                      _ERROR_BYTES) != 0:
            raise RuntimeError(f"the fused E5 encoder failed: {error.value.decode()}")
        return out

    def close(self) -> None:
        """Frees the library's encoder (its scratch memory and stream); the weights go with this object."""
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._lib.tr_encoder_destroy(handle)

    __del__ = close
