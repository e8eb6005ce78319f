"""One shard of a cluster, as a Ray actor: a TieredMemory whose hot tier is its node's GPU or a CPU sidecar and whose
cold tier's table lives in object storage, its node-local state in a folder of its own; it serves the namespaces its
ownership view gives it, makes writes durable as the cluster's durability says (group commit), and carries out its
part of moves. Started and restarted by Ray; it (re)opens its store in the background and answers "retry" until then.
"""
from __future__ import annotations

import os
import pickle
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from ..errors import InvalidInput, StorageError
from . import replies
from .config import ClusterConfig, config_from_public
from .group_commit import GroupCommit
from .objectstore import MoveStaging, storage_error
from .ownership import View
from .redaction import StorageOptions, redact, redact_process_logs
from .replies import Reply
from .shard_core import ShardCore
from .shard_folder import (STORE, Lease, ViewPublisher, default_local_root, keeps_folder, mark_incarnation, settle,
                           shard_folder)

RAY_NAMESPACE = "tiered_recall"
# What clients call through Shard.call (the directory calls the rest by name).
CLIENT_METHODS = frozenset({"search_one", "search_many", "get_many", "vectors_many", "counts_many", "count_one",
                            "memories_page", "add", "delete_many", "pin", "stats"})
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_IMPORT_CHUNK = 1000
_OPEN_BACKOFF_MAX_S = 10.0


def actor_name(cluster: str, role: str) -> str:
    """The Ray actor name of a cluster's directory ("directory") or of one of its shards."""
    return f"{cluster}:{role}"


def _datetime(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=int(us))


def _not_ready(reason: str | None) -> Reply:
    return Reply(replies.RETRY, value=reason or "starting", retry_s=0.5)


class Shard:
    """The Ray actor of one shard (the cluster's launch code gives it its resources and restart policy)."""

    def __init__(self, cluster: str, shard: str, public_config: dict, storage_options: StorageOptions) -> None:
        self.cluster, self.shard = cluster, shard
        self.config: ClusterConfig = config_from_public(public_config, storage_options)
        self.secrets = self.config.secrets()
        redact_process_logs(self.secrets)
        import ray

        self.node = ray.get_runtime_context().get_node_id()
        self.epoch: int | None = None
        self.folder: Path | None = None
        self.core: ShardCore | None = None
        self.error: str | None = None
        self._pending_view: View | None = None
        self._closed = False
        self._lease: Lease | None = None
        self._publisher: ViewPublisher | None = None
        self._commits: GroupCommit | None = None
        self._staging: MoveStaging | None = None
        self._opened: ShardCore | None = None
        self._pulling = threading.Lock()
        self._opener = threading.Thread(target=self._open_loop, name=f"tiered-recall-{shard}-open", daemon=True)
        self._opener.start()

    # ---- opening -----------------------------------------------------------------------------
    def _directory(self):
        import ray

        return ray.get_actor(actor_name(self.cluster, "directory"), namespace=RAY_NAMESPACE)

    def _open_loop(self) -> None:
        import ray

        pause = 0.5
        while not self._closed and self.core is None:
            try:
                if self.epoch is None:
                    self.epoch, last_opened, view = ray.get(
                        self._directory().register.remote(self.shard, self.node), timeout=60)
                    self._pending_view = View.from_json(view)
                    root = self.config.local_root or default_local_root()
                    self.folder = shard_folder(root, self.cluster, self.shard)
                    settle(self.folder, keep=keeps_folder(self.folder, last_opened, self.node))
                if self._lease is None:
                    self._lease = Lease(self.folder)
                if self._opened is None:
                    self._opened = self._open_store()
                core = self._opened
                ray.get(self._directory().opened.remote(self.shard, self.epoch, self.node, str(self.folder),
                                                        core.memory.dim), timeout=60)
                mark_incarnation(self.folder, epoch=self.epoch, node=self.node)
                self.core = core  # serves from here on: a view pushed meanwhile is applied next
                self.error = None
                pending = self._pending_view
                if pending is not None and pending.version > core.view.version:
                    self.apply_view(pending.to_json())
            except Exception as exc:
                self.error = redact(f"{type(exc).__name__}: {exc}", self.secrets)
                time.sleep(pause)
                pause = min(_OPEN_BACKOFF_MAX_S, pause * 2)

    def _open_store(self) -> ShardCore:
        from ..coordinator import TieredMemory

        config = self.config
        cold = {"table_uri": config.shard_table_uri(self.shard), "storage_options": config.storage_options.plain()
                or None}
        if config.durability == "local":
            cold["wal_flush_s"] = config.flush_s
        try:
            memory = TieredMemory(self.folder / STORE, dim=config.dim, embedder=config.embedder,
                                  device=config.device, hot_capacity=config.hot_capacity, cold_options=cold)
        except StorageError as exc:
            raise storage_error(f"open the table of {self.shard}", config, exc) from None
        view = self._pending_view
        self._publisher = ViewPublisher(self.folder)
        self._commits = GroupCommit(memory.cold.flush)
        core = ShardCore(self.shard, memory, view, self.secrets)
        self._publish(core.view)
        return core

    def _publish(self, view: View) -> None:
        self._publisher.publish({"shard": self.shard, "epoch": self.epoch, "node": self.node,
                                 "view": view.to_json(), "pid": os.getpid()})

    # ---- the view ------------------------------------------------------------------------------
    def apply_view(self, view_json: dict) -> int:
        """Applies a newer ownership view (the directory pushes each one); returns the version now applied. Waits
        for the requests already running, so a namespace's writes stop before its move copies it."""
        view = View.from_json(view_json)
        core = self.core
        if core is None:
            if self._pending_view is None or view.version > self._pending_view.version:
                self._pending_view = view
            return view.version
        if view.version <= core.view.version:
            return core.view.version
        with core.gate.exclusive():
            core.view = view
            core.refresh_excluded()
            self._publish(view)
        return view.version

    def _pull_view(self) -> None:
        """A caller knows a newer view than this shard applied (a push it missed): fetch it, once at a time."""
        if not self._pulling.acquire(blocking=False):
            return

        def pull() -> None:
            import ray

            try:
                self.apply_view(ray.get(self._directory().view_json.remote(), timeout=30))
            except Exception:  # tried again by the next request that finds this shard behind
                pass
            finally:
                self._pulling.release()

        threading.Thread(target=pull, daemon=True).start()

    def _ready(self, version: int | None = None) -> Reply | ShardCore:
        core = self.core
        if core is None or self._closed:
            return _not_ready("closed" if self._closed else self.error)
        if version is not None and version > core.view.version:
            self._pull_view()
        return core

    # ---- the clients' data path ------------------------------------------------------------------
    def call(self, method: str, payload: bytes) -> bytes:
        """A client's request: one of the methods below with its arguments, and the Reply, both as plain pickles
        (Ray's own serializer costs a few hundred microseconds more for a query vector and a list of hits)."""
        if method not in CLIENT_METHODS:
            return pickle.dumps(Reply(replies.ERROR, error=("InvalidInput", f"no shard method {method!r}")))
        try:
            reply = getattr(self, method)(*pickle.loads(payload))
        except Exception as exc:  # the methods answer their own failures; this is the last guard (no credential out)
            reply = replies.failure(exc, self.secrets)
        return pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)

    # ---- reads ---------------------------------------------------------------------------------
    def search_one(self, namespace: str, query: Any, k: int, options: dict, vouched: bool = False) -> Reply:
        """TieredMemory.search of one namespace, when this shard serves it."""
        core = self._ready()
        return core if isinstance(core, Reply) else core.guarded(core.search_one, namespace, query, k, options,
                                                                 vouched)

    def search_many(self, version: int, query: Any, k: int, prefix: str | None, options: dict) -> Reply:
        """A search over the namespaces this shard serves (a prefix, or all), at the caller's view version."""
        core = self._ready(version)
        return core if isinstance(core, Reply) else core.guarded(core.search_many, version, query, k, prefix,
                                                                 options)

    def get_many(self, version: int, ids: list[int], refresh_ttl: bool = False) -> Reply:
        """The memories of these ids this shard serves (refresh_ttl: their time to live started again)."""
        core = self._ready(version)
        if isinstance(core, Reply):
            return core
        reply = core.guarded(core.get_many, version, ids, refresh_ttl)
        return self._committed(reply) if refresh_ttl else reply

    def vectors_many(self, version: int, ids: list[int]) -> Reply:
        """The stored vectors of these ids this shard serves."""
        core = self._ready(version)
        return core if isinstance(core, Reply) else core.guarded(core.vectors_many, version, ids)

    def counts_many(self, version: int) -> Reply:
        """The namespaces this shard serves, with their memories and hot rows."""
        core = self._ready(version)
        return core if isinstance(core, Reply) else core.guarded(core.counts_many, version)

    def count_one(self, namespace: str, vouched: bool = False) -> Reply:
        """Memories of one namespace, when this shard serves it."""
        core = self._ready()
        return core if isinstance(core, Reply) else core.guarded(core.count_one, namespace, vouched)

    def memories_page(self, version: int, namespace: str | None, after: tuple | None, limit: int,
                      vouched: bool = False) -> Reply:
        """A page of memories (of one namespace, or of all this shard serves), oldest first, past a key."""
        core = self._ready(version)
        return core if isinstance(core, Reply) else core.guarded(core.memories_page, version, namespace, after,
                                                                 limit, vouched)

    # ---- writes --------------------------------------------------------------------------------
    def _committed(self, reply: Reply) -> Reply:
        """With object durability, the reply once a commit that began after the write is done (group commit)."""
        if reply.kind != replies.OK or self.config.durability != "object":
            return reply
        try:
            self._commits.wait()
        except Exception as exc:
            hint = storage_error("commit the shard's log to object storage", self.config, exc)
            return replies.failure(StorageError(
                f"not acknowledged: the write is durable in {self.shard}'s node-local log but could not be committed "
                f"to object storage ({hint}); it is committed when the store is back, unless the node is lost "
                "first: write it again with the same ids to be sure"), self.secrets)
        return reply

    def add(self, namespace: str, payload: dict, vouched: bool = False) -> Reply:
        """TieredMemory.add into one namespace (payload: its other arguments, ids included)."""
        core = self._ready()
        if isinstance(core, Reply):
            return core

        def write() -> Reply:
            redirect = core.decide(namespace, write=True, vouched=vouched)
            if redirect is not None:
                return redirect
            return replies.ok(core.memory.add(namespace=namespace, **payload), core.view.version)

        return self._committed(core.guarded(write))

    def delete_many(self, version: int, ids: list[int]) -> Reply:
        """Deletes the ids this shard holds in namespaces it serves: (deleted, ids to retry: their namespace moves)."""
        core = self._ready(version)
        if isinstance(core, Reply):
            return core

        def delete() -> Reply:
            if version != core.view.version:
                return Reply(replies.STALE, version=core.view.version)
            found = core.memory.get(ids)
            present = core.memory.vectors(ids)
            chosen, retry = [], []
            for i, memory, vector in zip(ids, found, present):
                if vector is None:
                    continue
                if memory is None:  # expired, not swept yet: gone for every reader, deleted where it lies
                    chosen.append(i)
                    continue
                redirect = core.decide(memory.namespace, write=True, vouched=True)
                if redirect is None:
                    chosen.append(i)
                elif redirect.kind == replies.RETRY:
                    retry.append(i)
            deleted = core.memory.delete(chosen) if chosen else 0
            return replies.ok((deleted, retry), core.view.version)

        return self._committed(core.guarded(delete))

    def pin(self, namespace: str | None, ids: list[int] | None, unpin: bool = False) -> Reply:
        """TieredMemory.pin (or unpin) on this shard."""
        core = self._ready()
        if isinstance(core, Reply):
            return core
        method = core.memory.unpin if unpin else core.memory.pin
        return core.guarded(lambda: replies.ok(method(namespace=namespace, ids=ids), core.view.version))

    # ---- moves ---------------------------------------------------------------------------------
    def held(self) -> Reply:
        """Every namespace this shard holds rows of, with their counts (what a move surveys)."""
        core = self._ready()
        return core if isinstance(core, Reply) else core.guarded(lambda: replies.ok(core.held(), core.view.version))

    def _staged(self) -> MoveStaging:
        if self._staging is None:
            self._staging = MoveStaging(self.config)
        return self._staging

    def export(self, namespaces: list[str], table: str) -> Reply:
        """Stages every live memory of these namespaces (moving away from this shard, so no write reaches them) in
        object storage; {namespace: memories staged}."""
        core = self._ready()
        if isinstance(core, Reply):
            return core

        def export() -> Reply:
            for ns in namespaces:
                if core.view.moving.get(ns, ("", ""))[0] != self.shard:
                    raise InvalidInput(f"{ns!r} is not moving away from {self.shard} at view {core.view.version}")
            memories, vectors, counts = [], [], {}
            for ns in namespaces:
                listed = list(core.memory.memories(ns))
                found = core.memory.vectors([m.id for m in listed]) if listed else []
                kept = [(m, v) for m, v in zip(listed, found) if v is not None]
                memories.extend(m for m, _ in kept)
                vectors.extend(v for _, v in kept)
                counts[ns] = len(kept)
            self._staged().write(table, memories, vectors, core.memory.dim)
            return replies.ok(counts, core.view.version)

        return core.guarded(export)

    def _delete_namespaces(self, core: ShardCore, namespaces: list[str]) -> int:
        deleted = 0
        for ns in namespaces:
            ids = core.memory.cold.ids_where("id IS NOT NULL", namespace=ns)
            for lo in range(0, len(ids), _IMPORT_CHUNK):
                deleted += core.memory.delete([int(i) for i in ids[lo:lo + _IMPORT_CHUNK]])
        return deleted

    def import_rows(self, namespaces: list[str], table: str) -> Reply:
        """Takes in the staged memories of namespaces moving to this shard (a copy an interrupted move left here is
        replaced), commits them to object storage whatever the durability, and checks every one is here (or has
        expired meanwhile); {namespace: memories taken in}."""
        core = self._ready()
        if isinstance(core, Reply):
            return core

        def take() -> Reply:
            for ns in namespaces:
                if core.view.moving.get(ns, ("", ""))[1] != self.shard:
                    raise InvalidInput(f"{ns!r} is not moving to {self.shard} at view {core.view.version}")
            self._delete_namespaces(core, namespaces)
            rows = self._staged().read(table)
            groups: dict[tuple, list[int]] = {}
            for j, (ns, ttl) in enumerate(zip(rows["namespace"], rows["ttl_s"])):
                groups.setdefault((ns, ttl), []).append(j)
            import json

            for (ns, ttl), members in groups.items():
                for lo in range(0, len(members), _IMPORT_CHUNK):
                    part = members[lo:lo + _IMPORT_CHUNK]
                    expires = [rows["expires_at_us"][j] for j in part]
                    core.memory.add(
                        [rows["text"][j] for j in part], vectors=rows["vector"][part], namespace=ns,
                        ids=[int(rows["id"][j]) for j in part], session=[rows["session"][j] for j in part],
                        role=[rows["role"][j] for j in part],
                        metadata=[json.loads(rows["metadata"][j]) or None for j in part],
                        created_at=[_datetime(rows["created_at_us"][j]) for j in part],
                        ttl=ttl, expires_at=None if ttl is None else [_datetime(e) for e in expires])
            core.memory.cold.flush()
            now_us = time.time_ns() // 1000
            present = core.memory.vectors([int(i) for i in rows["id"]]) if len(rows["id"]) else []
            missing = [int(i) for i, v, e in zip(rows["id"], present, rows["expires_at_us"])
                       if v is None and (e is None or e > now_us)]
            if missing:
                raise StorageError(f"{len(missing)} memories staged for {self.shard} are not there after the import "
                                   "(the move is tried again)")
            counts: dict[str, int] = {}
            for ns in rows["namespace"]:
                counts[ns] = counts.get(ns, 0) + 1
            core.refresh_excluded()
            return replies.ok(counts, core.view.version)

        return core.guarded(take)

    def drop(self, namespaces: list[str]) -> Reply:
        """Deletes this shard's copy of namespaces that moved away (it no longer answers for them), committed to
        object storage; how many rows went."""
        core = self._ready()
        if isinstance(core, Reply):
            return core

        def drop() -> Reply:
            for ns in namespaces:
                if core.view.serves_held(self.shard, ns):
                    raise InvalidInput(f"{self.shard} still serves {ns!r} at view {core.view.version}: not dropped")
            deleted = self._delete_namespaces(core, namespaces)
            core.memory.cold.flush()
            core.refresh_excluded()
            return replies.ok(deleted, core.view.version)

        return core.guarded(drop)

    def drop_staging(self, table: str) -> None:
        """Drops a move's staging table."""
        self._staged().drop(table)

    # ---- reports and life cycle ------------------------------------------------------------------
    def info(self) -> dict:
        """The shard's node, folder, incarnation, readiness, last error and view version."""
        core = self.core
        return {"shard": self.shard, "node": self.node, "folder": None if self.folder is None else str(self.folder),
                "epoch": self.epoch, "ready": core is not None and not self._closed, "error": self.error,
                "version": None if core is None else core.view.version, "pid": os.getpid()}

    def stats(self) -> Reply:
        """info() with the store's stats and the group commit's figures."""
        core = self._ready()
        if isinstance(core, Reply):
            return core
        return core.guarded(lambda: replies.ok(
            {**self.info(), "memory": core.memory.stats(), "group_commit": self._commits.figures(),
             "durability": self.config.durability}, core.view.version))

    def close(self) -> bool:
        """Flushes the log to object storage and closes the store (before `cluster down` ends the actor)."""
        self._closed = True
        core = self.core
        if core is not None:
            with core.gate.exclusive():
                core.memory.close()
        for part in (self._publisher, self._lease):
            if part is not None:
                part.close()
        return True
