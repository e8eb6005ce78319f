"""Type stub for the compiled search fast path `tiered_recall._trfast` (native/src/fastsearch.c).

A CPython extension over the same client code as libtrclient (native/src/client.c): one call checks the arguments,
allocates the result arrays, reads the query straight from the caller's array and writes the results straight into
the new arrays, with the GIL released while it waits. `tiered_recall._native.fast_search_module` loads it from the
folder libtrclient came from, and uses it only when `API` and `LAYOUT_VERSION` match what the Python package expects;
`HotTier` then routes `search` through `FastClient.search` and falls back to its own path when that returns None.
"""
from __future__ import annotations

from typing import Callable, Union

import numpy as np
import numpy.typing as npt

API: int
"""What FastClient offers (2: search and close); must equal tiered_recall._native.FAST_SEARCH_API."""

LAYOUT_VERSION: int
"""The segment layout this build speaks (TR_LAYOUT_VERSION); must equal tiered_recall._layout.LAYOUT_VERSION."""

# (rc, status, message): the call failed; rc is a tr_call_rc (CALL_OK when the sidecar answered with an error
# status), status a tr_status, message the sidecar's message (empty unless status is set).
_CallFailure = tuple[int, int, bytes]


class FastClient:
    """One attachment's search fast path over a mapped segment.

    FastClient(base, pid, timeout_ns, spin_ns, yield_ns, result_type)

    base: the address of the mapped segment (non-zero); the caller keeps the mapping alive until close() has
    returned True. pid: the attaching process's pid (written into the slots it claims). timeout_ns, spin_ns,
    yield_ns: how long a call waits for its answer in all, busy-polls, and then polls with sched_yield before it
    sleeps on the slot's futex. result_type: called as result_type(ids, scores, hits, service_ns), or, when it is a
    class whose __slots__ hold exactly those four writable object slots, filled in place without a call.
    """

    def __init__(self, base: int, pid: int, timeout_ns: int, spin_ns: int, yield_ns: int,
                 result_type: Callable[[np.ndarray, np.ndarray, int, int], object]) -> None: ...

    def search(self, queries: npt.NDArray[np.float32], k: int, normalize: bool, touch: bool,
               namespace_hash: int | None, /) -> Union[object, _CallFailure, None]:
        """One SEARCH request: queries (d,) or (nq, d) float32, C-contiguous, in this machine's byte order.

        Returns result_type(ids (nq, k) int64, scores (nq, k) float32, hits, service_ns) on success;
        (rc, status, message) when the call failed (Python raises the error that fits); None when the arguments are
        not for this path (wrong dtype, shape or layout, k out of range, a namespace that is not an int, a batch too
        large for one slot) or the client is closed: the caller's own path then checks them and says what is wrong.
        normalize: the sidecar normalises the queries; touch: the hits count as used (LRU); namespace_hash: only
        rows of this namespace (None: all).
        """

    def close(self, timeout_s: float, /) -> bool:
        """No search enters after this call; waits (GIL released) until none is inside the segment, at most
        timeout_s seconds. True when none is: the caller may then unmap the segment."""
