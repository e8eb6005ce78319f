"""Running the app under uvicorn for `tiered-recall http`: one process that opens the store and serves it, or, with
--workers N, N processes that each open the same store folder (any number of processes may share a store) and
share the port. The options reach worker processes through one environment variable (the workers are new
interpreters that import the app factory by name)."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any, Optional

from .app import create_app
from .settings import HttpSettings, TokenScope

ENVIRONMENT_KEY = "TIERED_RECALL_HTTP_SERVE"


@dataclass(frozen=True)
class ServeOptions:
    """What a server needs to open its store and serve it: the store's TieredMemory keyword arguments (path first)
    and the HTTP settings."""

    store: dict[str, Any]
    settings: HttpSettings
    workers: int = 1
    log_level: str = "info"
    access_log: bool = False  # a line per request costs the hot path tens of microseconds; --access-log turns it on

    def to_json(self) -> str:
        """The options as JSON, for the environment of worker processes."""
        settings = asdict(self.settings)
        settings["tokens"] = {token: scope.prefix for token, scope in self.settings.tokens.items()}
        return json.dumps({"store": self.store, "settings": settings, "workers": self.workers,
                           "log_level": self.log_level, "access_log": self.access_log})

    @classmethod
    def from_json(cls, text: str) -> "ServeOptions":
        """The options to_json wrote."""
        data = json.loads(text)
        settings = data["settings"]
        settings["tokens"] = {token: TokenScope(prefix) for token, prefix in settings["tokens"].items()}
        for key in ("cors_origins", "allowed_hosts"):
            if settings.get(key) is not None:
                settings[key] = tuple(settings[key])
        return cls(store=data["store"], settings=HttpSettings(**settings), workers=data["workers"],
                   log_level=data["log_level"], access_log=data["access_log"])


def open_store(options: dict[str, Any]):
    """A TieredMemory opened with these keyword arguments."""
    from ..coordinator import TieredMemory

    return TieredMemory(**options)


def app_from_environment():
    """The app of one worker process: its own store, opened from the options in the environment (uvicorn's factory)."""
    options = ServeOptions.from_json(os.environ[ENVIRONMENT_KEY])
    return create_app(open_store(options.store), settings=options.settings, close_store=True)


def serve(options: ServeOptions, store: Optional[Any] = None) -> None:
    """Serves until Ctrl-C or SIGTERM, then closes the store(s). store: the store already opened (one worker), so
    that a bad option is reported before the server starts; None opens it here."""
    import uvicorn

    common = dict(host=options.settings.host, port=options.settings.port, log_level=options.log_level,
                  access_log=options.access_log, server_header=False, proxy_headers=False,
                  timeout_graceful_shutdown=10)
    if options.workers == 1:
        app = create_app(store if store is not None else open_store(options.store), settings=options.settings,
                         close_store=True)
        uvicorn.run(app, **common)
        return
    if store is not None:
        store.close()  # each worker opens its own
    os.environ[ENVIRONMENT_KEY] = options.to_json()
    uvicorn.run("tiered_recall.http.server:app_from_environment", factory=True, workers=options.workers, **common)
