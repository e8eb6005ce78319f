"""Namespace names to the 64-bit hashes the hot tier filters on (one definition for every process)."""
from __future__ import annotations

import hashlib
from functools import lru_cache

from .errors import InvalidInput

MAX_NAMESPACE_BYTES = 256


def validate_namespace(namespace: str) -> str:
    """Returns namespace when it is a non-empty str of valid Unicode, at most MAX_NAMESPACE_BYTES in UTF-8;
    else InvalidInput saying why."""
    if not isinstance(namespace, str):
        raise InvalidInput(f"namespace must be a str, got {type(namespace).__name__}")
    if not namespace:
        raise InvalidInput("namespace must be a non-empty string, e.g. namespace='default'")
    try:
        namespace.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"namespace {namespace!r} is not valid Unicode text (lone surrogates): decode it properly") from None
    if len(namespace.encode("utf-8", "surrogatepass")) > MAX_NAMESPACE_BYTES:
        raise InvalidInput(f"namespace is longer than {MAX_NAMESPACE_BYTES} bytes; use a shorter name")
    return namespace


def namespace_hash(namespace: str) -> int:
    """Stable unsigned 64-bit hash of a namespace name; never 0 (0 means 'no filter' nowhere, but keep it free).
    Cached: every search of a namespace asks for it, and a repair of the hot tier for every namespace."""
    if type(namespace) is not str:
        validate_namespace(namespace)  # raises with the reason (and keeps unhashable values out of the cache)
    return _hash(namespace)


@lru_cache(maxsize=1 << 16)
def _hash(namespace: str) -> int:
    digest = hashlib.blake2b(validate_namespace(namespace).encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1
