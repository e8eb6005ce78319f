"""Who may reach what: the bearer token of a request (compared in constant time) to its scope, and the checks that keep
a token scoped to a namespace prefix inside it on every endpoint: writes, searches, listings, counts, and reads and
deletes by id (which look at each memory's own namespace)."""
from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Iterable, Optional

from ..namespaces import namespace_labels, namespace_name, under_prefix
from .problems import Forbidden, Unauthorized
from .settings import TokenScope


@dataclass(frozen=True)
class Access:
    """What one request may reach: every namespace (prefix None) or those under `prefix` (a stored name)."""

    prefix: Optional[str] = None

    @property
    def whole_store(self) -> bool:
        """Whether this Access reaches every namespace."""
        return self.prefix is None

    def covers(self, name: str) -> bool:
        """Whether the namespace of this stored name is within reach."""
        return self.prefix is None or under_prefix(name, self.prefix)

    def _refusal(self, field: str, name: str) -> Forbidden:
        return Forbidden(f"{field} {_labels(name)} is outside this token's namespaces: it reaches "
                         f"{_labels(self.prefix)} and the namespaces under it")

    def namespace(self, value, field: str = "namespace") -> str:
        """The stored name of a namespace the request names; Forbidden when it is out of reach."""
        name = namespace_name(value)
        if not self.covers(name):
            raise self._refusal(field, name)
        return name

    def search_scope(self, namespace, namespace_prefix) -> tuple[Optional[str], Optional[str]]:
        """(namespace, namespace_prefix) as stored names for a search or a count: a scoped token's search names a
        namespace or a prefix within reach, and one that names neither searches the token's own prefix."""
        name = None if namespace is None else self.namespace(namespace)
        prefix = None if namespace_prefix is None else namespace_name(namespace_prefix)
        if prefix is not None and not self.covers(prefix):
            raise self._refusal("namespace_prefix", prefix)
        if name is None and prefix is None and self.prefix is not None:
            prefix = self.prefix
        return name, prefix

    def whole(self, what: str) -> None:
        """Forbidden unless the token reaches the whole store (what: the endpoint, for the message)."""
        if self.prefix is not None:
            raise Forbidden(f"{what} covers the whole store, and this token reaches only {_labels(self.prefix)}: use "
                            "a token without a scope")

    def readable(self, memories: Iterable) -> list:
        """Those of the memories (None for none) that are within reach; the others read as absent."""
        return [m if m is not None and self.covers(m.namespace) else None for m in memories]


def _labels(name: str) -> str:
    """A namespace as the JSON list of its labels, as a request would write it."""
    return json.dumps(list(namespace_labels(name)), ensure_ascii=False)


ACCESS_KEY = "tiered_recall.access"  # where RequestGuard leaves a request's Access in its ASGI scope


def reach(request) -> tuple[Access, object]:
    """What a request may reach, and the store: the Access the guard found for its token (checked here where no
    guard ran: never assumed)."""
    app = request.app
    access = request.scope.get(ACCESS_KEY)
    if access is None:
        access = app.state.tokens.access(request.headers.get("authorization"))
    return access, app.state.store


class Tokens:
    """The tokens a server takes. A request's token is hashed and looked up by its digest, so that the lookup's time
    tells nothing of how much of a token was right; no token is asked for where none is configured."""

    def __init__(self, tokens: dict[str, TokenScope]) -> None:
        self._by_digest = {self._digest(t): Access(scope.prefix) for t, scope in tokens.items()}

    @staticmethod
    def _digest(token: str) -> bytes:
        return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()

    @property
    def required(self) -> bool:
        """Whether calls must carry a token (some are configured)."""
        return bool(self._by_digest)

    def access(self, authorization: Optional[str]) -> Access:
        """The Access of a request with this Authorization header; Unauthorized without a token this server takes."""
        if not self._by_digest:
            return Access(None)
        if not authorization:
            raise Unauthorized("this server needs a bearer token: send the header Authorization: Bearer TOKEN")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("send the token as Authorization: Bearer TOKEN")
        digest = self._digest(token.strip())
        for known, access in self._by_digest.items():
            if hmac.compare_digest(known, digest):
                return access
        raise Unauthorized("this bearer token is not one this server takes: check it (the server printed or keeps "
                           "its own)")
