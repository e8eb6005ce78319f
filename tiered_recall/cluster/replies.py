"""What a shard answers a request with, as plain picklable values: the result, a redirect to another shard, a "retry
shortly" (a namespace moving, a view not yet applied), or an error of the package's own (its class and message,
credentials taken out), raised again in the client as the same class."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import errors
from .redaction import redact

OK, REDIRECT, RETRY, STALE, ERROR = "ok", "redirect", "retry", "stale", "error"


@dataclass(frozen=True)
class Reply:
    """kind: OK (value), REDIRECT (to: the shard to ask; vouched: the old owner of a namespace in transition holds
    none of it), RETRY (after retry_s: a namespace moving), STALE (the shard's view version differs from the
    caller's: version is the shard's), ERROR (error: (class name, message)). version: the ownership view version the
    shard answered at."""

    kind: str
    value: Any = None
    version: int = 0
    to: str | None = None
    vouched: bool = False
    retry_s: float = 0.0
    error: tuple[str, str] | None = None


_DEFAULTS = {"kind": OK, "value": None, "version": 0, "to": None, "vouched": False, "retry_s": 0.0, "error": None}


def ok(value: Any, version: int) -> Reply:
    """A reply carrying a result, at the shard's view version (made from a dict of its fields: a frozen dataclass's
    __init__ sets each field through object.__setattr__, a cost every co-located search would pay)."""
    reply = object.__new__(Reply)
    object.__setattr__(reply, "__dict__", {**_DEFAULTS, "value": value, "version": version})
    return reply


def failure(exc: BaseException, secrets: tuple[str, ...]) -> Reply:
    """The package's errors keep their class; any other failure is a StorageError naming what failed. Either way the
    message has no credential in it."""
    if isinstance(exc, errors.TieredRecallError):
        name = type(exc).__name__ if hasattr(errors, type(exc).__name__) else "TieredRecallError"
        return Reply(ERROR, error=(name, redact(str(exc), secrets)))
    return Reply(ERROR, error=("StorageError", redact(f"the shard failed: {type(exc).__name__}: {exc}", secrets)))


def raise_error(reply: Reply, shard: str) -> None:
    """Raises the error a shard replied with, as its own class (TieredRecallError for one this version lacks)."""
    name, message = reply.error or ("TieredRecallError", "unknown failure")
    cls = getattr(errors, name, errors.TieredRecallError)
    if not (isinstance(cls, type) and issubclass(cls, errors.TieredRecallError)):
        cls = errors.TieredRecallError
    if cls is errors.ShardUnavailable:
        raise errors.ShardUnavailable(f"{shard}: {message}")
    raise cls(message)
