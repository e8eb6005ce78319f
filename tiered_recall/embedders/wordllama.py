"""WordLlama l2_supercat: static token embeddings averaged, microseconds a text on a CPU; its weights ship in the
wordllama wheel (the `fast` preset's embedder)."""
from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInput
from .base import normalize_rows, validate_texts

# WordLlama's l2_supercat model ships only its 256-d weights in the wheel; smaller dims are
# Matryoshka truncations of them (the only ones the model was trained to support).
WORDLLAMA_DIMS = (64, 128, 256)


def _wordllama_package_folder() -> str:
    with _root_logger_kept():
        import wordllama

    return os.path.dirname(os.path.abspath(wordllama.__file__))


@contextlib.contextmanager
def _root_logger_kept() -> Iterator[None]:
    """Puts the root logger's level and handlers back as they were: importing wordllama calls
    logging.basicConfig(level=INFO), which would turn on INFO output (FAISS's loader lines among it) for the whole
    application that uses this store."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        yield
    finally:
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)


@functools.lru_cache(maxsize=None)
def _load_wordllama(dim: int) -> Any:
    # A plain WordLlama.load() looks for the tokenizer in the wrong folder and falls back to a hub
    # download (DESIGN.md); pointing cache_dir at the package folder finds the shipped files.
    with _root_logger_kept():
        from wordllama import WordLlama

    trunc_dim = None if dim == 256 else dim
    try:
        return WordLlama.load(
            cache_dir=_wordllama_package_folder(), disable_download=True, dim=256, trunc_dim=trunc_dim
        )
    except FileNotFoundError as error:
        raise InvalidInput(
            f"WordLlama weights not found in the installed wordllama package ({error}); "
            "reinstall it: pip install --force-reinstall 'wordllama>=0.4.0.post1'"
        ) from error


class WordLlamaEmbedder:
    """WordLlama l2_supercat, static token embeddings averaged; fast on CPU, offline.

    dim: 256 (the shipped weights) or a truncation to 128 / 64.
    batch_size: texts per padded matrix; texts are sorted by length first so padding stays small.
    """

    def __init__(self, *, dim: int = 256, batch_size: int = 64) -> None:
        if dim not in WORDLLAMA_DIMS:
            raise InvalidInput(f"WordLlama dim must be one of {WORDLLAMA_DIMS}, got {dim!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidInput(f"batch_size must be a positive int, got {batch_size!r}")
        self.dim = dim
        self.batch_size = batch_size
        self.name = f"wordllama-l2_supercat-{dim}"
        self._model = _load_wordllama(dim)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        """Unit rows for the texts (queries are embedded the same way)."""
        checked = validate_texts(texts)
        # Padding is per chunk, so grouping similar lengths makes each chunk's matrix small.
        order = np.argsort([len(text) for text in checked], kind="stable")
        ordered = [checked[i] for i in order]
        raw = self._model.embed(ordered, norm=False, batch_size=self.batch_size)
        result = np.empty_like(raw)
        result[order] = raw
        return normalize_rows(result, source=self.name)

    # A symmetric model: a query is embedded as any text is.
    embed_queries = embed_passages
    __call__ = embed_passages

    def __repr__(self) -> str:
        return f"WordLlamaEmbedder(dim={self.dim})"
