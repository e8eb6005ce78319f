"""Text embedders: the two-sided Embedder protocol, E5 (the default), WordLlama, MiniLM, and any callable."""
from .base import CallableEmbedder, Embedder, normalize_rows, validate_texts
from .e5 import E5Embedder
from .minilm import MINILM_INSTALL_HINT, MiniLMEmbedder
from .resolve import DEFAULT_EMBEDDER, NAMES, EmbedderSpec, resolve_embedder, spec_of_stored_name
from .wordllama import WORDLLAMA_DIMS, WordLlamaEmbedder

__all__ = [
    "Embedder",
    "E5Embedder",
    "WordLlamaEmbedder",
    "MiniLMEmbedder",
    "CallableEmbedder",
    "EmbedderSpec",
    "DEFAULT_EMBEDDER",
    "NAMES",
    "MINILM_INSTALL_HINT",
    "WORDLLAMA_DIMS",
    "resolve_embedder",
    "spec_of_stored_name",
    "validate_texts",
    "normalize_rows",
]
