"""The JSON bodies of the HTTP API, as pydantic models: what each endpoint takes and gives back, so that the OpenAPI
document (docs/openapi.json) says exactly what a client may send. Request models are strict (no "5" for 5, no
unknown fields, no NaN): a malformed request is a 422 that names the field, never a guess."""
from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Annotated, Any, Optional, Union

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from ..coordinator.validate import MAX_ID, MAX_K

# How many memories one add, get or delete takes, and one page of the browser's list at most.
MAX_BATCH = 1000
MAX_PAGE = 500
DIGITS = re.compile(r"[0-9]{1,19}")


def _whole(value: Any) -> Any:
    """A JSON number with no fraction (135.0) as the integer it is: JSON Schema's "integer" takes it."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _id_value(value: Union[int, str]) -> int:
    if isinstance(value, str):
        if not DIGITS.fullmatch(value):
            raise ValueError("an id is an integer or a string of digits, e.g. \"4611686018427387904\"")
        value = int(value)
    if value < 0:
        raise ValueError("an id is between 0 and 2**63 - 1 (9223372036854775807)")
    return value  # past 2**63 - 1: refused by the endpoint (id_range), since JSON tools read the schema's maximum
    # as a float, which takes a few values past it


def id_range(ids: list[int], field: str) -> None:
    """BadInput-worthy: the first id past 2**63 - 1, as a message naming its field; None when all fit."""
    for i, value in enumerate(ids):
        if value > MAX_ID:
            return f"{field.format(i=i)} is {value}, past the largest id, 2**63 - 1 (9223372036854775807)"
    return None


# Ranges and patterns are in the schema and checked here again: pydantic's own message for a union names both branches.
MemoryId = Annotated[
    Union[
        Annotated[int, WithJsonSchema({"type": "integer", "minimum": 0, "maximum": MAX_ID})],
        Annotated[str, WithJsonSchema({"type": "string", "pattern": "^[0-9]{1,19}$"})],
    ],
    BeforeValidator(_whole),
    AfterValidator(_id_value),
    Field(description="A memory id: an integer, or the same digits as a string (exact where JavaScript numbers lose "
                      "digits past 2**53: send back the id_str the API gives)."),
]

Label = Annotated[str, Field(min_length=1, max_length=256)]
Namespace = Annotated[
    Union[Annotated[str, Field(min_length=1, max_length=256)], Annotated[list[Label], Field(min_length=1,
                                                                                           max_length=64)]],
    Field(description="A namespace: a name (\"alice\"), or a list of labels ([\"users\", \"alice\"]), the same as "
                      "the name of its labels joined by \"/\" (\"users/alice\"). At most 256 bytes in all."),
]


def _iso_time(value: str) -> str:
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError("created_at is epoch seconds (a number) or an ISO 8601 time such as "
                         "\"2026-12-07T10:00:00Z\"") from None
    return value


Time = Annotated[Union[float, Annotated[str, AfterValidator(_iso_time), WithJsonSchema(
    {"type": "string", "format": "date-time"})]], Field(
    description="When it was said: epoch seconds, or an ISO 8601 time (UTC where no offset is given).")]


def timestamp(value: Union[float, str, None]) -> Union[float, datetime, None]:
    """A Time as TieredMemory takes it: epoch seconds as they are, an ISO 8601 string as a datetime (UTC if naive)."""
    if not isinstance(value, str):
        return value
    moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


class Strict(BaseModel):
    """A request body: strict types, no unknown fields (a misspelt field is an error, not ignored), finite numbers."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


# ---- requests ------------------------------------------------------------------------------------
class NewMemory(Strict):
    """One memory to store."""

    text: Optional[Annotated[str, Field(min_length=1, max_length=1_000_000)]] = Field(
        None, description="The text to remember (embedded by the store unless a vector is given). Needed unless "
                          "the store takes raw vectors.")
    vector: Optional[Annotated[list[float], Field(min_length=1, max_length=8192)]] = Field(
        None, description="Your own embedding of the store's width (normalised by the store); give one for every "
                          "memory of the batch or for none.")
    id: Optional[MemoryId] = Field(None, description="Your own id: a memory of this id is replaced (an upsert). "
                                                     "Give one for every memory of the batch or for none.")
    role: Optional[Annotated[str, Field(max_length=256)]] = Field(
        None, description="Who said it: user, assistant, a name.")
    session: Optional[Annotated[str, Field(max_length=256)]] = Field(
        None, description="Session or conversation id.")
    metadata: Optional[dict[str, Any]] = Field(None, description="A JSON object stored with the memory.")
    created_at: Optional[Time] = None


class AddRequest(Strict):
    """Memories to store in one namespace: durable on disk when the answer comes."""

    memories: Annotated[list[NewMemory], Field(min_length=1, max_length=MAX_BATCH)] = Field(
        description=f"The memories, 1 to {MAX_BATCH}.")
    namespace: Namespace = "default"
    ttl: Optional[Annotated[float, Field(gt=0)]] = Field(
        None, description="Seconds until these memories expire (never returned after); left out: never.")


class SearchRequest(Strict):
    """A search: by text (embedded by the store) or by vector, in one namespace, under a prefix, or everywhere."""

    query: Optional[Annotated[str, Field(min_length=1, max_length=100_000)]] = Field(
        None, description="What to look for, in words. Give query or vector.")
    vector: Optional[Annotated[list[float], Field(min_length=1, max_length=8192)]] = Field(
        None, description="A query vector of the store's width. Give query or vector.")
    k: Annotated[int, BeforeValidator(_whole)] = Field(10, ge=1, le=MAX_K, description=f"How many hits, 1 to {MAX_K}.")
    namespace: Optional[Namespace] = Field(None, description="Only this namespace.")
    namespace_prefix: Optional[Namespace] = Field(
        None, description="Every namespace under these labels ([\"users\"] takes [\"users\", \"alice\"]). Not "
                          "with namespace.")
    where: Optional[Annotated[str, Field(min_length=1, max_length=10_000)]] = Field(
        None, description="A SQL filter over id, session, role, created_at and metadata (its JSON text), e.g. "
                          "\"role = 'user'\" or \"metadata LIKE '%chat%'\".")
    stages: Optional[bool] = Field(
        None, description="Text queries: run the store's retrieval stages (BM25 fusion, neighbouring turns, "
                          "temporal cues; null: the preset's) or only the vector search (false).")
    hybrid: bool = Field(False, description="Text queries: the cold tier's BM25 fused with the vector ranking "
                                            "instead of the stages.")
    explain: bool = Field(False, description="Also say how the answer was found: rule, path, seconds, hot_kth, "
                                             "cold_bound.")


class IdsRequest(Strict):
    """Memories by id."""

    ids: Annotated[list[MemoryId], Field(min_length=1, max_length=MAX_BATCH)] = Field(
        description=f"Memory ids, 1 to {MAX_BATCH}, as integers or strings of digits.")


# ---- answers -------------------------------------------------------------------------------------
class StoredMemory(BaseModel):
    """One memory: its id as an integer and as a string (id_str, exact in JavaScript), times in ISO 8601 UTC."""

    id: int = Field(description="The id (up to 2**63 - 1: read id_str in JavaScript).")
    id_str: str = Field(description="The id as a string of digits.")
    text: str
    namespace: str = Field(description="The namespace's name (labels joined by \"/\").")
    labels: list[str] = Field(description="The namespace as its labels.")
    session: Optional[str]
    role: Optional[str]
    created_at: str = Field(description="When it was said, ISO 8601 UTC.")
    metadata: dict[str, Any]
    expires_at: Optional[str] = Field(description="When it expires (ISO 8601 UTC), null for never.")
    ttl_s: Optional[float] = Field(description="Its time to live in seconds, null for never.")


class FoundMemory(StoredMemory):
    """One search hit: a memory, its score and the tier that served it."""

    score: float = Field(description="Cosine similarity to the query, or the retrieval stages' score (best 1).")
    tier: str = Field(description="Which tier served it: hot (the sidecar's memory) or cold (on disk).")


class Added(BaseModel):
    """The ids of the memories stored, in the order sent."""

    ids: list[int]
    id_strs: list[str]
    namespace: str
    labels: list[str]


class Found(BaseModel):
    """Search hits, best first; with explain, how the answer was found."""

    hits: list[FoundMemory]
    rule: Optional[str] = Field(None, description="What decided the answer: complete, bound or threshold (the hot "
                                                  "tier alone), cold, no-spare-core, no-hot or hybrid.")
    path: Optional[str] = Field(None, description="Which tiers were read: hot, hot+cold or cold.")
    seconds: Optional[float] = Field(None, description="The store's time for the search (without HTTP).")
    hot_kth: Optional[float] = Field(None, description="The hot tier's k-th score, when it was asked.")
    cold_bound: Optional[float] = Field(None, description="The best score a cold-only memory could reach (rule "
                                                          "bound), when evaluated.")


class Got(BaseModel):
    """The memories found, in the order asked, and the ids with no memory (or none this token may read)."""

    memories: list[StoredMemory]
    missing: list[str]


class Deleted(BaseModel):
    """How many of the ids asked for were memories, now removed from both tiers."""

    deleted: int
    asked: int
    missing: list[str] = Field(description="Ids with no memory (or none this token may delete): nothing done.")


class Counted(BaseModel):
    """Memories in a namespace, under a prefix, or in every namespace this token may read."""

    count: int


class NamespaceCount(BaseModel):
    """A namespace with its memories and how many of them the hot tier holds now."""

    namespace: str
    labels: list[str]
    memories: int
    hot: int


class Namespaces(BaseModel):
    """Every namespace this token may read, by name, and their memories in all."""

    namespaces: list[NamespaceCount]
    memories: int


class Page(BaseModel):
    """One page of a namespace's memories, newest first."""

    memories: list[StoredMemory]
    next_cursor: Optional[str] = Field(description="Pass as cursor for the next (older) page; null at the end.")


class Health(BaseModel):
    """The process answers."""

    status: str


class Readiness(BaseModel):
    """Whether the store serves, and the state of its hot tier."""

    ready: bool
    hot_tier: Optional[str] = Field(description="The hot tier's backend (cpu, cuda), or null when there is none "
                                                "now (searches are then served by the cold tier, exact and slower).")
    hot_error: Optional[str] = Field(description="Why there is no hot tier, when there is none.")
    message: Optional[str] = Field(None, description="Why the store does not serve, when it does not.")


class FieldProblem(BaseModel):
    """One field that a request got wrong."""

    field: str = Field(description="Where: the JSON field (memories[0].text), or the query or path parameter.")
    message: str


class Problem(BaseModel):
    """Every error: what kind, and a message that says how to fix the request."""

    error: str = Field(description="The kind: invalid_request, invalid_input, unauthorized, forbidden, not_found, "
                                   "too_large, read_only, conflict, unavailable, internal.")
    message: str
    fields: Optional[list[FieldProblem]] = Field(None, description="For invalid_request: each field at fault.")
