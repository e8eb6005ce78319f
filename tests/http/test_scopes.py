"""Tokens and their scopes: without a token this server takes, nothing but health, readiness, the page and the OpenAPI
document answers; a token scoped to ["users", "alice"] reads, searches, lists, counts, gets, replaces and deletes
only under that prefix, on every endpoint, whatever it names (bob's ids, a wider prefix, a where filter that tries
to reach past the store's namespace condition)."""
from __future__ import annotations

import json

import pytest

from http_helpers import ADMIN, ALICE, bearer, unit

ADMIN_H, ALICE_H = bearer(ADMIN), bearer(ALICE)


@pytest.fixture
def seeded(client):
    """alice's two memories, bob's one and one elsewhere; returns {text: id_str}."""
    ids = {}
    for namespace, texts, first in ((["users", "alice"], ["alice likes tea", "alice has a cat"], 0),
                                    (["users", "bob"], ["bob's secret"], 0), ("shared", ["a shared note"], 0)):
        body = {"memories": [{"text": t, "vector": unit(first + i)} for i, t in enumerate(texts)],
                "namespace": namespace}
        got = client.post("/v1/memories", json=body, headers=ADMIN_H).json()
        ids.update(zip(texts, got["id_strs"]))
    return ids


def test_every_data_endpoint_needs_a_token_the_server_takes(client):
    calls = [("post", "/v1/memories", {"memories": [{"text": "x", "vector": unit(0)}]}),
             ("post", "/v1/search", {"vector": unit(0)}), ("post", "/v1/memories/get", {"ids": [1]}),
             ("post", "/v1/memories/delete", {"ids": [1]}), ("get", "/v1/memories/1", None),
             ("delete", "/v1/memories/1", None), ("get", "/v1/memories", None), ("get", "/v1/count", None),
             ("get", "/v1/namespaces", None), ("get", "/v1/stats", None), ("get", "/metrics", None)]
    for headers in ({}, bearer("not-a-token-this-server-takes"), {"Authorization": f"Basic {ADMIN}"}):
        for method, path, body in calls:
            r = client.request(method, path, json=body, headers=headers)
            assert r.status_code == 401, (method, path, headers, r.text)
            assert r.headers["www-authenticate"] == "Bearer" and r.json()["error"] == "unauthorized"
    for path in ("/health", "/ready", "/", "/openapi.json", "/browser/app.js"):
        assert client.get(path).status_code == 200, path


def test_a_scoped_token_reads_only_under_its_prefix(client, seeded):
    names = client.get("/v1/namespaces", headers=ALICE_H).json()
    assert [n["namespace"] for n in names["namespaces"]] == ["users/alice"] and names["memories"] == 2
    assert client.get("/v1/count", headers=ALICE_H).json() == {"count": 2}
    assert client.get("/v1/count", params={"namespace": "users/alice"}, headers=ALICE_H).json() == {"count": 2}
    page = client.get("/v1/memories", params={"limit": 100}, headers=ALICE_H).json()["memories"]
    assert sorted(m["text"] for m in page) == ["alice has a cat", "alice likes tea"]
    hits = client.post("/v1/search", json={"vector": unit(0), "k": 10}, headers=ALICE_H).json()["hits"]
    assert sorted(h["text"] for h in hits) == ["alice has a cat", "alice likes tea"]
    inside = client.post("/v1/search", json={"vector": unit(0), "namespace_prefix": ["users", "alice"]},
                         headers=ALICE_H)
    assert inside.status_code == 200
    mine = seeded["alice likes tea"]
    assert client.get(f"/v1/memories/{mine}", headers=ALICE_H).json()["text"] == "alice likes tea"


@pytest.mark.parametrize("namespace", ["users/bob", ["users", "bob"], ["users"], "shared", "users/alice2"])
def test_a_scoped_token_cannot_name_another_namespace(client, seeded, namespace):
    query = namespace if isinstance(namespace, str) else json.dumps(namespace)
    refusals = [
        client.post("/v1/search", json={"vector": unit(0), "namespace": namespace}, headers=ALICE_H),
        client.post("/v1/search", json={"vector": unit(0), "namespace_prefix": namespace}, headers=ALICE_H),
        client.post("/v1/memories", json={"memories": [{"text": "x", "vector": unit(0)}], "namespace": namespace},
                    headers=ALICE_H),
        client.get("/v1/count", params={"namespace": query}, headers=ALICE_H),
        client.get("/v1/count", params={"namespace_prefix": query}, headers=ALICE_H),
        client.get("/v1/memories", params={"namespace": query}, headers=ALICE_H),
    ]
    for r in refusals:
        assert r.status_code == 403, r.text
        assert "outside this token's namespaces" in r.json()["message"] and '["users", "alice"]' in r.json()["message"]
    assert client.get("/v1/count", headers=ADMIN_H).json() == {"count": 4}  # nothing was added


def test_a_scoped_token_cannot_get_replace_or_delete_by_id_outside(client, seeded):
    bobs = seeded["bob's secret"]
    assert client.get(f"/v1/memories/{bobs}", headers=ALICE_H).status_code == 404
    assert client.post("/v1/memories/get", json={"ids": [bobs]}, headers=ALICE_H).json() == {
        "memories": [], "missing": [bobs]}
    assert client.delete(f"/v1/memories/{bobs}", headers=ALICE_H).status_code == 404
    both = client.post("/v1/memories/delete", json={"ids": [bobs, seeded["alice has a cat"]]}, headers=ALICE_H)
    assert both.json() == {"deleted": 1, "asked": 2, "missing": [bobs]}
    takeover = {"memories": [{"text": "now alice's", "vector": unit(0), "id": bobs}], "namespace": "users/alice"}
    r = client.post("/v1/memories", json=takeover, headers=ALICE_H)
    assert r.status_code == 404 and "may not replace" in r.json()["message"]
    assert client.get(f"/v1/memories/{bobs}", headers=ADMIN_H).json()["text"] == "bob's secret"


def test_a_where_filter_cannot_reach_past_the_scope(client, seeded):
    for where in ("1=1) OR (1=1", "text = 'x' OR 1=1) OR (namespace = 'users/bob'", "1=1 -- ", "1=1 /* x */"):
        r = client.post("/v1/search", json={"vector": unit(0), "k": 10, "where": where}, headers=ALICE_H)
        assert r.status_code == 400, (where, r.text)
    quoted = client.post("/v1/search", json={"vector": unit(0), "k": 10, "where": "text != ')('"}, headers=ALICE_H)
    assert sorted(h["text"] for h in quoted.json()["hits"]) == ["alice has a cat", "alice likes tea"]
    bob = client.post("/v1/search", json={"vector": unit(0), "k": 10, "where": "namespace = 'users/bob'"},
                      headers=ALICE_H)
    assert bob.json()["hits"] == []


def test_a_scoped_token_may_not_read_the_whole_stores_stats_or_metrics(client, seeded):
    for path in ("/v1/stats", "/metrics"):
        r = client.get(path, headers=ALICE_H)
        assert r.status_code == 403 and "whole store" in r.json()["message"]
        assert client.get(path, headers=ADMIN_H).status_code == 200
