"""create_app: the FastAPI application over one store, the one `tiered-recall http` serves and the one a cluster serves
as its ingress. The store is any object with TieredMemory's public methods (add, search, get, delete, count,
namespaces, memories, stats), passed in; the app never reaches past them."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Optional

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from fastapi.staticfiles import StaticFiles

from .. import __version__
from . import memory_routes, problems, service_routes
from .access import Tokens
from .guard import OPEN_PATHS, RequestGuard
from .settings import HttpSettings

TITLE = "tiered-recall"
DESCRIPTION = ("A memory store for LLM agents over HTTP: add, search, get and delete memories by namespace, list them, "
               "count them, and read the store's stats and metrics. Ids are 63-bit integers: every answer gives each "
               "as id_str too, and every request takes it as a string of digits. docs/http.md describes the API, "
               "its tokens and scopes.")
BROWSER = Path(__file__).resolve().parent / "browser"


def create_app(store: Any, *, settings: Optional[HttpSettings] = None, metrics: Any = "store",
               close_store: bool = False) -> FastAPI:
    """The application over `store` (opened by the caller; closed when the app shuts down with close_store=True).

    settings: where it listens, its tokens and limits (HttpSettings(): loopback, no token). metrics: a
    prometheus-client collector for /metrics; "store" (default) collects the store's own metrics when it has a
    folder (store.path) and prometheus-client is installed; None serves no metrics."""
    settings = settings if settings is not None else HttpSettings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        try:
            yield
        finally:
            if close_store:
                store.close()

    # docs_url and redoc_url would serve pages that fetch their scripts from a CDN: the browser at / works offline.
    # Operation ids are the endpoints' names (add, search, get_one...), what client generators name methods after.
    app = FastAPI(title=TITLE, version=__version__, description=DESCRIPTION, docs_url=None, redoc_url=None,
                  lifespan=lifespan, separate_input_output_schemas=False,
                  generate_unique_id_function=lambda route: route.name)
    app.state.store = store
    app.state.settings = settings
    app.state.tokens = tokens = Tokens(settings.tokens)
    app.state.metrics = _registry(store, metrics)
    problems.install(app)
    app.include_router(memory_routes.router)
    app.include_router(service_routes.router)
    app.mount("/browser", StaticFiles(directory=BROWSER), name="browser")
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                           allow_methods=["GET", "POST", "DELETE"], allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(RequestGuard, max_body_bytes=settings.max_body_bytes, hosts=settings.host_check,
                       tokens=tokens)
    app.openapi = lambda: _document(app)
    return app


def _document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's OpenAPI document, with the bearer token the guard checks (not a FastAPI dependency, which would
    cost every call a dependency resolution) on every operation that needs it."""
    if app.openapi_schema is None:
        document = get_openapi(title=app.title, version=app.version, description=app.description,
                               routes=app.routes, separate_input_output_schemas=False)
        document.setdefault("components", {})["securitySchemes"] = {"HTTPBearer": {
            "type": "http", "scheme": "bearer",
            "description": "Authorization: Bearer TOKEN; needed when the server was given tokens (always, when "
                           "bound beyond loopback)."}}
        for path, operations in document["paths"].items():
            if path not in OPEN_PATHS:
                for operation in operations.values():
                    operation["security"] = [{"HTTPBearer": []}]
        app.openapi_schema = document
    return app.openapi_schema


def _registry(store: Any, metrics: Any):
    """A prometheus-client registry for /metrics, or None."""
    if metrics is None:
        return None
    try:
        from prometheus_client import CollectorRegistry
    except ImportError:
        return None
    if metrics == "store":
        path = getattr(store, "path", None)
        if path is None:
            return None
        from ..coordinator.metrics import StoreCollector

        metrics = StoreCollector(Path(path))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    return registry
