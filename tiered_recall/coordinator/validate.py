"""The one validation boundary of the Python API: every argument of TieredMemory is checked here, once, with a
message that names the fix; the layers below (cold tier, hot-tier client) take what comes out as it is. The
sidecar checks again what a client writes into shared memory, since it is a process boundary."""
from __future__ import annotations

import math
import time
from datetime import datetime, timezone
from typing import Any, Sequence

import numpy as np

from ..errors import InvalidInput
from ..namespaces import namespace_name
from ..sync import encode_metadata
from .stages import compiled_stages

MAX_DIM = 8192  # the sidecar's limit (layout.h TR_MAX_DIM)
MAX_K = 256
MAX_ID = (1 << 63) - 1
DEVICES = ("auto", "cpu", "cuda", "none")
EXACT_RULES = ("complete", "bound")


def _is_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def non_negative_int(value: Any, what: str) -> int:
    """An int >= 0 -> int."""
    if not _is_int(value) or value < 0:
        raise InvalidInput(f"{what} must be an int >= 0, got {value!r}")
    return int(value)


def labels_pattern(value: Any, what: str) -> tuple[str, ...] | None:
    """None or a tuple of namespace labels, "*" standing for any one label (list_namespaces' prefix / suffix)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, (tuple, list)) or not value or not all(isinstance(v, str) and v for v in value):
        raise InvalidInput(f"{what} must be a tuple of non-empty labels, e.g. ('users', '*'), got {value!r}")
    return tuple(value)


def positive_int(value: Any, what: str, *, optional: bool = False) -> int | None:
    """An int >= 1 (not a bool) -> int; None passes when optional. `what` names the argument in the message."""
    if value is None and optional:
        return None
    if not _is_int(value) or value < 1:
        raise InvalidInput(f"{what} must be a positive int{' or None' if optional else ''}, got {value!r}")
    return int(value)


def seconds(value: Any, what: str) -> float:
    """A finite number > 0 (not a bool) -> float seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not np.isfinite(value) or value <= 0:
        raise InvalidInput(f"{what} must be a positive number of seconds, got {value!r}")
    return float(value)


def rules_and_confidence(rules: Sequence[str], confidence: Any) -> tuple[tuple[str, ...], float | None]:
    """The skip rules in order; confidence (a float) adds the approximate "threshold" rule."""
    out = tuple(rules)
    for rule in out:
        if rule not in EXACT_RULES:
            raise InvalidInput(f"rules may hold 'complete' and 'bound' (exact rules); got {rule!r}: "
                               "rule 3 is enabled by confidence=<score>")
    if confidence is None:
        return out, None
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not -1 <= confidence <= 2:
        raise InvalidInput(f"confidence must be a score threshold in [-1, 2] or None, got {confidence!r}")
    return out + ("threshold",), float(confidence)


def dim(value: Any) -> int | None:
    """None (the store's or the embedder's) or an int in 1..MAX_DIM -> int."""
    if value is not None and (not _is_int(value) or not 1 <= value <= MAX_DIM):
        raise InvalidInput(f"dim must be an int in 1..{MAX_DIM}, got {value!r}")
    return None if value is None else int(value)


def ids(value: Any) -> np.ndarray:
    """An int or a sequence of ints -> 1-d int64; anything else (str, float, nested, None) is refused."""
    try:
        arr = None if isinstance(value, (str, bytes, dict)) else np.atleast_1d(np.asarray(value))
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise InvalidInput(f"ids must be an int or a list of ints, got {value!r:.80}")
    if arr.size and (arr.dtype.kind == "u" and int(arr.max()) > MAX_ID):
        raise InvalidInput(f"ids are at most 2**63 - 1, got {int(arr.max())}")
    return arr.astype(np.int64)


def new_ids(value: Any, n: int, draw) -> np.ndarray:
    """The ids of n new memories: the caller's (distinct, 0 .. 2**63 - 1; an existing id is replaced) or drawn."""
    if value is None:
        return np.array([draw() for _ in range(n)], dtype=np.int64)
    arr = np.asarray(value)
    if arr.shape != (n,) or (n and arr.dtype.kind not in "iu"):
        raise InvalidInput(f"ids must be {n} integers, got {arr.shape} of {arr.dtype}")
    if n and (arr.min() < 0 or arr.max() > MAX_ID):
        raise InvalidInput("ids must be between 0 and 2**63 - 1")
    arr = arr.astype(np.int64)
    if len(np.unique(arr)) != n:
        raise InvalidInput("ids repeat within one add: give each memory its own id")
    return arr


def texts(value: Any, vectors: Any) -> tuple[list[str], int, bool]:
    """(the texts, how many memories, whether texts were given) for add(texts, vectors=...)."""
    if isinstance(value, str):
        value = [value]
    if value is None:
        if vectors is None:
            raise InvalidInput("add needs texts, vectors, or both")
        n = 1 if np.asarray(vectors).ndim == 1 else len(vectors)
        return [""] * n, n, False
    if not isinstance(value, (list, tuple)):
        raise InvalidInput(f"texts must be a str or a list of str, got {type(value).__name__}")
    out = list(value)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise InvalidInput(f"texts[{i}] is {type(t).__name__}, expected str")
        if not t.strip():
            raise InvalidInput(f"texts[{i}] is empty: give it content or drop it")
        try:
            t.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInput(f"texts[{i}] is not valid Unicode text (lone surrogates): decode it properly") from None
    return out, len(out), True


def unit_rows(vectors: Any, n: int, dim_: int) -> np.ndarray:
    """(n, dim) finite, non-zero rows -> C-contiguous float32 unit rows. The only place a stored vector is checked
    and normalised: embedders' output and the caller's vectors both come through here."""
    arr = np.asarray(vectors)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape != (n, dim_):
        raise InvalidInput(f"vectors must have shape ({n}, {dim_}); got {arr.shape}")
    if arr.dtype.kind not in "fiu":
        raise InvalidInput(f"vectors must be numeric, got dtype {arr.dtype}")
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if not np.isfinite(arr).all():
        raise InvalidInput("vectors contain NaN or infinite values: clean them (np.nan_to_num) or drop those rows")
    norms = np.linalg.norm(arr, axis=1)
    if (norms == 0).any():
        raise InvalidInput(f"vector {int(np.argmin(norms))} is all zeros: it has no direction to search by")
    return arr / norms[:, None]


def embedded_rows(vectors: np.ndarray, n: int, dim_: int) -> np.ndarray:
    """What the store's own Embedder returned: its contract is (n, dim) finite unit rows (resolve_embedder wraps a
    plain callable so that it checks and normalises its output), so only the shape is confirmed here."""
    if vectors.shape != (n, dim_):
        raise InvalidInput(f"the embedder returned shape {vectors.shape} for {n} texts; expected ({n}, {dim_})")
    return np.ascontiguousarray(vectors, dtype=np.float32)


def unit_query(vector: Any, dim_: int) -> np.ndarray:
    """A (dim,) query -> float32 unit vector."""
    arr = np.asarray(vector)
    if arr.ndim != 1 or arr.shape[0] != dim_:
        raise InvalidInput(f"a query vector must have shape ({dim_},), got {arr.shape}")
    if arr.dtype.kind not in "fiu":
        raise InvalidInput(f"a query vector must be numeric, got dtype {arr.dtype}")
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    unit = scaled_to_unit(arr)
    if unit is not None:
        return unit
    wide = arr.astype(np.float64)
    square = float(np.dot(wide, wide))
    if not 0.0 < square < math.inf:
        if not np.isfinite(arr).all():
            raise InvalidInput("the query vector contains NaN or infinite values")
        raise InvalidInput("the query vector is all zeros")
    return (wide / math.sqrt(square)).astype(np.float32)  # far outside float32's comfortable range: divide in float64


def scaled_to_unit(arr: np.ndarray) -> np.ndarray | None:
    """A float32 vector divided by its length, or None when the length is zero, not finite, or far outside float32's
    comfortable range (unit_query then says what is wrong, or divides in float64). One float64 sum of squares checks it:
    the square of float32 values neither overflows nor underflows in float64, so it is finite and positive exactly
    when every value is finite and one is not zero."""
    loops = compiled_stages()
    if loops is not None:
        return loops.scaled_to_unit(arr)  # the same checks, a fixed order of summing, without four numpy calls
    wide = arr.astype(np.float64)
    norm = math.sqrt(float(np.dot(wide, wide)))
    if 1e-30 < norm < 1e30:
        return arr / np.float32(norm)
    return None


def query_text(query: str, has_embedder: bool) -> str:
    """A query that is not blank, for a store that has an embedder to turn it into a vector."""
    if not query.strip():
        raise InvalidInput("the query is empty: search for some text")
    if not has_embedder:
        raise InvalidInput("this store has no embedder: search with a vector")
    return query


def k(value: Any) -> int:
    """An int in 1..MAX_K -> int."""
    if not _is_int(value) or not 1 <= value <= MAX_K:
        raise InvalidInput(f"k must be an int in 1..{MAX_K}, got {value!r}")
    return int(value)


def namespace(value: Any) -> str:
    """The stored name of a namespace given as a str or a tuple of labels (namespaces.namespace_name)."""
    return namespace_name(value)


def optional_namespace(value: Any) -> str | None:
    """None (every namespace) or the stored name of a namespace given as a str or a tuple of labels."""
    return None if value is None else namespace_name(value)


def ttl(value: Any) -> float | None:
    """None (never expires) or a time to live in seconds, a finite number > 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidInput(f"ttl must be a number of seconds > 0 (or None: never expires), got {value!r}")
    return float(value)


def where(value: Any) -> str | None:
    """None or a non-empty SQL filter string that stays inside the parentheses the store puts it in (LanceDB checks
    the SQL when it runs it): a filter that closed them could reach past the namespace it is searched in."""
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise InvalidInput("where must be a non-empty SQL filter string, e.g. \"role = 'user'\"")
    if value is not None:
        from ..storage import filter_escape  # the cold tier owns the SQL it builds; imported with it

        escape = filter_escape(value)
        if escape is not None:
            raise InvalidInput(f"the where filter {value!r} {escape}")
    return value


def per_row(value: Any, n: int, what: str, *, kind: type) -> list:
    """One value for all n memories, or a list with one per memory (None allowed)."""
    if value is None or isinstance(value, kind):
        return [value] * n
    if not isinstance(value, (list, tuple)):
        raise InvalidInput(f"{what} must be a {kind.__name__}, None, or a list with one per memory")
    if len(value) != n:
        raise InvalidInput(f"{what} has {len(value)} values for {n} memories: give one per memory or one for all")
    for i, v in enumerate(value):
        if v is not None and not isinstance(v, kind):
            raise InvalidInput(f"{what}[{i}] is {type(v).__name__}, expected {kind.__name__} or None")
    return list(value)


def metadata(value: Any, n: int) -> list[dict | None]:
    """One metadata dict (or None) for all n memories or one per memory, each JSON-serialisable -> a list of n."""
    metas = per_row(value, n, "metadata", kind=dict)
    for i, meta in enumerate(metas):
        if meta is not None:
            try:
                encode_metadata(meta)  # as the store keeps it: NaN and infinities are not JSON
            except (TypeError, ValueError) as exc:
                raise InvalidInput(f"metadata[{i}] is not JSON-serialisable ({exc}): keep to "
                                   "str/int/float/bool/list/dict") from None
    return metas


def timestamps_us(created_at: Any, n: int, what: str = "created_at") -> np.ndarray:
    """created_at (None, a datetime or epoch seconds, one for all or one per memory) -> (n,) int64 microseconds;
    `what` names the argument in messages."""
    now = time.time_ns() // 1000
    if created_at is None:
        return np.full(n, now, dtype=np.int64)
    values = created_at if isinstance(created_at, (list, tuple, np.ndarray)) else [created_at] * n
    if len(values) != n:
        raise InvalidInput(f"{what} has {len(values)} values for {n} memories: give one per memory or one for all")
    out = np.empty(n, dtype=np.int64)
    for i, value in enumerate(values):
        if value is None:
            out[i] = now
        elif isinstance(value, datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=timezone.utc)
            out[i] = round(value.timestamp() * 1e6)  # a datetime holds whole microseconds: keep them exact
        elif isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
            if not np.isfinite(value):
                raise InvalidInput(f"{what}[{i}] is not finite: pass a datetime or epoch seconds")
            out[i] = int(float(value) * 1e6)
        else:
            raise InvalidInput(f"{what}[{i}] is {type(value).__name__}: pass a datetime or epoch seconds")
    return out


COLD_OPTIONS = ("table_uri", "storage_options", "wal_flush_s", "wal_flush_rows")


def cold_options(value: Any) -> dict[str, Any]:
    """The cold-tier options TieredMemory passes on (the ColdStore checks their values); {} for None."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"cold_options must be a dict (keys {', '.join(COLD_OPTIONS)}) or None, got "
                           f"{type(value).__name__}")
    unknown = sorted(str(key) for key in value if key not in COLD_OPTIONS)
    if unknown:
        raise InvalidInput(f"cold_options has {', '.join(unknown)}: it takes {', '.join(COLD_OPTIONS)}")
    return dict(value)
