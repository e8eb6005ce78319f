"""A client process on a shard's own node reads that shard with no Ray hop: it opens the shard's node-local store
folder as a TieredMemory (one more process on a store any number of processes share; its searches reach the shard's
hot tier through shared memory as always) and applies the shard's published ownership view itself. Before it trusts
an answer it checks, after the search, that the view it used is still the one published and that the shard still
holds its lease on that folder; otherwise the client asks the shard through Ray."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .config import ClusterConfig
from .ownership import View
from .replies import OK, Reply
from .shard_core import ShardCore
from .shard_folder import STORE, ViewReader

logger = logging.getLogger("tiered_recall")
# The co-located process leaves expiry to the shard: a sweep here would only repeat the shard's.
_SWEEP_LEFT_TO_THE_SHARD_S = 7 * 24 * 3600.0


class CoLocatedShard:
    """The reads of one shard on this node, served in this process."""

    def __init__(self, shard: str, folder: str, config: ClusterConfig) -> None:
        from ..coordinator import TieredMemory

        self.shard = shard
        self.folder = Path(folder)
        self.reader = ViewReader(self.folder)
        cold = {"table_uri": config.shard_table_uri(shard),
                "storage_options": config.storage_options.plain() or None}
        self.memory = TieredMemory(self.folder / STORE, dim=config.dim, embedder=config.embedder,
                                   device="none" if config.device == "none" else "auto",
                                   hot_capacity=config.hot_capacity, cold_options=cold,
                                   ttl_sweep_s=_SWEEP_LEFT_TO_THE_SHARD_S)
        self._core: ShardCore | None = None
        self._sequence = -1
        self.served = 0
        self.declined = 0

    def core(self) -> tuple[ShardCore, int] | None:
        """The shard's reads under its current published view, and that view's sequence number; None while a view
        is being written or the shard is not live here."""
        sequence = self.reader.sequence()
        if sequence & 1:
            return None
        if sequence != self._sequence or self._core is None:
            published = self.reader.load()
            if published is None or published.get("shard") != self.shard or self.reader.sequence() != sequence:
                return None
            view = View.from_json(published["view"])
            if self._core is None:
                self._core = ShardCore(self.shard, self.memory, view)
            else:
                self._core.view = view
                self._core.refresh_excluded()
            self._sequence = sequence
        return self._core, sequence

    def answer(self, method: str, *args: Any) -> Reply | None:
        """The reply of the shard's read `method`, when it is served here and nothing changed while it ran; None to
        ask the shard through Ray instead."""
        found = self.core()
        if found is None:
            self.declined += 1
            return None
        core, sequence = found
        reply = getattr(core, method)(*args)
        if reply.kind != OK or self.reader.sequence() != sequence or not self.reader.shard_alive():
            self.declined += 1
            return None
        self.served += 1
        return reply

    def lost(self) -> bool:
        """True when no live shard holds this folder's lease any more."""
        self.reader.forget_probe()
        return not self.reader.shard_alive()

    def close(self) -> None:
        """Closes this process's store of the shard (the shard runs on)."""
        try:
            self.memory.close()
        finally:
            self.reader.close()
