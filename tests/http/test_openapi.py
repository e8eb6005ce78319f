"""The OpenAPI document: the one served at /openapi.json is the one committed in docs/openapi.json (regenerate it with
`python -m tiered_recall.http.openapi docs/openapi.json`), and schemathesis, generating requests from it against a
real store, finds no server error and no answer that the document does not describe."""
from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config._auth import AuthConfig  # not re-exported by schemathesis.config

from http_helpers import ADMIN, DIM, LiveServer, bearer, scoped_settings, stop_sidecar, unit
from tiered_recall.http import create_app
from tiered_recall.http.openapi import openapi_document, render

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
REGENERATE = "python -m tiered_recall.http.openapi docs/openapi.json"
# Requests per operation: a short run in CI (13 operations, a few hundred requests in all); set
# TR_SCHEMATHESIS_EXAMPLES=500 for a long one.
EXAMPLES = int(os.environ.get("TR_SCHEMATHESIS_EXAMPLES", "25"))


def test_the_served_document_is_the_committed_one(client):
    served = client.get("/openapi.json").json()
    assert served == openapi_document()
    assert render(served) == COMMITTED.read_text(encoding="utf-8"), f"docs/openapi.json is stale: {REGENERATE}"


def test_the_document_describes_every_answer_of_every_operation():
    document = openapi_document()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            assert operation.get("description") and operation.get("summary"), (method, path)
            if path.startswith("/v1/"):
                assert {"401", "422", "503"} <= set(operation["responses"]), (method, path)
                assert operation["security"] == [{"HTTPBearer": []}], (method, path)
    schemas = document["components"]["schemas"]
    assert schemas["SearchRequest"]["additionalProperties"] is False
    assert schemas["SearchRequest"]["properties"]["k"]["maximum"] == 256


@pytest.fixture(scope="module")
def live_api(tmp_path_factory):
    """The app over a store holding a few memories, served by uvicorn on a free port for the whole module."""
    from tiered_recall import TieredMemory

    memory = TieredMemory(tmp_path_factory.mktemp("schemathesis") / "store", dim=DIM, embedder=None, device="cpu",
                          orphan_grace_s=2.0)
    server = LiveServer(create_app(memory, settings=scoped_settings()))
    try:
        body = {"memories": [{"text": f"memory {i}", "vector": unit(i), "id": i} for i in range(4)],
                "namespace": ["users", "alice"]}
        assert httpx.post(f"{server.url}/v1/memories", json=body, headers=bearer(ADMIN)).status_code == 200
        yield server.url
    finally:
        server.stop()
        memory.close()
        stop_sidecar(memory)


# Loaded from the document the app serves (the test above checks that it is the committed one): making it needs no
# store, so the operations are known when pytest collects this module.
schema = schemathesis.openapi.from_dict(openapi_document())
schema.config.auth = AuthConfig(openapi={"HTTPBearer": {"bearer": ADMIN}})  # also sent without it, expecting 401
# A request too large for the server is rejected too, before its fields are read: 413 (documented) counts as one.
rejection = schema.config.checks.negative_data_rejection
rejection.expected_statuses = [*rejection.expected_statuses, "413"]
# A request the document allows may still be one the store refuses with a 400 that says why: a vector of another
# width than the store's, a text for a store of raw vectors, a where filter that is not SQL. No document made before
# a store is opened can say those.
acceptance = schema.config.checks.positive_data_acceptance
acceptance.expected_statuses = [*acceptance.expected_statuses, "400"]


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_schemathesis_finds_no_server_error_and_no_undocumented_answer(case, live_api):
    case.call_and_validate(base_url=live_api)
