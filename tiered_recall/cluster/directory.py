"""The directory of one cluster, a detached named Ray actor: which shards exist, where they run, each one's incarnation,
and the ownership view (which namespaces a move is taking where); kept as a manifest in the cluster's storage, so a
restarted directory, or a cluster started again on a new Ray, finds it all again. Clients find it by name. It pushes
each new view to every shard before it takes the next step of a move (mover.py)."""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from ..errors import InvalidInput, ShardUnavailable
from . import replies
from .config import config_from_public
from .manifest import ManifestStore
from .ownership import View
from .placement import CPU, shard_options
from .redaction import StorageOptions, redact, redact_process_logs
from .replies import Reply
from .shard import RAY_NAMESPACE, actor_name

PUSH_TIMEOUT_S = 10.0
READY_TIMEOUT_S = 180.0
CALL_TIMEOUT_S = 300.0


def shard_actor_class():
    """The shard's Ray actor class (Ray imported here, on first use)."""
    import ray

    from .shard import Shard

    return ray.remote(Shard)


class Directory:
    """The Ray actor (async) that keeps a cluster's manifest and runs its moves."""

    def __init__(self, cluster: str, public_config: dict, storage_options: StorageOptions) -> None:
        self.cluster = cluster
        self.config = config_from_public(public_config, storage_options)
        self.secrets = self.config.secrets()
        redact_process_logs(self.secrets)
        self._store: ManifestStore | None = None
        self._version = 0
        self._body: dict[str, Any] | None = None
        self._lock: asyncio.Lock | None = None
        self._handles: dict[str, Any] = {}
        self._mover: asyncio.Task | None = None
        self.last_error: str | None = None
        self.moved = 0
        self.stopping = False

    # ---- state ---------------------------------------------------------------------------------
    async def _ready(self) -> None:
        if self._lock is None:
            self._lock = asyncio.Lock()
        if self._body is None:
            async with self._lock:
                if self._body is None:
                    await asyncio.to_thread(self._load)
        if self._mover is None and self.view.target is not None and not self.stopping:
            self._start_mover()

    def _load(self) -> None:
        store = ManifestStore(self.config)
        found = store.load()
        if found is None:
            version, body = 0, {"config": self.config.public(), "view": View(0, ()).to_json(), "shards": {},
                                "next_shard": 0, "removing": []}
        else:
            version, body = found
        self._store, self._version, self._body = store, version, body

    @property
    def view(self) -> View:
        """The ownership view the manifest holds now."""
        return View.from_json(self._body["view"])

    async def _persist(self) -> None:
        self._version = await asyncio.to_thread(self._store.write, self._version, self._body)

    async def _set_view(self, view: View) -> None:
        """Persists a new view and pushes it to every shard (the lock held: no shard registers meanwhile)."""
        self._body["view"] = view.to_json()
        await self._persist()
        await self._push()

    async def _push(self) -> None:
        view = self._body["view"]

        async def one(shard: str) -> None:
            handle = self._handle(shard)
            if handle is None:
                return
            try:  # a shard that misses a push pulls the view when a caller shows it a newer version
                await asyncio.wait_for(handle.apply_view.remote(view), PUSH_TIMEOUT_S)
            except Exception:
                pass

        await asyncio.gather(*(one(shard) for shard in self._body["shards"]))

    async def update_view(self, **changes: Any) -> View:
        """The view with these fields changed, one version on, persisted and pushed to every shard."""
        async with self._lock:
            view = dataclasses.replace(self.view, version=self.view.version + 1, **changes)
            await self._set_view(view)
            return view

    # ---- shards --------------------------------------------------------------------------------
    def _handle(self, shard: str):
        handle = self._handles.get(shard)
        if handle is None:
            import ray

            try:
                handle = ray.get_actor(actor_name(self.cluster, shard), namespace=RAY_NAMESPACE)
            except ValueError:
                return None
            self._handles[shard] = handle
        return handle

    def _start_shard(self, shard: str, kind: str, node: str | None) -> None:
        options = shard_options(self.config, actor_name(self.cluster, shard), RAY_NAMESPACE, kind, node)
        handle = shard_actor_class().options(**options).remote(self.cluster, shard, self.config.public(),
                                                               self.config.storage_options)
        self._handles[shard] = handle

    async def _wait_ready(self, shards: list[str], timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        pending = set(shards)
        errors: dict[str, str | None] = {}
        while pending and time.monotonic() < deadline:
            for shard in sorted(pending):
                try:
                    info = await asyncio.wait_for(self._handle(shard).info.remote(), 10)
                except Exception as exc:
                    errors[shard] = f"{type(exc).__name__}"
                    continue
                if info["ready"]:
                    pending.discard(shard)
                else:
                    errors[shard] = info["error"]
            if pending:
                await asyncio.sleep(0.2)
        if pending:
            said = "; ".join(f"{s}: {errors.get(s) or 'not started yet'}" for s in sorted(pending))
            raise ShardUnavailable(f"shards not ready after {timeout_s:.0f} s ({said})", retry_after_s=5.0)

    async def call(self, shard: str, method: str, *args: Any, timeout_s: float = CALL_TIMEOUT_S) -> Any:
        """A shard's method, its reply's value; retried while the shard restarts or asks to retry."""
        deadline = time.monotonic() + timeout_s
        reason = None
        while time.monotonic() < deadline:
            handle = self._handle(shard)
            try:
                reply: Reply = await asyncio.wait_for(getattr(handle, method).remote(*args), timeout_s)
            except Exception as exc:  # restarting, or gone: ask again for its handle
                self._handles.pop(shard, None)
                reason = type(exc).__name__
                await asyncio.sleep(0.5)
                continue
            if reply is None or not isinstance(reply, Reply):
                return reply
            if reply.kind == replies.OK:
                return reply.value
            if reply.kind == replies.ERROR:
                replies.raise_error(reply, shard)
            reason = reply.value if reply.kind == replies.RETRY else reply.kind
            await asyncio.sleep(max(reply.retry_s, 0.05))
        raise ShardUnavailable(f"{shard} did not answer {method} within {timeout_s:.0f} s ({reason})")

    # ---- what shards call ----------------------------------------------------------------------
    async def register(self, shard: str, node: str) -> tuple[int, dict | None, dict]:
        """A shard's incarnation starts: (its epoch, the last incarnation that opened its store, the view)."""
        await self._ready()
        async with self._lock:
            entry = self._body["shards"].get(shard)
            if entry is None:
                raise InvalidInput(f"{shard} is not a shard of cluster {self.cluster}")
            entry["epoch"] = int(entry.get("epoch", 0)) + 1
            await self._persist()
            return entry["epoch"], entry.get("last_opened"), self._body["view"]

    async def opened(self, shard: str, epoch: int, node: str, folder: str, dim: int) -> None:
        """A shard's incarnation opened its store in `folder` on `node` (a later one on this node keeps it); the
        first one records the width its embedder gave, for a cluster started without --dim."""
        await self._ready()
        async with self._lock:
            entry = self._body["shards"].get(shard)
            if entry is None or int(entry.get("epoch", 0)) != epoch:
                raise ShardUnavailable(f"{shard}'s incarnation {epoch} is not its latest")
            entry.update(last_opened={"epoch": epoch, "node": node}, node=node, folder=folder)
            if self._body["config"].get("dim") is None:
                self._body["config"]["dim"] = int(dim)
            await self._persist()

    async def view_json(self) -> dict:
        """The current ownership view (what a shard that missed a push asks for)."""
        await self._ready()
        return self._body["view"]

    # ---- what clients and the command line call ------------------------------------------------
    async def layout(self) -> dict:
        """What a client needs: the view, each shard's node and folder, the settings and the storage options."""
        await self._ready()
        shards = {s: {"node": e.get("node"), "folder": e.get("folder"), "kind": e.get("kind")}
                  for s, e in self._body["shards"].items()}
        return {"cluster": self.cluster, "view": self._body["view"], "shards": shards,
                "config": self._body["config"], "storage_options": self.config.storage_options}

    async def create(self, layout: list[dict]) -> list[str]:
        """Starts a new cluster's shards (or, for an existing manifest, any shard whose actor is gone); waits until
        each has opened its store."""
        await self._ready()
        async with self._lock:
            shards = self._body["shards"]
            if not shards:
                for spec in layout:
                    shard = f"shard-{self._body['next_shard']}"
                    self._body["next_shard"] += 1
                    shards[shard] = {"kind": spec["kind"], "node_hint": spec.get("node"), "epoch": 0}
                ring = tuple(sorted(shards, key=lambda s: int(s.split("-")[1])))
                self._body["view"] = View(1, ring).to_json()
                await self._persist()
            for shard, entry in shards.items():
                if self._handle(shard) is None:
                    self._start_shard(shard, entry.get("kind", CPU), entry.get("node_hint"))
        await self._wait_ready(list(self._body["shards"]))
        return sorted(self._body["shards"])

    async def add_shard(self, kind: str = CPU, node: str | None = None, wait: bool = True) -> str:
        """Adds a shard and moves to it the namespaces it now owns (about 1/N)."""
        await self._ready()
        async with self._lock:
            self._no_transition()
            shard = f"shard-{self._body['next_shard']}"
            self._body["next_shard"] += 1
            self._body["shards"][shard] = {"kind": kind, "node_hint": node, "epoch": 0}
            await self._persist()
            self._start_shard(shard, kind, node)
        await self._wait_ready([shard])
        async with self._lock:
            view = self.view
            await self._set_view(dataclasses.replace(view, version=view.version + 1,
                                                     target=tuple(sorted(set(view.ring) | {shard}))))
        await self._transition(wait)
        return shard

    async def remove_shard(self, shard: str, wait: bool = True) -> None:
        """Moves a shard's namespaces to the others, then stops it (its table stays in storage, empty)."""
        await self._ready()
        async with self._lock:
            self._no_transition()
            view = self.view
            if shard not in view.ring:
                raise InvalidInput(f"{shard} is not a shard of cluster {self.cluster} (it has {', '.join(view.ring)})")
            if len(view.ring) == 1:
                raise InvalidInput(f"{shard} is the cluster's only shard: add another first, or stop the cluster")
            self._body["removing"] = [shard]
            await self._set_view(dataclasses.replace(view, version=view.version + 1,
                                                     target=tuple(s for s in view.ring if s != shard)))
        await self._transition(wait)

    def _no_transition(self) -> None:
        if self.view.target is not None:
            raise InvalidInput("a shard is being added or removed already: wait for it (`tiered-recall cluster "
                               "status` shows its progress)")

    async def _transition(self, wait: bool) -> None:
        self._start_mover()
        if wait:
            await self.wait_transition()

    def _start_mover(self) -> None:
        if self._mover is None or self._mover.done():
            from .mover import run_transition

            self._mover = asyncio.get_running_loop().create_task(run_transition(self))

    async def wait_transition(self) -> None:
        """Returns once no shard is being added or removed."""
        await self._ready()
        while self._mover is not None and not self._mover.done():
            await asyncio.sleep(0.1)

    async def close_transition(self) -> None:
        """The move is over: the target ring becomes the ring; shards being removed are stopped."""
        async with self._lock:
            view = self.view
            await self._set_view(View(view.version + 1, view.target or view.ring))
            removing = list(self._body.get("removing") or [])
        for shard in removing:
            handle = self._handle(shard)
            if handle is not None:
                await self._stop(shard, handle)
        async with self._lock:
            for shard in removing:
                self._body["shards"].pop(shard, None)
            self._body["removing"] = []
            await self._persist()

    def note_error(self, exc: BaseException) -> None:
        """Keeps a failure of the mover for status(), credentials taken out."""
        self.last_error = redact(f"{type(exc).__name__}: {exc}", self.secrets)

    async def status(self) -> dict:
        """The cluster's settings, view and manifest version, each shard's state, and any move in progress."""
        await self._ready()
        view = self.view

        async def one(shard: str) -> dict:
            try:
                return await asyncio.wait_for(self._handle(shard).info.remote(), 5)
            except Exception as exc:
                return {"shard": shard, "ready": False, "error": f"unreachable: {type(exc).__name__}"}

        infos = await asyncio.gather(*(one(s) for s in sorted(self._body["shards"])))
        return {"cluster": self.cluster, "config": self._body["config"], "view": view.to_json(),
                "manifest_version": self._version, "shards": infos,
                "transition": None if view.target is None else {
                    "target": list(view.target), "moved": self.moved, "placed": len(view.placed),
                    "moving": len(view.moving), "last_error": self.last_error}}

    async def _stop(self, shard: str, handle) -> None:
        import ray

        try:
            await asyncio.wait_for(handle.close.remote(), 120)
        except Exception:  # its log stays in its folder; the next start replays it
            pass
        ray.kill(handle, no_restart=True)
        self._handles.pop(shard, None)

    async def shutdown(self) -> None:
        """Flushes and stops every shard (their data stays in storage; `cluster up` starts them again)."""
        await self._ready()
        self.stopping = True
        if self._mover is not None:
            self._mover.cancel()
        await asyncio.gather(*(self._stop(s, h) for s in list(self._body["shards"])
                               if (h := self._handle(s)) is not None))

    def ping(self) -> bool:
        """True: the directory answers."""
        return True

