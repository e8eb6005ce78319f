"""The endpoints about the server and the store rather than memories: stats, liveness (/health), readiness (/ready:
the store serves, and the state of its hot tier), Prometheus metrics (/metrics), and the memory browser's page."""
from __future__ import annotations

import logging
from importlib import resources
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse

from ..errors import TieredRecallError
from .access import reach
from .convert import plain
from .models import Health, Readiness
from .problems import NotFound, responses

logger = logging.getLogger("tiered_recall.http")
router = APIRouter()
# The browser's page: its script, style and data come from this server only, and no other site may frame it.
PAGE_HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
                                           "base-uri 'none'; form-action 'none'",
                "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


@router.get("/v1/stats", tags=["store"], summary="The store's stats", responses=responses(401, 403, 422, 503))
def stats(request: Request) -> dict[str, Any]:
    """Rows per tier, namespaces, how often the hot tier answered alone, latency by path and rule, the sidecar's
    counters, and store_metrics (every process of the store added up): TieredMemory.stats() as JSON. It covers the
    whole store, so a token scoped to a prefix may not read it."""
    access, store = reach(request)
    access.whole("the store's stats")
    return plain(store.stats())


@router.get("/health", tags=["service"], summary="Liveness")
async def health() -> Health:
    """The server answers (no token needed): for a liveness probe."""
    return Health(status="ok")


@router.get("/ready", tags=["service"], summary="Readiness",
            responses={503: {"model": Readiness, "description": "The store does not serve now"}})
def ready(request: Request) -> Any:
    """Whether the store serves (no token needed): 200 when it does, with its hot tier's state (a store without a
    hot tier serves from the cold tier, exact and slower), 503 when it does not."""
    store = request.app.state.store
    try:
        found = store.stats()
    except TieredRecallError as error:
        return JSONResponse(Readiness(ready=False, hot_tier=None, hot_error=None, message=str(error)).model_dump(),
                            status_code=503)
    return Readiness(ready=True, hot_tier=found.get("hot_backend"), hot_error=found.get("hot_error"))


@router.get("/metrics", tags=["service"], summary="Prometheus metrics", response_class=PlainTextResponse,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "The Prometheus text format"}, **responses(401, 403, 404, 422, 503)})
def metrics(request: Request) -> PlainTextResponse:
    """The store's metrics in the Prometheus text format: searches by path and rule with latency histograms, adds,
    rows per tier; every process of the store added up. Scrape it with the server's token (one not scoped)."""
    access, _ = reach(request)
    access.whole("the store's metrics")
    registry = request.app.state.metrics
    if registry is None:
        raise NotFound("this server keeps no metrics: install prometheus-client (pip install \"tiered-recall[http]\")")
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/", include_in_schema=False)
async def browser_page() -> HTMLResponse:
    """The memory browser."""
    html = resources.files(__package__).joinpath("browser", "index.html").read_text(encoding="utf-8")
    return HTMLResponse(html, headers=PAGE_HEADERS)
