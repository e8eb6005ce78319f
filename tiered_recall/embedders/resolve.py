"""Turns what a user passes as `embedder` (a name, an Embedder, a callable, or None) into an Embedder."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import InvalidInput
from .base import CallableEmbedder, Embedder
from .e5 import E5Embedder
from .minilm import MiniLMEmbedder
from .wordllama import WordLlamaEmbedder

EmbedderSpec = Embedder | Callable[[list[str]], Any] | str | None
DEFAULT_EMBEDDER = "e5"  # the `quality` preset's; docs/recall.md gives the figures behind the choice
NAMES = ("e5", "e5:native", "e5:onnx", "e5:torch", "wordllama", "wordllama:128", "wordllama:64", "minilm")


def spec_of_stored_name(name: str) -> str | None:
    """The resolve_embedder name of an embedder that a store recorded by its Embedder.name, when it is one of ours."""
    if name == "multilingual-e5-small-384":
        return "e5"
    if name == "all-minilm-l6-v2-384":
        return "minilm"
    prefix = "wordllama-l2_supercat-"
    if name.startswith(prefix) and name[len(prefix):].isdigit():
        return f"wordllama:{name[len(prefix):]}"
    return None


def resolve_embedder(spec: EmbedderSpec = None) -> Embedder:
    """None (the default, "e5"), a name from NAMES, an Embedder, or a callable -> an Embedder."""
    if spec is None:
        spec = DEFAULT_EMBEDDER
    if isinstance(spec, str):
        kind, _, option = spec.strip().lower().partition(":")
        if kind == "e5":
            if option not in ("", "native", "onnx", "torch"):
                raise InvalidInput(f"embedder {spec!r}: the part after ':' is a backend, 'e5:native', 'e5:onnx' or "
                                   "'e5:torch'")
            return E5Embedder(backend=option or "auto")
        if kind == "wordllama":
            if option and not option.isdigit():
                raise InvalidInput(f"embedder {spec!r}: the part after ':' must be a dim, e.g. 'wordllama:128'")
            return WordLlamaEmbedder(dim=int(option) if option else 256)
        if kind == "minilm" and not option:
            return MiniLMEmbedder()
        raise InvalidInput(f"unknown embedder {spec!r}; use one of {', '.join(NAMES)}, an Embedder or a callable")
    if isinstance(spec, (E5Embedder, WordLlamaEmbedder, MiniLMEmbedder, CallableEmbedder)):
        return spec
    if callable(getattr(spec, "embed_queries", None)) and callable(getattr(spec, "embed_passages", None)):
        dim = getattr(spec, "dim", None)
        if not isinstance(dim, int) or dim < 1:
            raise InvalidInput(f"embedder {spec!r} has dim={dim!r}; it must be a positive int")
        # another two-sided Embedder: its rows are checked and normalised on the way out, like a callable's (the
        # store trusts what its embedder returns)
        return CallableEmbedder(spec.embed_passages, query_fn=spec.embed_queries, dim=dim,
                                name=getattr(spec, "name", None) or type(spec).__name__)
    if callable(spec):
        dim = getattr(spec, "dim", None)
        return CallableEmbedder(spec, dim=dim if isinstance(dim, int) and dim > 0 else None,
                                name=getattr(spec, "name", None) if isinstance(getattr(spec, "name", None), str) else None)
    raise InvalidInput(f"embedder must be a name, an Embedder or a callable, got {type(spec).__name__}")
