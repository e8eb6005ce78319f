"""Every error the HTTP API gives, in one place: the store's TieredRecallError classes and this layer's own to HTTP
statuses, pydantic's validation errors to one message per field in the request's own spelling, and a catch-all that
logs a true bug and answers a plain 500 (no traceback leaves the server). Every error body is a Problem."""
from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import (HotTierFull, IncompatibleLayout, InvalidInput, ReadOnlyStore, SidecarError, SidecarUnavailable,
                      StorageError, TieredRecallError)
from .models import Problem

logger = logging.getLogger("tiered_recall.http")


class HttpProblem(Exception):
    """An error this layer raises itself: its status, its kind and a message that names the fix."""

    status = 400
    kind = "invalid_input"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadInput(HttpProblem):
    """A request the store cannot serve as sent (400)."""

    status, kind = 400, "invalid_input"


class Unauthorized(HttpProblem):
    """No token, or not one this server takes (401)."""

    status, kind = 401, "unauthorized"


class Forbidden(HttpProblem):
    """A namespace outside the token's scope (403)."""

    status, kind = 403, "forbidden"


class NotFound(HttpProblem):
    """No such memory, or none the token may reach (404)."""

    status, kind = 404, "not_found"


# The store's errors, most specific first: a bad argument is the caller's to fix (400), a read-only store or a hot
# tier too small for the batch conflicts with the store's state (409), the tiers failing is the server's (503).
STORE_ERRORS: tuple[tuple[type, int, str], ...] = (
    (InvalidInput, 400, "invalid_input"),
    (ReadOnlyStore, 409, "read_only"),
    (HotTierFull, 409, "conflict"),
    (SidecarUnavailable, 503, "unavailable"),
    (IncompatibleLayout, 503, "unavailable"),
    (SidecarError, 503, "unavailable"),
    (StorageError, 503, "unavailable"),
    (TieredRecallError, 400, "invalid_input"),
)
# What each status means, for the OpenAPI document's responses.
STATUS_WORDS = {400: "The request cannot be served as sent; the message says how to fix it",
                401: "No bearer token, or not one this server takes",
                403: "The token may not reach this namespace",
                404: "No such memory (or none this token may reach)",
                409: "The store's state forbids it (read-only store, hot tier too small for the batch)",
                413: "The request body is larger than the server takes",
                422: "A field is missing, of the wrong type or out of range; fields says which",
                503: "The store cannot serve now (its tiers failed); try again"}


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The documented error answers of an endpoint, for FastAPI's responses= (JSON even where the endpoint's own
    answer is not)."""
    problem_json = {"application/json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
    return {status: {"model": Problem, "description": STATUS_WORDS[status], "content": problem_json}
            for status in statuses}


def problem(status: int, kind: str, message: str, fields: list | None = None,
            headers: dict | None = None) -> JSONResponse:
    """A Problem body with this status."""
    body: dict[str, Any] = {"error": kind, "message": message}
    if fields is not None:
        body["fields"] = fields
    return JSONResponse(body, status_code=status, headers=headers)


def field_name(loc: tuple) -> str:
    """Where pydantic found a fault, as the request spells it: memories[0].text for the body, k (query) for a
    query parameter."""
    where, *rest = loc if loc else ("body",)
    parts: list[str] = []
    for part in rest:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        elif part in ("int", "str", "float", "list[str]", "list[constrained-str]", "constrained-str",
                      "function-after[_id_value(), union[int,str]]") or str(part).startswith(("function-", "union[")):
            continue  # the branch of a union pydantic tried: not a field the client wrote
        else:
            parts.append(("." if parts else "") + str(part))
    name = "".join(parts) or ("the body" if where == "body" else where)
    return name if where == "body" else f"{name} ({where})"


def _validation(request: Request, error: RequestValidationError) -> JSONResponse:
    fields, seen = [], set()
    for item in error.errors():
        name = field_name(tuple(item.get("loc", ())))
        message = str(item.get("msg", "invalid")).removeprefix("Value error, ")
        if item.get("type") == "json_invalid":
            name, message = "the body", "is not valid JSON: send a JSON object with Content-Type: application/json"
        elif item.get("type") == "extra_forbidden":
            message = "is not a field of this request: check its spelling (the OpenAPI document at /openapi.json " \
                      "lists the fields)"
        elif item.get("type") == "model_attributes_type" or (item.get("type") == "dict_type" and name == "the body"):
            message = "must be a JSON object with Content-Type: application/json"
        if (name, message) not in seen:
            seen.add((name, message))
            fields.append({"field": name, "message": message})
    summary = "; ".join(f"{f['field']}: {f['message']}" for f in fields[:5])
    return problem(422, "invalid_request", summary, fields)


def _methods_of(app: FastAPI, path: str) -> list[str]:
    """Every method some route of the app takes at this path."""
    methods: set[str] = set()
    for route in app.routes:
        regex, route_methods = getattr(route, "path_regex", None), getattr(route, "methods", None)
        if regex is not None and route_methods and regex.match(path):
            methods.update(route_methods)
    return sorted(methods)


def install(app: FastAPI) -> None:
    """Registers the handlers on app."""

    @app.exception_handler(HttpProblem)
    async def own(request: Request, error: HttpProblem) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
        return problem(error.status, error.kind, error.message, headers=headers)

    @app.exception_handler(TieredRecallError)
    async def store(request: Request, error: TieredRecallError) -> JSONResponse:
        for cls, status, kind in STORE_ERRORS:
            if isinstance(error, cls):
                if status >= 500:
                    logger.warning("tiered-recall http: %s %s: %s", request.method, request.url.path, error)
                return problem(status, kind, str(error))
        raise error  # not reached: TieredRecallError closes the table

    @app.exception_handler(RequestValidationError)
    async def validation(request: Request, error: RequestValidationError) -> JSONResponse:
        return _validation(request, error)

    @app.exception_handler(StarletteHTTPException)
    async def http(request: Request, error: StarletteHTTPException) -> JSONResponse:
        kind = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}.get(error.status_code, "invalid_request")
        message = {404: f"no such endpoint: {request.url.path} (the OpenAPI document at /openapi.json lists them)",
                   405: f"{request.method} is not an operation of {request.url.path}"}.get(error.status_code,
                                                                                           str(error.detail))
        headers = getattr(error, "headers", None)
        if error.status_code == 405:  # Starlette's Allow names the first route of the path; a path may have several
            headers = {**(headers or {}), "Allow": ", ".join(_methods_of(request.app, request.url.path))}
        return problem(error.status_code, kind, message, headers=headers)

    @app.exception_handler(Exception)
    async def bug(request: Request, error: Exception) -> JSONResponse:
        logger.exception("tiered-recall http: %s %s failed", request.method, request.url.path)
        return problem(500, "internal", "the server failed on this request (a bug: its log has the details)")
