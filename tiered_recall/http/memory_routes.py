"""The endpoints over memories: add, search, get and delete (one or a batch), a namespace's memories a page at a time
(newest first), counts and namespaces. Each checks the request once (in the request's JSON spelling), keeps a
scoped token inside its namespaces, and calls the store's public methods in a worker thread (FastAPI runs a plain
def endpoint there), so that the event loop never waits on the store. Search and get, an agent's hot path, are
async endpoints that make that one hop themselves and write their JSON answer directly: FastAPI would hop to a
thread again to check the answer against its model, which costs more than the hot search itself."""
from __future__ import annotations

import functools
import json
from collections import deque
from typing import Any, Optional

import numpy as np
from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from ..namespaces import namespace_labels, under_prefix
from .access import Access, reach
from .convert import cursor_key, finite, hit_json, memory_json, namespace_param, parse_cursor
from ..coordinator.validate import MAX_ID
from .models import (MAX_PAGE, AddRequest, Added, Counted, Deleted, Found, Got, IdsRequest, Namespaces, Page,
                     SearchRequest, StoredMemory, id_range, timestamp)
from .problems import BadInput, NotFound, responses

router = APIRouter(prefix="/v1", tags=["memories"])
# Every endpoint that takes a body can be refused for its size, a token's scope or a store that cannot serve.
COMMON = (401, 403, 413, 422, 503)
NAMESPACE_QUERY = ("A namespace name (users/alice), or a JSON list of labels ([\"users\",\"alice\"]), URL-encoded.")
# The route takes digits only ({memory_id:int}), so that /memories/get and /memories/delete are never read as ids.
ID_PATH = Path(description="A memory id.", ge=0, le=MAX_ID)


def answer(body: dict) -> Response:
    """A JSON answer written as it is (its shape is the endpoint's response model, which the tests check)."""
    return Response(json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")),
                    media_type="application/json")


async def in_thread(method, *args: Any, **kwargs: Any) -> Any:
    """A store call in a worker thread."""
    return await run_in_threadpool(functools.partial(method, *args, **kwargs))


def _dim(store: Any) -> Optional[int]:
    return getattr(store, "dim", None)


def _check_vector(vector: list[float], store: Any, field: str) -> None:
    dim = _dim(store)
    if dim is not None and len(vector) != dim:
        raise BadInput(f"{field} has {len(vector)} numbers; this store's vectors have {dim}")
    if not any(vector):
        raise BadInput(f"{field} is all zeros: a vector needs a direction to be stored or searched by")


@router.post("/memories", summary="Add memories", responses=responses(400, 409, *COMMON))
def add(body: AddRequest, request: Request) -> Added:
    """Stores one memory or a batch in one namespace, durable on disk when the answer comes; gives their ids in the
    order sent. A memory of an id that exists is replaced (an upsert): adds by id are idempotent."""
    access, store = reach(request)
    name = access.namespace(body.namespace)
    rows = body.memories
    for what in ("text", "vector", "id"):
        given = [getattr(row, what) is not None for row in rows]
        if any(given) and not all(given):
            missing = given.index(False)
            raise BadInput(f"memories[{missing}].{what} is missing: give every memory of a batch a {what}, or none")
    if rows[0].text is None and rows[0].vector is None:
        raise BadInput("memories[0] has neither text nor vector: give the text to remember (or your own vector)")
    for i, row in enumerate(rows):
        if row.vector is not None:
            _check_vector(row.vector, store, f"memories[{i}].vector")
        if row.text is not None and not row.text.strip():
            raise BadInput(f"memories[{i}].text is blank: give it content or leave the memory out")
        for key in row.metadata or {}:
            if key.startswith("_tr_"):
                raise BadInput(f"memories[{i}].metadata key {key!r}: keys starting with _tr_ are the store's own "
                               "(a memory's expiry): use ttl for an expiry and another key for your data")
    ids = None if rows[0].id is None else [row.id for row in rows]
    if ids is not None:
        _check_ids(ids, "memories[{i}].id")
        if len(set(ids)) != len(ids):
            raise BadInput("memories[].id repeats within one add: give each memory its own id")
        if not access.whole_store:  # an upsert must not take over a memory outside the token's namespaces
            for i, found in enumerate(store.get(ids)):
                if found is not None and not access.covers(found.namespace):
                    raise NotFound(f"memories[{i}].id {ids[i]} is the id of a memory this token may not replace: "
                                   "choose another id, or leave ids out for new ones")
    vectors = None if rows[0].vector is None else np.asarray([row.vector for row in rows], dtype=np.float32)
    added = store.add(None if rows[0].text is None else [row.text for row in rows], vectors=vectors, namespace=name,
                      ids=ids, session=[row.session for row in rows], role=[row.role for row in rows],
                      metadata=[row.metadata for row in rows],
                      created_at=[timestamp(row.created_at) for row in rows], ttl=body.ttl)
    return Added(ids=added, id_strs=[str(i) for i in added], namespace=name, labels=list(namespace_labels(name)))


@router.post("/search", summary="Search memories", response_model=Found, responses=responses(400, *COMMON))
async def search(body: SearchRequest, request: Request) -> Response:
    """The k memories closest to a text or a vector, best first, each with its score and the tier that served it;
    in one namespace, under a prefix, or everywhere the token reaches. With explain, the rule that decided the
    answer, the tiers read and the store's time."""
    access, store = reach(request)
    if (body.query is None) == (body.vector is None):
        raise BadInput("give query (the text to look for) or vector (your own embedding), one of the two")
    if body.namespace is not None and body.namespace_prefix is not None:
        raise BadInput("give namespace (one namespace) or namespace_prefix (every namespace under it), not both")
    if body.vector is not None:
        _check_vector(body.vector, store, "vector")
        for flag in ("hybrid", "stages"):
            if getattr(body, flag):
                raise BadInput(f"{flag} ranks texts: it needs query, not vector")
    namespace, prefix = access.search_scope(body.namespace, body.namespace_prefix)
    query = body.query if body.query is not None else np.asarray(body.vector, dtype=np.float32)
    report = await in_thread(store.search, query, k=body.k, namespace=namespace, namespace_prefix=prefix,
                             where=body.where, hybrid=body.hybrid, stages=body.stages, explain=True)
    hits = report.hits if access.whole_store else [h for h in report.hits if access.covers(h.namespace)]
    found: dict[str, Any] = {"hits": [hit_json(h) for h in hits]}
    if body.explain:
        found.update(rule=report.rule, path=report.path, seconds=finite(report.seconds),
                     hot_kth=finite(report.hot_kth), cold_bound=finite(report.cold_bound))
    else:
        found.update(rule=None, path=None, seconds=None, hot_kth=None, cold_bound=None)
    return answer(found)


def _check_ids(ids: list[int], field: str) -> None:
    fault = id_range(ids, field)
    if fault is not None:
        raise BadInput(fault)


def _get(ids: list[int], access: Access, store: Any) -> list:
    _check_ids(ids, "ids[{i}]")
    return access.readable(store.get(ids))


@router.post("/memories/get", summary="Get memories by id", response_model=Got, responses=responses(400, *COMMON))
async def get_many(body: IdsRequest, request: Request) -> Response:
    """Memories by id, in the order asked; the ids with no memory (or none the token may read) are listed apart."""
    access, store = reach(request)
    found = await in_thread(_get, body.ids, access, store)
    return answer({"memories": [memory_json(m) for m in found if m is not None],
                   "missing": [str(i) for i, m in zip(body.ids, found) if m is None]})


@router.get("/memories/{memory_id:int}", summary="Get one memory", response_model=StoredMemory,
            responses=responses(400, 404, 401, 403, 422, 503))
async def get_one(request: Request, memory_id: int = ID_PATH) -> Response:
    """One memory by id; 404 when there is none (or none the token may read)."""
    access, store = reach(request)
    found = (await in_thread(_get, [memory_id], access, store))[0]
    if found is None:
        raise NotFound(f"no memory with id {memory_id}")
    return answer(memory_json(found))


def _delete(ids: list[int], access: Access, store: Any) -> Deleted:
    # read first: delete says how many it removed, not which, and a scoped token may only remove its own
    found = _get(ids, access, store)
    present = [i for i, m in zip(ids, found) if m is not None]
    deleted = store.delete(present) if present else 0
    return Deleted(deleted=deleted, asked=len(ids), missing=[str(i) for i, m in zip(ids, found) if m is None])


@router.post("/memories/delete", summary="Delete memories by id", responses=responses(400, 409, *COMMON))
def delete_many(body: IdsRequest, request: Request) -> Deleted:
    """Forgets memories by id, from both tiers; says how many there were. An id with no memory (or none the token
    may delete) is skipped and listed in missing."""
    access, store = reach(request)
    return _delete(body.ids, access, store)


@router.delete("/memories/{memory_id:int}", summary="Delete one memory",
               responses=responses(404, 409, 401, 403, 422, 503))
def delete_one(request: Request, memory_id: int = ID_PATH) -> Deleted:
    """Forgets one memory, from both tiers; 404 when there is none (or none the token may delete)."""
    access, store = reach(request)
    done = _delete([memory_id], access, store)
    if done.deleted == 0:
        raise NotFound(f"no memory with id {memory_id}")
    return done


@router.get("/memories", summary="List a namespace's memories, newest first",
            responses=responses(400, 401, 403, 422, 503))
def list_memories(request: Request, namespace: Optional[str] = Query(None, min_length=1, max_length=2048, description=NAMESPACE_QUERY + " Left "
                                          "out: every namespace the token reaches."),
         limit: int = Query(50, ge=1, le=MAX_PAGE, description=f"Memories on the page, 1 to {MAX_PAGE}."),
         cursor: Optional[str] = Query(None, max_length=64, pattern="^[0-9]+-[0-9]+$",
                                       description="The next_cursor of the page before; left out: the newest.")) -> Page:
    """One page of memories, newest first (ties by id, highest first); pass next_cursor back for the next page. A
    page reads through the namespace's memories (oldest first, as the store keeps them), so its time grows with
    the namespace."""
    access, store = reach(request)
    name = None if namespace is None else access.namespace(namespace_param(namespace, "namespace"))
    before = parse_cursor(cursor)
    kept: deque = deque(maxlen=limit + 1)
    for memory in store.memories(name):
        if name is None and not access.covers(memory.namespace):
            continue
        if before is None or cursor_key(memory) < before:
            kept.append(memory)
    more = len(kept) > limit
    shown = list(reversed(kept))[:limit]
    next_cursor = "%d-%d" % cursor_key(shown[-1]) if more and shown else None
    return Page(memories=[memory_json(m) for m in shown], next_cursor=next_cursor)


@router.get("/count", summary="Count memories", responses=responses(400, 401, 403, 422, 503))
def count(request: Request, namespace: Optional[str] = Query(None, min_length=1, max_length=2048, description=NAMESPACE_QUERY),
          namespace_prefix: Optional[str] = Query(None, min_length=1, max_length=2048,
                                                  description="Every namespace under this prefix. " + NAMESPACE_QUERY)) -> Counted:
    """Memories in one namespace, under a prefix, or (neither given) in every namespace the token reaches."""
    access, store = reach(request)
    if namespace is not None and namespace_prefix is not None:
        raise BadInput("give namespace or namespace_prefix, not both")
    name, prefix = access.search_scope(namespace_param(namespace, "namespace"),
                                       namespace_param(namespace_prefix, "namespace_prefix"))
    if name is not None:
        return Counted(count=store.count(name))
    if prefix is None:
        return Counted(count=store.count())
    return Counted(count=sum(v["memories"] for n, v in store.namespaces().items() if under_prefix(n, prefix)))


@router.get("/namespaces", summary="List namespaces", responses=responses(401, 422, 503))
def namespaces(request: Request) -> Namespaces:
    """Every namespace the token reaches, by name, with its memories and how many of them are hot now."""
    access, store = reach(request)
    listed = [{"namespace": n, "labels": list(namespace_labels(n)), "memories": int(v["memories"]), "hot": int(v["hot"])}
              for n, v in store.namespaces().items() if access.covers(n)]
    return Namespaces.model_validate({"namespaces": listed, "memories": sum(x["memories"] for x in listed)})

