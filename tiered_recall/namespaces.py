"""Namespace names: hierarchical namespaces (tuples of labels) to the stored names, and names to the 64-bit hashes
the hot tier filters on (one definition for every process)."""
from __future__ import annotations

import hashlib
import re
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


# A tuple of labels is stored as one name, its labels joined by "/" ("users/alice/memories"), so a str namespace
# with "/" in it is the same namespace as the tuple of its parts. Inside a label, "%" and "/" are written "%25" and
# "%2F", so any label round-trips.
LABEL_SEPARATOR = "/"
_ESCAPED = re.compile("%(25|2F)")


def namespace_name(namespace: str | tuple[str, ...] | list[str]) -> str:
    """The stored name of a namespace: a str as it is, a tuple (or list) of labels joined by "/" with "%" and "/"
    inside a label escaped; InvalidInput saying why for anything else (an empty tuple, a label that is not a
    non-empty str, a name too long)."""
    if isinstance(namespace, (tuple, list)):
        if not namespace:
            raise InvalidInput("a namespace tuple needs at least one label, e.g. ('users', 'alice')")
        for label in namespace:
            if not isinstance(label, str) or not label:
                raise InvalidInput(f"every label of a namespace tuple must be a non-empty str, got {label!r} in "
                                   f"{tuple(namespace)!r}")
        namespace = LABEL_SEPARATOR.join(_escape(label) for label in namespace)
    return validate_namespace(namespace)


@lru_cache(maxsize=1 << 16)
def namespace_labels(name: str) -> tuple[str, ...]:
    """The labels of a stored name: the inverse of namespace_name for a tuple ("users/alice" -> ("users",
    "alice")); a name without "/" is a tuple of one label."""
    return tuple(_unescape(label) for label in name.split(LABEL_SEPARATOR))


def under_prefix(name: str, prefix_name: str) -> bool:
    """True when the stored name is the namespace prefix_name or lies under it (label by label: "users/alice" is
    under "users", "users2" is not)."""
    return name == prefix_name or name.startswith(prefix_name + LABEL_SEPARATOR)


def select_namespaces(names, *, prefix: tuple[str, ...] | None = None, suffix: tuple[str, ...] | None = None,
                      max_depth: int | None = None) -> list[tuple[str, ...]]:
    """The stored names as tuples of labels, sorted: only those whose first (prefix) and last (suffix) labels are
    these, "*" matching any one label; with max_depth each cut to its first labels, the cut ones listed once."""
    found = [labels for labels in map(namespace_labels, names)
             if _labels_match(labels, prefix, from_end=False) and _labels_match(labels, suffix, from_end=True)]
    return sorted({labels[:max_depth] for labels in found} if max_depth is not None else set(found))


def _labels_match(labels: tuple[str, ...], pattern: tuple[str, ...] | None, *, from_end: bool) -> bool:
    if pattern is None:
        return True
    if len(labels) < len(pattern):
        return False
    own = labels[-len(pattern):] if from_end else labels[:len(pattern)]
    return all(p == "*" or p == label for p, label in zip(pattern, own))


def _escape(label: str) -> str:
    return label.replace("%", "%25").replace("/", "%2F")


def _unescape(label: str) -> str:
    return _ESCAPED.sub(lambda m: "%" if m.group(1) == "25" else "/", label)


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
