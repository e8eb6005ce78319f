"""Runs the E5 encoder on the CPU through libtrcpuencoder (native/src/cpu_encoder/), token ids in: int8 matrix
products with AVX-512 VNNI on the weights onnxruntime's graph multiplies by. The constants mirror
native/include/tiered_recall/cpu_encoder.h (tests/native/test_cpu_encoder.py checks them against the library)."""
from __future__ import annotations

import ctypes as C
import os
import platform
import warnings
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np

from ..errors import InvalidInput
from ..native_files import installed_file
from .e5_weights import E5Weights, EncoderUnavailable, int8_columns

LIBRARY = "libtrcpuencoder.so"
ABI_VERSION = 2
HIDDEN, HEADS, FFN, LAYERS = 384, 12, 1536, 12
MAX_TOKENS = 512
GLOBAL_ORDER = ("EMB_GAMMA", "EMB_BETA")
LAYER_ORDER = ("QKV", "QKV_SCALE", "QKV_BIAS", "AO", "AO_SCALE", "AO_BIAS", "ALN_GAMMA", "ALN_BETA", "FI", "FI_SCALE",
               "FI_BIAS", "FO", "FO_SCALE", "FO_BIAS", "OLN_GAMMA", "OLN_BETA")
POINTERS = len(GLOBAL_ORDER) + LAYERS * len(LAYER_ORDER)
# Threads one query's matrix products and attention are shared among: a query of 16 tokens is 340 M multiply-adds,
# 1.7 ms on one core of the 2-core machine and 1.3-1.5 on two (docs/recall.md).
QUERY_THREADS = 2
# Tokens per call when embedding many texts: the activations of a call (about 19 KB a token) stay in the caches.
BATCH_TOKENS = 1024
_ERROR_BYTES = 512


class CpuEncoderUnavailable(EncoderUnavailable):
    """libtrcpuencoder is not installed (installed False), or this CPU lacks its instructions (installed True)."""


@lru_cache(maxsize=1)
def cpu_encoder_library() -> C.CDLL:
    """libtrcpuencoder loaded once, with its calls' types set; CpuEncoderUnavailable when it is not installed (a build
    for another processor) or is from another build than this package."""
    path = installed_file(LIBRARY)
    if path is None:
        raise CpuEncoderUnavailable(f"{LIBRARY} is not installed next to the package (it is built on x86-64 only): "
                                    "reinstall the package (pip install --force-reinstall tiered-recall), or pass "
                                    "backend='onnx'", installed=False)
    lib = C.CDLL(str(path))
    lib.tr_cpu_encoder_abi_version.restype = C.c_uint32
    lib.tr_cpu_encoder_abi_version.argtypes = []
    lib.tr_cpu_encoder_layout_json.restype = C.c_char_p
    lib.tr_cpu_encoder_layout_json.argtypes = []
    lib.tr_cpu_encoder_supported.restype = C.c_int
    lib.tr_cpu_encoder_supported.argtypes = []
    lib.tr_cpu_encoder_create.restype = C.c_void_p
    lib.tr_cpu_encoder_create.argtypes = [C.POINTER(C.c_void_p), C.c_int, C.c_float, C.c_char_p, C.c_int]
    lib.tr_cpu_encoder_run.restype = C.c_int
    lib.tr_cpu_encoder_run.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p, C.c_int, C.c_int, C.c_int, C.c_void_p,
                                       C.c_char_p, C.c_int]
    lib.tr_cpu_encoder_set_inputs.restype = C.c_int
    lib.tr_cpu_encoder_set_inputs.argtypes = [C.c_void_p, C.c_void_p, C.c_int64, C.c_void_p, C.c_int, C.c_void_p,
                                              C.c_char_p, C.c_int]
    lib.tr_cpu_encoder_run_ids.restype = C.c_int
    lib.tr_cpu_encoder_run_ids.argtypes = lib.tr_cpu_encoder_run.argtypes
    lib.tr_cpu_encoder_destroy.restype = None
    lib.tr_cpu_encoder_destroy.argtypes = [C.c_void_p]
    if lib.tr_cpu_encoder_abi_version() != ABI_VERSION:
        raise CpuEncoderUnavailable(f"{path} has ABI {lib.tr_cpu_encoder_abi_version()}, the package {ABI_VERSION}: "
                                    "reinstall the package so both come from one build", installed=True)
    return lib


def cpu_encoder_runs_here() -> bool:
    """Whether libtrcpuencoder is installed and this CPU has its instructions (AVX-512 VNNI). On x86-64 a missing or
    mismatched library is a broken install, said by a RuntimeWarning that names the fix; a CPU without the
    instructions is not (E5 runs on onnxruntime there, as docs/recall.md says)."""
    try:
        lib = cpu_encoder_library()
    except CpuEncoderUnavailable as error:
        if platform.machine() in ("x86_64", "AMD64"):
            warnings.warn(f"{error}; E5 runs on onnxruntime instead", RuntimeWarning, stacklevel=3)
        return False
    return bool(lib.tr_cpu_encoder_supported())


def layer_arrays(weights: E5Weights) -> list[np.ndarray]:
    """The POINTERS arrays the library reads, in its order: int8 matrices (in, out) with their column scales (the
    quantization onnxruntime's graph uses, e5_weights.int8_columns), float32 biases and layer norms."""
    if (weights.hidden, weights.heads, weights.ffn, weights.layers) != (HIDDEN, HEADS, FFN, LAYERS):
        raise CpuEncoderUnavailable(
            f"libtrcpuencoder runs a {LAYERS}-layer, {HIDDEN}-wide model with {HEADS} heads and {FFN} feed-forward "
            f"units; this one is {weights.layers} x {weights.hidden}, {weights.heads} heads, {weights.ffn}; pass "
            "backend='onnx'", installed=True)
    hidden, ffn = weights.hidden, weights.ffn

    def vector(name: str) -> np.ndarray:
        return np.ascontiguousarray(weights.f32(name), dtype=np.float32)

    arrays = [vector("emb.ln.w"), vector("emb.ln.b")]
    for layer in range(weights.layers):
        p = f"l{layer}"
        qkv = int8_columns(np.concatenate([weights.matrix(f"{p}.{m}.w", hidden) for m in "qkv"]))
        qkv_bias = np.concatenate([weights.f32(f"{p}.{m}.b") for m in "qkv"]).astype(np.float32)
        ao = int8_columns(weights.matrix(f"{p}.ao.w", hidden))
        fi = int8_columns(weights.matrix(f"{p}.fi.w", ffn))
        fo = int8_columns(weights.matrix(f"{p}.fo.w", hidden))
        arrays += [*qkv, qkv_bias, *ao, vector(f"{p}.ao.b"), vector(f"{p}.aln.w"), vector(f"{p}.aln.b"),
                   *fi, vector(f"{p}.fi.b"), *fo, vector(f"{p}.fo.b"), vector(f"{p}.oln.w"), vector(f"{p}.oln.b")]
    return arrays


class CpuEncoder:
    """The encoder in libtrcpuencoder. A batch is split by texts over `threads` threads (default: the cores this
    process may use, at most eight), whose library calls release the GIL and run side by side; one query runs on the
    calling thread and one of the library's helper threads (QUERY_THREADS), which claim its parts one by one, so a
    helper that is not running (a CPU hot tier's sidecar polls on a core right after it answers) leaves its share to
    the caller; one taken off its core mid-part holds the query until that part is done."""

    batch_tokens = BATCH_TOKENS

    def __init__(self, weights: E5Weights, *, threads: int | None = None) -> None:
        lib = cpu_encoder_library()
        if not lib.tr_cpu_encoder_supported():
            raise CpuEncoderUnavailable("this CPU lacks AVX-512 VNNI, which libtrcpuencoder needs; pass "
                                        "backend='onnx'", installed=True)
        arrays = layer_arrays(weights)
        assert len(arrays) == POINTERS
        pointers = (C.c_void_p * POINTERS)(*[array.ctypes.data for array in arrays])
        error = C.create_string_buffer(_ERROR_BYTES)
        handle = lib.tr_cpu_encoder_create(pointers, POINTERS, weights.eps, error, _ERROR_BYTES)
        if not handle:
            raise CpuEncoderUnavailable(f"libtrcpuencoder refused the weights: {error.value.decode()}; pass "
                                        "backend='onnx'", installed=True)
        self._lib, self._handle, self._weights = lib, handle, weights
        # The token tables: the word vectors read in place (this object keeps them), the position and type vectors
        # copied by the library; the token ids' inputs are then made in C, not in numpy on each call.
        self._words = weights.q4_blocks("emb.word", weights.vocabulary)
        positions = np.ascontiguousarray(weights.f32("emb.pos"), dtype=np.float32)
        token_type = np.ascontiguousarray(weights.f32("emb.type")[:HIDDEN], dtype=np.float32)
        if lib.tr_cpu_encoder_set_inputs(handle, self._words.ctypes.data, weights.vocabulary, positions.ctypes.data,
                                         positions.size // HIDDEN, token_type.ctypes.data, error, _ERROR_BYTES) != 0:
            lib.tr_cpu_encoder_destroy(handle)
            self._handle = None
            raise CpuEncoderUnavailable(f"libtrcpuencoder refused the token tables: {error.value.decode()}; pass "
                                        "backend='onnx'", installed=True)
        self.threads = threads or min(8, len(os.sched_getaffinity(0)))
        self.query_threads = min(QUERY_THREADS, self.threads)
        self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix="tiered-recall-e5-cpu") \
            if self.threads > 1 else None

    def _summed(self, token_ids: np.ndarray, mask: np.ndarray, threads: int = 1) -> np.ndarray:
        batch, tokens = mask.shape
        out = np.empty((batch, HIDDEN), dtype=np.float32)
        error = C.create_string_buffer(_ERROR_BYTES)
        if self._lib.tr_cpu_encoder_run_ids(self._handle, token_ids.ctypes.data, mask.ctypes.data, batch, tokens,
                                            threads, out.ctypes.data, error, _ERROR_BYTES) != 0:
            raise InvalidInput(f"the E5 CPU encoder refused the batch: {error.value.decode()}")
        return out

    def mean_pooled(self, token_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """(batch, tokens) int64 ids padded with the pad id, and their int32 mask -> (batch, hidden) float32 means
        of the last hidden states over each text's tokens."""
        if token_ids.shape[1] > MAX_TOKENS:
            raise InvalidInput(f"the E5 CPU encoder takes at most {MAX_TOKENS} tokens a text, got {token_ids.shape[1]}")
        token_ids = np.ascontiguousarray(token_ids, dtype=np.int64)
        mask = np.ascontiguousarray(mask, dtype=np.int32)
        batch = len(mask)
        parts = min(self.threads, batch)
        if batch == 1:
            summed = self._summed(token_ids, mask, self.query_threads)
        elif parts <= 1 or self._pool is None:
            summed = self._summed(token_ids, mask)
        else:
            bounds = np.linspace(0, batch, parts + 1).astype(int)
            others = [self._pool.submit(self._summed, token_ids[a:b], mask[a:b])
                      for a, b in zip(bounds[1:-1], bounds[2:])]
            summed = np.concatenate([self._summed(token_ids[:bounds[1]], mask[:bounds[1]])]
                                    + [other.result() for other in others])
        return summed / mask.sum(axis=1, keepdims=True)

    def one(self, ids: list[int]) -> np.ndarray:
        """One text's token ids -> (1, hidden) float32, its mean-pooled vector."""
        row = np.asarray([ids], dtype=np.int64)
        return self.mean_pooled(row, np.ones(row.shape, dtype=np.int32))

    def close(self) -> None:
        """Frees the library's encoder; the object is unusable after."""
        handle, self._handle = getattr(self, "_handle", None), None
        pool, self._pool = getattr(self, "_pool", None), None
        if pool is not None:
            pool.shutdown(wait=True)
        if handle:
            self._lib.tr_cpu_encoder_destroy(handle)

    __del__ = close
