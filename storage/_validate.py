"""Checks of what a direct caller of the cold tier (ColdStore.add, search, get...) passes, before it reaches the
durable store, where a malformed row could not be taken back: the structure of each argument, cheaply (O(n)).
TieredMemory checks its callers' values itself (tiered_recall.coordinator.validate) and writes through
ColdStore.add_rows, which checks nothing again. Vector values (finite, unit norm) are the caller's to ensure."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import InvalidInput
from ..namespaces import validate_namespace
from ..sync import encode_metadata
from ._schema import filter_escape


def check_dim(dim: Any) -> int:
    """A positive int (not a bool) -> int."""
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or int(dim) <= 0:
        raise InvalidInput(f"dim must be a positive int (e.g. dim=384), got {dim!r}")
    return int(dim)


def check_ids(ids: Any, *, name: str = "ids", allow_empty: bool = False) -> np.ndarray:
    """An int or a 1-d integer array -> C-contiguous (n,) int64; empty only with allow_empty. `name` names the
    argument in the message."""
    arr = np.asarray(ids)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise InvalidInput(f"{name} must be a 1-d array of int64, got shape {arr.shape}; try np.ravel({name})")
    if arr.size == 0:
        if allow_empty:
            return np.empty(0, dtype=np.int64)
        raise InvalidInput(f"{name} is empty: pass at least one id")
    if not np.issubdtype(arr.dtype, np.integer):
        raise InvalidInput(f"{name} must be integers (int64), got dtype {arr.dtype}; try np.asarray({name}, dtype=np.int64)")
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise InvalidInput(f"{name} has values above the int64 range; ids must fit in int64")
    return np.ascontiguousarray(arr, dtype=np.int64)


def check_vectors(vectors: Any, n: int, dim: int) -> np.ndarray:
    """(n, dim) floats -> C-contiguous float32 (values are not checked again)."""
    arr = np.asarray(vectors)
    if arr.ndim != 2 or arr.shape != (n, dim):
        raise InvalidInput(
            f"vectors must have shape ({n}, {dim}) (one row per id, store dim {dim}), got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.floating):
        raise InvalidInput(f"vectors must be float32, got dtype {arr.dtype}; try vectors.astype(np.float32)")
    return np.ascontiguousarray(arr, dtype=np.float32)


def check_query(vector: Any, dim: int) -> np.ndarray:
    """(dim,) or (1, dim) floats -> C-contiguous (dim,) float32."""
    arr = np.asarray(vector)
    if arr.ndim == 2 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 1 or arr.shape[0] != dim:
        raise InvalidInput(f"query vector must have shape ({dim},) for this store, got shape {np.shape(vector)}")
    if not np.issubdtype(arr.dtype, np.floating):
        raise InvalidInput(f"query vector must be float32, got dtype {arr.dtype}; try vector.astype(np.float32)")
    return np.ascontiguousarray(arr, dtype=np.float32)


def check_k(k: Any) -> int:
    """A positive int (not a bool) -> int."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or int(k) <= 0:
        raise InvalidInput(f"k must be a positive int (e.g. k=10), got {k!r}")
    return int(k)


def check_limit(limit: Any) -> int:
    """An int >= 0 (not a bool) -> int."""
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or int(limit) < 0:
        raise InvalidInput(f"limit must be a non-negative int, got {limit!r}")
    return int(limit)


def check_optional_namespace(namespace: str | None) -> str | None:
    """None (every namespace) or a valid namespace name."""
    return None if namespace is None else validate_namespace(namespace)


def check_where(where: str | None) -> str | None:
    """None or a non-empty SQL filter string (LanceDB checks the SQL when it runs it)."""
    if where is None:
        return None
    if not isinstance(where, str) or not where.strip():
        raise InvalidInput(f"where must be a non-empty SQL filter string such as \"role = 'user'\", got {where!r}")
    escape = filter_escape(where)
    if escape is not None:
        raise InvalidInput(f"the where filter {where!r} {escape}")
    return where


def _check_length(values: Any, n: int, name: str) -> list:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise InvalidInput(f"{name} must be a list with one entry per id ({n}), got {type(values).__name__}")
    if len(values) != n:
        raise InvalidInput(f"{name} has {len(values)} entries but ids has {n}; pass one entry per id")
    return list(values)


def check_strings(values: Any, n: int, name: str, *, nullable: bool) -> list:
    """A list of n str (or None where nullable) -> a list."""
    out = _check_length(values, n, name)
    for i, value in enumerate(out):
        if value is None and nullable:
            continue
        if not isinstance(value, str):
            kind = "a str or None" if nullable else "a str"
            raise InvalidInput(f"{name}[{i}] must be {kind}, got {type(value).__name__}")
    return out


def check_namespaces(values: Any, n: int) -> list[str]:
    """A list of n valid namespace names -> a list."""
    out = _check_length(values, n, "namespaces")
    for i, value in enumerate(out):
        try:
            validate_namespace(value)
        except InvalidInput as exc:
            raise InvalidInput(f"namespaces[{i}]: {exc}") from None
    return out


def check_timestamps(created_at_us: Any, n: int) -> np.ndarray:
    """(n,) integer microseconds since the epoch -> C-contiguous int64."""
    arr = np.asarray(created_at_us)
    if arr.shape != (n,):
        raise InvalidInput(f"created_at_us must have shape ({n},) (one per id), got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise InvalidInput(
            f"created_at_us must be int64 microseconds since the epoch (UTC), got dtype {arr.dtype}; "
            "try (np.asarray(seconds) * 1e6).astype(np.int64)")
    return np.ascontiguousarray(arr, dtype=np.int64)


def check_metadata(values: Any, n: int) -> list[str]:
    """A list of n dicts or None -> n compact JSON strings (None becomes "{}"); NaN and infinities are refused."""
    out = _check_length(values, n, "metadata")
    encoded = []
    for i, value in enumerate(out):
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise InvalidInput(f"metadata[{i}] must be a dict or None, got {type(value).__name__}")
        try:
            encoded.append(encode_metadata(value))
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"metadata[{i}] is not JSON-serialisable ({exc}); keep values to str/int/float/bool/list/dict") from None
    return encoded


def check_unique(ids: np.ndarray) -> None:
    """Raises InvalidInput when an id occurs twice in one batch."""
    uniq, counts = np.unique(ids, return_counts=True)
    if uniq.size != ids.size:
        dup = int(uniq[counts > 1][0])
        raise InvalidInput(f"ids contains id {dup} more than once in one batch; pass each id once (the last write wins only across calls)")
