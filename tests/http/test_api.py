"""The HTTP API as a client uses it (FastAPI's TestClient over a real store): add, search, get, delete, pages, counts,
namespaces, stats, health, readiness, metrics; ids exact as strings; every bad input a 4xx that names the field."""
from __future__ import annotations

import json
import time

from fastapi.testclient import TestClient

from tiered_recall.http import HttpSettings, create_app

from http_helpers import ADMIN, DIM, TEST_HOSTS, bearer, unit

H = bearer(ADMIN)
BIG_ID = (1 << 63) - 7  # past 2**53: a JavaScript number would round it


def add(client, texts, namespace="default", **more):
    memories = [{"text": t, "vector": unit(i), **more} for i, t in enumerate(texts)]
    r = client.post("/v1/memories", json={"memories": memories, "namespace": namespace}, headers=H)
    assert r.status_code == 200, r.text
    return r.json()


def test_add_search_get_delete_round_trip(client):
    added = add(client, ["Ana is vegetarian", "The review moved to the 21st"], ["users", "alice"], role="user",
                metadata={"source": "chat"})
    assert added["namespace"] == "users/alice" and added["labels"] == ["users", "alice"]
    assert added["id_strs"] == [str(i) for i in added["ids"]]
    r = client.post("/v1/search", json={"vector": unit(1), "k": 2, "namespace": ["users", "alice"],
                                         "explain": True}, headers=H)
    found = r.json()
    assert r.status_code == 200, r.text
    assert [h["text"] for h in found["hits"]] == ["The review moved to the 21st", "Ana is vegetarian"]
    assert found["hits"][0]["score"] > 0.99 and found["hits"][0]["tier"] in ("hot", "cold")
    assert found["rule"] in ("complete", "bound", "cold", "no-spare-core") and found["seconds"] > 0
    assert found["hits"][0]["role"] == "user" and found["hits"][0]["metadata"] == {"source": "chat"}
    plain = client.post("/v1/search", json={"vector": unit(1), "k": 1}, headers=H).json()
    assert plain["rule"] is None and len(plain["hits"]) == 1  # without explain: the hits alone
    first = added["id_strs"][0]
    got = client.get(f"/v1/memories/{first}", headers=H)
    assert got.status_code == 200 and got.json()["text"] == "Ana is vegetarian"
    assert client.delete(f"/v1/memories/{first}", headers=H).json() == {"deleted": 1, "asked": 1, "missing": []}
    assert client.get(f"/v1/memories/{first}", headers=H).status_code == 404
    assert client.delete(f"/v1/memories/{first}", headers=H).status_code == 404
    assert client.get("/v1/count", headers=H).json() == {"count": 1}


def test_ids_past_2_to_the_53_are_exact_as_strings_and_adds_by_id_are_upserts(client):
    body = {"memories": [{"text": "first", "vector": unit(0), "id": str(BIG_ID)}], "namespace": "n"}
    assert client.post("/v1/memories", json=body, headers=H).json()["id_strs"] == [str(BIG_ID)]
    body["memories"][0]["text"] = "second"
    client.post("/v1/memories", json=body, headers=H)
    got = client.post("/v1/memories/get", json={"ids": [str(BIG_ID), BIG_ID - 1]}, headers=H).json()
    assert [m["text"] for m in got["memories"]] == ["second"] and got["missing"] == [str(BIG_ID - 1)]
    assert got["memories"][0]["id_str"] == str(BIG_ID)
    assert client.get("/v1/count", params={"namespace": "n"}, headers=H).json() == {"count": 1}
    gone = client.post("/v1/memories/delete", json={"ids": [str(BIG_ID), "5"]}, headers=H).json()
    assert gone == {"deleted": 1, "asked": 2, "missing": ["5"]}


def test_a_namespace_pages_newest_first_with_a_cursor(client):
    body = {"memories": [{"text": f"m{i}", "vector": unit(i), "created_at": 1_700_000_000 + i} for i in range(7)],
            "namespace": ["users", "alice"]}
    client.post("/v1/memories", json=body, headers=H)
    add(client, ["elsewhere"], "bob")
    seen, cursor = [], None
    while True:
        params = {"namespace": json.dumps(["users", "alice"]), "limit": 3, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/memories", params=params, headers=H).json()
        seen.append([m["text"] for m in page["memories"]])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [["m6", "m5", "m4"], ["m3", "m2", "m1"], ["m0"]]
    everything = client.get("/v1/memories", params={"limit": 500}, headers=H).json()["memories"]
    assert everything[0]["text"] == "elsewhere" and len(everything) == 8  # no namespace: every one
    by_name = client.get("/v1/memories", params={"namespace": "users/alice", "limit": 1}, headers=H).json()
    assert by_name["memories"][0]["text"] == "m6"


def test_created_at_takes_epoch_seconds_and_iso_times(client):
    body = {"memories": [{"text": "a", "vector": unit(0), "created_at": "2026-12-07T10:00:00Z"},
                         {"text": "b", "vector": unit(1), "created_at": 1_765_101_600.5}], "namespace": "t"}
    ids = client.post("/v1/memories", json=body, headers=H).json()["id_strs"]
    got = client.post("/v1/memories/get", json={"ids": ids}, headers=H).json()["memories"]
    assert [m["created_at"] for m in got] == ["2026-12-07T10:00:00+00:00", "2025-12-07T10:00:00.500000+00:00"]


def test_ttl_expires_memories(client, wall_clock):
    body = {"memories": [{"text": "short-lived", "vector": unit(0)}], "namespace": "t", "ttl": 30}
    memory_id = client.post("/v1/memories", json=body, headers=H).json()["id_strs"][0]
    assert client.get(f"/v1/memories/{memory_id}", headers=H).json()["ttl_s"] == 30
    wall_clock(31)
    assert client.get(f"/v1/memories/{memory_id}", headers=H).status_code == 404
    assert client.post("/v1/search", json={"vector": unit(0), "namespace": "t"}, headers=H).json()["hits"] == []


def test_namespaces_count_and_prefix_search(client):
    add(client, ["a1", "a2"], ["users", "alice"])
    add(client, ["b1"], ["users", "bob"])
    add(client, ["x"], "other")
    listed = client.get("/v1/namespaces", headers=H).json()
    assert [(n["namespace"], n["labels"], n["memories"]) for n in listed["namespaces"]] == [
        ("other", ["other"], 1), ("users/alice", ["users", "alice"], 2), ("users/bob", ["users", "bob"], 1)]
    assert listed["memories"] == 4
    assert client.get("/v1/count", params={"namespace_prefix": '["users"]'}, headers=H).json() == {"count": 3}
    assert client.get("/v1/count", params={"namespace": "users/bob"}, headers=H).json() == {"count": 1}
    hits = client.post("/v1/search", json={"vector": unit(0), "k": 10, "namespace_prefix": ["users"]},
                       headers=H).json()["hits"]
    assert sorted(h["text"] for h in hits) == ["a1", "a2", "b1"]
    where = client.post("/v1/search", json={"vector": unit(0), "k": 10, "where": "text = 'a2'"}, headers=H).json()
    assert [h["text"] for h in where["hits"]] == ["a2"]


def test_text_search_runs_the_stages_or_not(text_store):
    with TestClient(create_app(text_store, settings=HttpSettings(allowed_hosts=TEST_HOSTS))) as client:
        client.post("/v1/memories", json={"memories": [{"text": "My cat is called Miso"},
                                                       {"text": "The review moved to the 21st"}], "namespace": "a"})
        for stages in (None, False):
            found = client.post("/v1/search", json={"query": "what is the cat's name?", "k": 1, "stages": stages,
                                                    "explain": True}).json()
            assert found["hits"][0]["text"] == "My cat is called Miso", found
        hybrid = client.post("/v1/search", json={"query": "Miso", "hybrid": True, "explain": True}).json()
        assert hybrid["rule"] == "hybrid" and hybrid["hits"][0]["text"] == "My cat is called Miso"


def test_stats_health_readiness_and_metrics(client):
    add(client, ["one"])
    client.post("/v1/search", json={"vector": unit(0)}, headers=H)
    stats = client.get("/v1/stats", headers=H).json()
    assert stats["cold_rows"] == 1 and stats["dim"] == DIM and stats["hot_backend"] == "cpu"
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").json() == {"ready": True, "hot_tier": "cpu", "hot_error": None, "message": None}
    deadline = time.monotonic() + 10  # each process writes its counts about once a second
    wanted = ("tiered_recall_added_rows_total 1.0", 'tiered_recall_search_seconds_count{path=')
    while not all(w in (text := client.get("/metrics", headers=H).text) for w in wanted):
        assert time.monotonic() < deadline, text
        time.sleep(0.2)


def test_readiness_says_when_the_store_does_not_serve(vector_store):
    client = TestClient(create_app(vector_store, settings=HttpSettings(allowed_hosts=TEST_HOSTS)))
    vector_store.close()
    r = client.get("/ready")
    assert r.status_code == 503 and r.json()["ready"] is False and "closed" in r.json()["message"]


def test_bad_inputs_are_4xx_that_name_the_field(client):
    cases = [
        ({"memories": []}, "/v1/memories", 422, "memories"),
        ({"memories": [{"text": "x", "vector": unit(0)}], "namespce": "a"}, "/v1/memories", 422, "namespce"),
        ({"memories": [{"text": "x", "vector": [1.0] * 3}]}, "/v1/memories", 400,
         f"memories[0].vector has 3 numbers; this store's vectors have {DIM}"),
        ({"memories": [{"text": "x", "vector": unit(0)}, {"text": "y"}]}, "/v1/memories", 400,
         "memories[1].vector is missing"),
        ({"memories": [{"text": "x", "vector": unit(0), "metadata": {"_tr_ttl_s": 1}}]}, "/v1/memories", 400,
         "_tr_"),
        ({"memories": [{"text": "x", "vector": unit(0), "created_at": "yesterday"}]}, "/v1/memories", 422,
         "ISO 8601"),
        ({"memories": [{"text": "x", "vector": unit(0), "id": "12a"}]}, "/v1/memories", 422, "memories[0].id"),
        ({"memories": [{"text": "x", "vector": unit(0)}], "namespace": ""}, "/v1/memories", 422, "namespace"),
        ({"memories": [{"text": "x", "vector": unit(0)}], "namespace": "n" * 300}, "/v1/memories", 422,
         "namespace"),
        ({"vector": unit(0), "k": 257}, "/v1/search", 422, "k"),
        ({"vector": unit(0), "k": "5"}, "/v1/search", 422, "k"),
        ({"query": "x", "vector": unit(0)}, "/v1/search", 400, "give query"),
        ({}, "/v1/search", 400, "give query"),
        ({"vector": unit(0), "namespace": "a", "namespace_prefix": "a"}, "/v1/search", 400, "not both"),
        ({"vector": unit(0), "hybrid": True}, "/v1/search", 400, "hybrid ranks texts"),
        ({"vector": [0.0] * DIM}, "/v1/search", 400, "all zeros"),
        ({"vector": unit(0), "where": "no such column = 1"}, "/v1/search", 400, "the where filter"),
        ({"vector": unit(0), "where": "1=1) OR (1=1"}, "/v1/search", 400, "closes a parenthesis"),
        ({"query": "words"}, "/v1/search", 400, "no embedder"),
        ({"ids": []}, "/v1/memories/get", 422, "ids"),
        ({"ids": [str(1 << 63)]}, "/v1/memories/delete", 400, "ids[0] is 9223372036854775808, past the largest"),
        ({"ids": [-1]}, "/v1/memories/get", 422, "ids[0]"),
        ({"vector": unit(0), "k": 3.0}, "/v1/search", 200, ""),
    ]
    for body, path, status, words in cases:
        r = client.post(path, json=body, headers=H)
        assert r.status_code == status, (body, r.text)
        if status >= 400:
            assert words in r.json()["message"], (body, r.json())
            assert set(r.json()) <= {"error", "message", "fields"}
    nan = client.post("/v1/search", content=b'{"vector": [NaN, 1, 0, 0, 0, 0, 0, 0]}',
                      headers={**H, "Content-Type": "application/json"})
    assert nan.status_code == 422 and "vector[0]" in nan.json()["message"]
    assert client.post("/v1/search", content=b"{", headers={**H, "Content-Type": "application/json"}
                       ).status_code == 422
    assert client.get("/v1/memories/123x", headers=H).status_code == 404  # not an id: no such endpoint
    assert client.get(f"/v1/memories/{1 << 63}", headers=H).status_code == 422
    assert client.get("/v1/memories", params={"cursor": "x"}, headers=H).status_code == 422
    assert client.get("/v1/count", params={"namespace": "[1]"}, headers=H).status_code == 400
    assert client.get("/nowhere", headers=H).json()["error"] == "not_found"
    assert client.get("/nowhere").status_code == 401  # no token: nothing is said, not even what exists
    assert client.put("/v1/search", headers=H).status_code == 405


def test_request_bodies_over_the_limit_are_413(vector_store):
    settings = HttpSettings(allowed_hosts=TEST_HOSTS, max_body_bytes=4096)
    with TestClient(create_app(vector_store, settings=settings)) as client:
        body = {"memories": [{"text": "x" * 5000, "vector": unit(0)}]}
        assert client.post("/v1/memories", json=body).status_code == 413

        def chunks():  # no Content-Length: counted as it comes
            yield b'{"memories": [{"text": "'
            for _ in range(10):
                yield b"y" * 1000
            yield b'"}]}'

        r = client.post("/v1/memories", content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and "4096 bytes" in r.json()["message"]
        assert vector_store.count() == 0


def test_a_loopback_server_takes_only_loopback_host_names(vector_store):
    client = TestClient(create_app(vector_store), base_url="http://localhost:8765")
    assert client.get("/health").status_code == 200
    rebound = client.get("/v1/count", headers={"Host": "attacker.example:8765"})
    assert rebound.status_code == 421 and "attacker.example" in rebound.json()["message"]
    assert TestClient(create_app(vector_store), base_url="http://[::1]:8765").get("/health").status_code == 200


def test_cors_is_off_unless_an_origin_is_configured(vector_store):
    preflight = {"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    closed = TestClient(create_app(vector_store, settings=HttpSettings(allowed_hosts=TEST_HOSTS)))
    assert "access-control-allow-origin" not in closed.options("/v1/search", headers=preflight).headers
    opened = TestClient(create_app(vector_store, settings=HttpSettings(
        allowed_hosts=TEST_HOSTS, cors_origins=("https://app.example.com",))))
    answer = opened.options("/v1/search", headers=preflight)
    assert answer.headers["access-control-allow-origin"] == "https://app.example.com"
    other = opened.options("/v1/search", headers={**preflight, "Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers


def test_the_page_is_served_with_its_script_and_style(client):
    page = client.get("/")
    assert page.status_code == 200 and '<script type="module" src="/browser/app.js">' in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert "async function api(" in client.get("/browser/app.js").text
    assert client.get("/browser/style.css").status_code == 200


def test_a_bug_is_a_plain_500_with_no_traceback(caplog):
    class Broken:
        """A store whose count fails the way a bug does (not a TieredRecallError)."""

        def count(self, namespace=None):
            raise RuntimeError("secret internals /home/x/store.py line 9")

    client = TestClient(create_app(Broken(), settings=HttpSettings(allowed_hosts=TEST_HOSTS)),
                        raise_server_exceptions=False)
    r = client.get("/v1/count")
    assert r.status_code == 500 and r.json() == {
        "error": "internal", "message": "the server failed on this request (a bug: its log has the details)"}
    assert "secret internals" not in r.text
    assert any("GET /v1/count failed" in record.getMessage() for record in caplog.records)
