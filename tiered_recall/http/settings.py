"""How an HTTP server of a store is configured (HttpSettings): where it listens, which bearer tokens it takes and the
namespace prefix each may reach, the limits on a request, CORS. Checked once here, with messages in the command
line's spelling where it passes them on."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Optional

from ..errors import InvalidInput
from ..namespaces import namespace_name

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
DEFAULT_MAX_BODY_BYTES = 16 << 20  # a batch of 1,000 memories with 768-wide vectors is about 15 MB of JSON
MIN_TOKEN_CHARS = 16
# Names a browser may use for a server bound to loopback: any other Host header is refused there, so a web page of
# another site cannot reach the store through a name that its DNS points at 127.0.0.1 (DNS rebinding).
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    """True for an address or name that only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class TokenScope:
    """What one bearer token reaches: the whole store (prefix None) or the namespaces under one prefix, given as its
    stored name ("users/alice" for ("users", "alice"))."""

    prefix: Optional[str] = None

    @classmethod
    def of(cls, prefix) -> "TokenScope":
        """A scope from a prefix: None or "*" for the whole store, a name, or a list of labels."""
        if prefix is None or prefix == "*":
            return cls(None)
        return cls(namespace_name(prefix))


@dataclass(frozen=True)
class HttpSettings:
    """host / port: where uvicorn listens (loopback by default). tokens: bearer token -> TokenScope; empty means no
    token is asked for, which only a loopback host allows. cors_origins: origins a browser may call the API from
    (none by default: same origin only). allowed_hosts: the Host headers taken when bound to loopback (None: the
    loopback names). max_body_bytes: the largest request body."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    tokens: dict = field(default_factory=dict)
    cors_origins: tuple = ()
    allowed_hosts: Optional[tuple] = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    def __post_init__(self) -> None:
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise InvalidInput(f"--port must be 0..65535, got {self.port!r}")
        if not self.tokens and not is_loopback(self.host):
            raise InvalidInput(f"--host {self.host} lets other machines in: give a bearer token (--token or "
                               "--token-file), or leave --host out to serve this machine only")
        for token, scope in self.tokens.items():
            if not isinstance(token, str) or len(token) < MIN_TOKEN_CHARS or not token.isprintable() \
                    or any(c.isspace() for c in token):
                raise InvalidInput(f"a bearer token is at least {MIN_TOKEN_CHARS} printable characters with no "
                                   "spaces: make one with python -c \"import secrets; "
                                   "print(secrets.token_urlsafe(32))\"")
            if not isinstance(scope, TokenScope):
                raise InvalidInput(f"each token's scope must be a TokenScope, got {type(scope).__name__}")
        for origin in self.cors_origins:
            if not isinstance(origin, str) or not (origin == "*" or origin.startswith(("http://", "https://"))):
                raise InvalidInput(f"--cors-origin takes an origin such as https://app.example.com, got {origin!r}")
        if not isinstance(self.max_body_bytes, int) or self.max_body_bytes < 1024:
            raise InvalidInput(f"--max-body-bytes must be at least 1024, got {self.max_body_bytes!r}")

    @property
    def needs_token(self) -> bool:
        """Whether every call but health, readiness, the page and the OpenAPI document must carry a token."""
        return bool(self.tokens)

    @property
    def host_check(self) -> Optional[frozenset]:
        """The Host names taken, when bound to loopback; None (any) otherwise."""
        if not is_loopback(self.host):
            return None
        return frozenset(self.allowed_hosts if self.allowed_hosts is not None else LOOPBACK_NAMES)
