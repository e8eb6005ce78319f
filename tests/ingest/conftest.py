"""The ingest tests' shared fixtures: one small WordLlama embedder per test module, and a fresh recording store."""
from __future__ import annotations

import pytest

from ingest_fakes import FakeMemory
from tiered_recall.embedders import WordLlamaEmbedder


@pytest.fixture(scope="module")
def embedder() -> WordLlamaEmbedder:
    return WordLlamaEmbedder(dim=64)


@pytest.fixture
def memory(embedder: WordLlamaEmbedder) -> FakeMemory:
    return FakeMemory(embedder)
