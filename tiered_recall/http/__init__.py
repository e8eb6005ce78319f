"""The HTTP API and the memory browser (`tiered-recall http`; needs the http extra: pip install
"tiered-recall[http]"): create_app(store, settings=HttpSettings(...)) is the FastAPI application over any object with
TieredMemory's public methods; docs/http.md describes the endpoints, the tokens and their scopes."""
from __future__ import annotations

from .app import create_app
from .settings import HttpSettings, TokenScope

__all__ = ["create_app", "HttpSettings", "TokenScope"]
