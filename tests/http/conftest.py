"""Fixtures of the HTTP tests: a real store in the test's folder (raw 8-wide vectors, or texts with the fast preset),
the app over it through FastAPI's TestClient, and the same app served by uvicorn on a free port in a thread."""
from __future__ import annotations

import pytest

from fastapi.testclient import TestClient

from http_helpers import DIM, LiveServer, scoped_settings
from tiered_recall.http import create_app

@pytest.fixture
def vector_store(tmp_path, stop_sidecar_after):
    """A store of raw 8-wide vectors (no embedder) with a CPU hot tier, closed after the test."""
    from tiered_recall import TieredMemory

    path = tmp_path / "vectors"
    stop_sidecar_after(path)
    memory = TieredMemory(path, dim=DIM, embedder=None, device="cpu", orphan_grace_s=2.0)
    yield memory
    memory.close()


@pytest.fixture
def text_store(tmp_path, stop_sidecar_after):
    """A store of texts with the fast preset (WordLlama: microseconds an embedding, weights in its wheel)."""
    from tiered_recall import TieredMemory

    path = tmp_path / "texts"
    stop_sidecar_after(path)
    memory = TieredMemory(path, preset="fast", device="cpu", orphan_grace_s=2.0)
    yield memory
    memory.close()


@pytest.fixture
def client(vector_store):
    """A TestClient of the app over the vector store, with the admin and alice tokens."""
    with TestClient(create_app(vector_store, settings=scoped_settings())) as test_client:
        yield test_client


@pytest.fixture
def serve():
    """serve(app) -> LiveServer; every server is stopped after the test."""
    started = []

    def _serve(app) -> LiveServer:
        server = LiveServer(app)
        started.append(server)
        return server

    yield _serve
    for server in started:
        server.stop()
