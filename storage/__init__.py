"""The cold tier: durable LanceDB storage with exact (and, when large, ANN) search; see ColdStore."""
from ._schema import TABLE_NAME, filter_escape
from .cold_store import ColdStore

__all__ = ["ColdStore", "TABLE_NAME", "filter_escape"]
