"""What the store hands back (Memory, Hit, stats) as the JSON the API gives, and the query parameters that name a
namespace (a name, or a JSON list of labels) as the store takes them."""
from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any, Optional

import numpy as np

from ..namespaces import namespace_labels
from .problems import BadInput


def memory_json(memory: Any) -> dict:
    """A Memory (or Hit) as a StoredMemory body."""
    expires = memory.expires_at
    return {"id": memory.id, "id_str": str(memory.id), "text": memory.text, "namespace": memory.namespace,
            "labels": list(namespace_labels(memory.namespace)), "session": memory.session, "role": memory.role,
            "created_at": memory.created_at.isoformat(), "metadata": memory.metadata or {},
            "expires_at": None if expires is None else expires.isoformat(), "ttl_s": memory.ttl_s}


def hit_json(hit: Any) -> dict:
    """A Hit as a FoundMemory body."""
    out = memory_json(hit)
    out["score"] = float(hit.score)
    out["tier"] = hit.tier
    return out


def cursor_key(memory: Any) -> tuple[int, int]:
    """Where a memory stands in the store's order (oldest first, ties by id): (created_at in microseconds, id)."""
    return round(memory.created_at.timestamp() * 1e6), memory.id


def parse_cursor(cursor: Optional[str]) -> Optional[tuple[int, int]]:
    """A page's cursor ("MICROSECONDS-ID", as next_cursor gives it) as a key."""
    if cursor is None:
        return None
    micros, _, memory_id = cursor.partition("-")
    if not (micros.isdigit() and memory_id.isdigit()):
        raise BadInput("cursor (query) is the next_cursor of the page before, e.g. 1765100000000000-42")
    return int(micros), int(memory_id)


def namespace_param(value: Optional[str], field: str) -> Any:
    """A namespace given in a query string: a name ("users/alice"), or a JSON list of labels (["users","alice"])."""
    if value is None or not value.startswith("["):
        return value
    try:
        labels = json.loads(value)
    except ValueError:
        labels = None
    if not isinstance(labels, list) or not labels or not all(isinstance(x, str) and x for x in labels):
        raise BadInput(f"{field} (query) is a namespace name (users/alice) or a JSON list of labels "
                       "([\"users\",\"alice\"]), URL-encoded")
    return labels


def plain(value: Any) -> Any:
    """Any stats value as plain JSON: numpy numbers as Python ones, NaN and infinities as null, tuples as lists,
    datetimes in ISO 8601, keys as strings."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [plain(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return finite(float(value))
    if isinstance(value, datetime):
        return value.isoformat()
    if value is None or isinstance(value, str):
        return value
    return str(value)


def finite(value: Optional[float]) -> Optional[float]:
    """A float as JSON takes it: None for None, NaN and the infinities."""
    return float(value) if value is not None and math.isfinite(value) else None
