"""The embedder contract: the Embedder protocol (query and passage sides), the checks on texts and rows, and the
adapter that makes any callable (or another object with the two sides) an Embedder."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import InvalidInput

@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit-norm float32 rows, with one call for each side of a search.

    name: a stable identifier (stored with memories so a changed embedder is noticed).
    dim: the row width.
    embed_passages(texts) -> (len(texts), dim): what is stored (add, ingest).
    embed_queries(texts) -> (len(texts), dim): what is searched with. An asymmetric model (E5 writes "query: "
        and "passage: " before the text) needs the two to differ; a symmetric one returns the same rows for both.
    __call__(texts) is embed_passages, so an embedder also works where a plain callable is expected.
    Every row is float32, C-contiguous and of unit L2 norm.
    """

    name: str
    dim: int

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        """The rows of what is stored."""
        ...

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """The rows of what is searched with."""
        ...

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


class CallableEmbedder:
    """Wraps any callable texts -> (n, d) array (or two: one per side); checks its output and normalises the rows.

    fn: embeds passages, and queries too unless query_fn is given.
    query_fn: embeds queries, for an asymmetric model.
    dim: the expected width; when None it is found by embedding one probe text at construction.
    """

    def __init__(
        self, fn: Callable[[list[str]], Any], *, query_fn: Callable[[list[str]], Any] | None = None,
        dim: int | None = None, name: str | None = None,
    ) -> None:
        for label, function in (("embedder", fn), ("query_fn", query_fn)):
            if function is not None and not callable(function):
                raise InvalidInput(f"{label} must be callable (texts -> (n, d) array), got {type(function).__name__}")
        self._fn = fn
        self._query_fn = query_fn or fn
        self.name = name or f"callable:{getattr(fn, '__qualname__', type(fn).__name__)}"
        if dim is None:
            dim = int(self._checked_output(self._fn, ["dimension probe"], expected_dim=None).shape[1])
        elif not isinstance(dim, int) or dim < 1:
            raise InvalidInput(f"dim must be a positive int, got {dim!r}")
        self.dim = dim

    def _checked_output(self, fn: Callable[[list[str]], Any], texts: list[str], *,
                        expected_dim: int | None) -> np.ndarray:
        output = fn(texts)
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

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        """fn's rows for the texts, checked and normalised."""
        return self._checked_output(self._fn, validate_texts(texts), expected_dim=self.dim)

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """query_fn's rows (fn's when none was given) for the texts, checked and normalised."""
        return self._checked_output(self._query_fn, validate_texts(texts), expected_dim=self.dim)

    __call__ = embed_passages

    def __repr__(self) -> str:
        return f"CallableEmbedder(name={self.name!r}, dim={self.dim})"
