"""libtrencoder refuses bad calls with a message and a failure code, never a crash: what it checks before it touches
the GPU runs on any machine the library loads on."""
from __future__ import annotations

import ctypes as C
import os

import numpy as np
import pytest

from tiered_recall.embedders import e5_fused
from tiered_recall.native_files import installed_file


@pytest.fixture(scope="module")
def lib():
    if installed_file(e5_fused.LIBRARY) is None:
        pytest.skip(f"{e5_fused.LIBRARY} is built only with the CUDA toolkit (test_encoder_layout checks it is there "
                    "when the CUDA backend is)")
    return e5_fused.encoder_library()


def _create(lib, pointers, count: int):
    error = C.create_string_buffer(256)
    array = (C.c_void_p * max(1, len(pointers)))(*pointers)
    return lib.tr_encoder_create(0, array, count, 1e-12, 0, error, 256), error.value.decode()


def test_create_names_what_is_wrong_with_the_weights(lib) -> None:
    handle, message = _create(lib, [4096] * e5_fused.POINTERS, 5)
    assert not handle and message == f"expected {e5_fused.POINTERS} weight pointers, got 5"
    pointers = [4096] * e5_fused.POINTERS
    pointers[7] = 4104  # 8-byte aligned only
    handle, message = _create(lib, pointers, e5_fused.POINTERS)
    assert not handle and message == "weight 7 is null or not 16-byte aligned"
    pointers[7] = None
    handle, message = _create(lib, pointers, e5_fused.POINTERS)
    assert not handle and message == "weight 7 is null or not 16-byte aligned"


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia/version"), reason="a machine without an NVIDIA driver")
def test_create_without_a_gpu_says_so(lib) -> None:
    handle, message = _create(lib, [4096] * e5_fused.POINTERS, e5_fused.POINTERS)
    assert not handle and message.startswith("cudaSetDevice: ")


def test_embed_refuses_bad_calls(lib) -> None:
    ids = np.arange(4, dtype=np.int32)
    out = np.zeros(e5_fused.HIDDEN, dtype=np.float32)
    error = C.create_string_buffer(256)
    assert lib.tr_encoder_embed(None, ids.ctypes.data, 4, out.ctypes.data, error, 256) == -1
    assert error.value.decode() == "the encoder, ids and out must not be NULL"
    fake = C.c_void_p(4096)  # never dereferenced: the token count is checked first
    for tokens in (0, -1, e5_fused.MAX_TOKENS + 1):
        assert lib.tr_encoder_embed(fake, ids.ctypes.data, tokens, out.ctypes.data, error, 256) == -1
        assert error.value.decode() == f"a query of {tokens} tokens: the encoder takes 1 to {e5_fused.MAX_TOKENS}"
    lib.tr_encoder_destroy(None)
    assert lib.tr_encoder_blocks(None) == 0
