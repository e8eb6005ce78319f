"""The exception hierarchy: one class per failure kind, all under TieredRecallError."""
from __future__ import annotations


class TieredRecallError(Exception):
    """Base class of every error this package raises on purpose."""


class InvalidInput(TieredRecallError, ValueError):
    """A caller passed something unusable; the message names the fix. Nothing was written."""


class SidecarUnavailable(TieredRecallError):
    """The hot-tier sidecar is not running, died, or did not answer within the timeout."""


class IncompatibleLayout(TieredRecallError):
    """The shared-memory segment was made by a different layout version or for another dim/dtype."""


class HotTierFull(TieredRecallError):
    """The hot tier cannot take the rows (e.g. a batch larger than its whole capacity)."""


class SidecarError(TieredRecallError):
    """The sidecar refused a request and said why (the message is the sidecar's own)."""


class ReadOnlyStore(TieredRecallError):
    """A write (or a read that needs one) on a store opened read-only; the message says how to open it writable."""


class StorageError(TieredRecallError):
    """The cold tier (LanceDB / FAISS on disk) failed: disk full, corrupt table, permissions."""


class ShardUnavailable(TieredRecallError):
    """A cluster's shard cannot answer now (restarting after a failure, or its namespaces moving): nothing partial was
    returned and nothing of a failed write is known to be kept; call again after `retry_after_s` seconds."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def __reduce__(self):
        return (type(self), (str(self), self.retry_after_s))


class ClusterUnavailable(TieredRecallError):
    """No cluster could be reached: Ray is not installed or not running at the address, or no tiered-recall cluster
    of that name runs on it; the message names the fix."""
