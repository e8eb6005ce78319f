"""An ASGI middleware that turns requests away before any route runs: on a server bound to loopback, a Host header
that names another site (DNS rebinding); without a bearer token the server takes, any call but the open ones
(health, readiness, the page, the OpenAPI document); and a body larger than the server takes (by its
Content-Length, or by counting the bytes of a chunked one as they come). It leaves the token's Access in the
request's scope for the endpoints. Plain ASGI: a request that passes costs a few dict lookups and one hash."""
from __future__ import annotations

import json
from typing import Optional

from starlette.exceptions import HTTPException

from .access import ACCESS_KEY, Tokens
from .problems import Unauthorized

# What answers without a token: liveness and readiness probes, the page (it asks for the token), its files and the
# OpenAPI document.
OPEN_PATHS = frozenset({"/health", "/ready", "/", "/openapi.json"})
OPEN_PREFIXES = ("/browser/",)


def _host_name(value: str) -> str:
    """The name of a Host header without its port ("[::1]:8765" -> "::1")."""
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class RequestGuard:
    """Wraps an ASGI app: 421 for a Host outside hosts (None: any), 401 without a token `tokens` takes (where it
    takes any), 413 for a body over max_body_bytes."""

    def __init__(self, app, *, max_body_bytes: int, hosts: Optional[frozenset], tokens: Tokens) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.hosts = hosts
        self.tokens = tokens

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if self.hosts is not None:
            host = headers.get(b"host", b"").decode("latin-1")
            if _host_name(host).lower() not in self.hosts:
                await _refuse(send, 421, "misdirected", f"this server serves this machine only, by the names "
                              f"{', '.join(sorted(self.hosts))}; Host {host!r} is not one (start it with --host to "
                              "serve other names)")
                return
        path = scope["path"]
        if path not in OPEN_PATHS and not path.startswith(OPEN_PREFIXES):
            try:
                authorization = headers.get(b"authorization")
                scope[ACCESS_KEY] = self.tokens.access(None if authorization is None else
                                                       authorization.decode("latin-1"))
            except Unauthorized as refusal:
                await _refuse(send, 401, "unauthorized", refusal.message, [(b"www-authenticate", b"Bearer")])
                return
        length = headers.get(b"content-length")
        if length is not None:
            if not length.isdigit() or int(length) > self.max_body_bytes:
                await _refuse(send, 413, "too_large", self._too_large())
                return
            await self.app(scope, receive, send)
            return
        counted = 0

        async def counting_receive():
            nonlocal counted
            message = await receive()
            if message["type"] == "http.request":
                counted += len(message.get("body", b""))
                if counted > self.max_body_bytes:
                    # raised where the route reads its body: FastAPI passes an HTTPException on to the handlers
                    raise HTTPException(413, detail=self._too_large())
            return message

        await self.app(scope, counting_receive, send)

    def _too_large(self) -> str:
        return (f"the request body is larger than {self.max_body_bytes} bytes, the most this server takes: send "
                "fewer memories a request (or start it with a larger --max-body-bytes)")


async def _refuse(send, status: int, kind: str, message: str, headers: list | None = None) -> None:
    body = json.dumps({"error": kind, "message": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})
