"""A client's connection to one cluster: Ray, the directory's layout (view, shards, settings) kept up to date, one call
to a shard (or to the shard's co-located store, with no Ray hop), and the two ways a request is carried out: to the
shard that serves one namespace (following redirects and retrying while it moves or restarts), or to every shard at
one view version (retrying until they agree)."""
from __future__ import annotations

import logging
import pickle
import threading
import time
from pathlib import Path
from typing import Any

from ..errors import ClusterUnavailable, ShardUnavailable
from . import launch, replies
from .colocated import CoLocatedShard
from .config import ClusterConfig, config_from_public
from .ownership import View
from .redaction import redact, redact_package_logs
from .replies import Reply
from .shard import RAY_NAMESPACE, actor_name
from .shard_folder import SEQUENCE

logger = logging.getLogger("tiered_recall")
_REFRESH_MIN_S = 0.02
_REDIRECTS_MAX = 8


class ClusterSession:
    """What a ClusterMemory knows of its cluster, and how it calls the shards."""

    def __init__(self, address: str | None, name: str, *, wait_s: float, timeout_s: float, colocated: bool) -> None:
        self.address = launch.connect(address)
        self.name = name
        self.wait_s, self.timeout_s = wait_s, timeout_s
        self._ray = launch.require_ray()
        self._directory = launch.directory(name, address)
        self._lock = threading.RLock()
        self._handles: dict[str, Any] = {}
        self._hints: dict[str, str] = {}
        self._vouched: dict[str, tuple[str, ...]] = {}
        self._colocated: dict[str, CoLocatedShard] = {}
        self._refreshed_at = 0.0
        self._filter = None
        self._colocated_wanted = False
        self.view: View = View(0, ())
        self.config: ClusterConfig | None = None
        self.layout: dict = {}
        self.refresh(force=True)
        self._filter = redact_package_logs(self.config.secrets())
        self.node = self._ray.get_runtime_context().get_node_id()
        self._colocated_wanted = colocated
        if colocated:
            self._open_colocated()

    # ---- the layout ----------------------------------------------------------------------------
    def refresh(self, force: bool = False) -> None:
        """Reads the directory's layout again (at most every few milliseconds unless forced)."""
        with self._lock:
            if not force and time.monotonic() - self._refreshed_at < _REFRESH_MIN_S:
                return
            layout = launch.wait(self._directory.layout.remote(), self.timeout_s,
                                 self.config.secrets() if self.config else ())
            view = View.from_json(layout["view"])
            if self.config is None:
                self.config = config_from_public(layout["config"], layout["storage_options"])
            if view.version != self.view.version:
                self._hints.clear()
            self.view, self.layout = view, layout
            self._refreshed_at = time.monotonic()
            if force and self._colocated_wanted:
                self._reconcile_colocated()

    def refresh_or_reason(self, force: bool = False) -> str | None:
        """refresh() inside a retry loop: a directory that is restarting is one more reason to wait (None when the
        layout was read)."""
        try:
            self.refresh(force)
        except ClusterUnavailable as exc:
            return str(exc)
        return None

    def _open_colocated(self) -> None:
        """Opens, in this process, the store of every shard that runs on this node (where its folder is)."""
        for shard, entry in sorted(self.layout["shards"].items()):
            if shard in self._colocated or entry.get("node") != self.node or not entry.get("folder"):
                continue
            if not (Path(entry["folder"]) / SEQUENCE).exists():  # not opened yet by the shard
                continue
            try:
                self._colocated[shard] = CoLocatedShard(shard, entry["folder"], self.config)
            except Exception as exc:  # served through Ray instead
                logger.info("tiered-recall: %s runs on this node but its store could not be opened here (%s): its "
                            "requests go through Ray", shard, redact(str(exc), self.config.secrets()))

    def _reconcile_colocated(self) -> None:
        """After a failure: lets go of a co-located store whose shard is gone from it (restarted elsewhere, or in a
        new folder) and opens those of shards that now run on this node."""
        for shard, local in list(self._colocated.items()):
            entry = self.layout["shards"].get(shard) or {}
            if entry.get("node") != self.node or entry.get("folder") != str(local.folder) or local.lost():
                del self._colocated[shard]
                try:
                    local.close()
                except Exception as exc:  # its files may be gone already
                    logger.info("tiered-recall: closing the co-located store of %s: %s", shard, exc)
        self._open_colocated()

    def colocated(self, shard: str) -> CoLocatedShard | None:
        """This process's store of a shard on this node, or None."""
        return self._colocated.get(shard)

    def colocated_figures(self) -> dict[str, dict[str, int]]:
        """Reads each co-located shard served in this process, and those it left to Ray."""
        return {s: {"served": c.served, "declined": c.declined} for s, c in self._colocated.items()}

    # ---- one call -----------------------------------------------------------------------------
    def handle(self, shard: str):
        """The shard's Ray actor handle (None while it does not exist)."""
        handle = self._handles.get(shard)
        if handle is None:
            try:
                handle = self._ray.get_actor(actor_name(self.name, shard), namespace=RAY_NAMESPACE)
            except ValueError:
                return None
            self._handles[shard] = handle
        return handle

    def submit(self, shard: str, method: str, *args: Any):
        """Sends a call to a shard's actor: its ObjectRef, or a Reply when it cannot be sent. The arguments and the
        reply travel as plain pickles (Shard.call)."""
        handle = self.handle(shard)
        if handle is None:
            return Reply(replies.RETRY, value=f"{shard} is not running", retry_s=0.2)
        return handle.call.remote(method, pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL))

    def collect(self, shard: str, sent) -> Reply:
        """The Reply of a call sent by submit(); Ray's failures (a shard restarting, gone, slow) as RETRY."""
        if isinstance(sent, Reply):
            return sent
        exceptions = self._ray.exceptions
        try:
            return pickle.loads(self._ray.get(sent, timeout=self.timeout_s))
        except (exceptions.ActorUnavailableError, exceptions.RayActorError) as exc:
            self._handles.pop(shard, None)
            return Reply(replies.RETRY, value=f"{shard} is restarting ({type(exc).__name__})", retry_s=0.2)
        except exceptions.GetTimeoutError:
            return Reply(replies.RETRY, value=f"{shard} did not answer within {self.timeout_s:.0f} s", retry_s=0.0)

    def call(self, shard: str, method: str, *args: Any, local: bool = True) -> Reply:
        """One call to a shard: in this process when it is co-located and the call is a read, else through Ray."""
        colocated = self._colocated.get(shard) if local else None
        if colocated is not None and method in _LOCAL_READS:
            reply = colocated.answer(method, *args)
            if reply is not None:
                return reply
        return self.collect(shard, self.submit(shard, method, *args))

    def search_here(self, namespace: str, query: Any, k: int, options: dict) -> Any:
        """A one-namespace search answered in this process when its shard runs on this node and no move is under
        way (its hits named by their shard), else None."""
        view = self.view
        if view.target is not None:
            return None
        shard = self._hints.get(namespace) or view.route(namespace)
        colocated = self._colocated.get(shard)
        if colocated is None:
            return None
        reply = colocated.answer("search_one", namespace, query, k, options, False)
        if reply is None:
            return None
        found = reply.value
        for hit in (found.hits if hasattr(found, "hits") else found):
            hit.__dict__["shard"] = shard
        return found

    # ---- carrying out a request ------------------------------------------------------------------
    def one(self, namespace: str, method: str, args: tuple, *, local: bool = True) -> tuple[Any, str]:
        """(value, shard) of a request for one namespace (args: the method's, but for `vouched`, added last): sent
        where the view routes it, following redirects, and again while the namespace moves or its shard restarts,
        for up to wait_s; then ShardUnavailable."""
        shard = self._hints.get(namespace) or self.view.route(namespace)
        colocated = self._colocated.get(shard) if local and self.view.target is None else None
        if colocated is not None:  # the usual case on a shard's node: no Ray hop, nothing else to decide
            reply = colocated.answer(method, *args, False)
            if reply is not None:
                return reply.value, shard
        deadline = time.monotonic() + self.wait_s
        redirects, reason = 0, "no answer"
        while True:
            vouched = self._vouched.get(namespace) == self.view.target and self.view.target is not None
            reply = self.call(shard, method, *args, vouched, local=local)
            if reply.kind == replies.OK:
                return reply.value, shard
            if reply.kind == replies.ERROR:
                replies.raise_error(reply, shard)
            if reply.kind == replies.REDIRECT:
                redirects += 1
                if reply.vouched:
                    self._vouched[namespace] = self.view.target
                reason = f"redirected to {reply.to}"
                if reply.version > self.view.version or redirects > _REDIRECTS_MAX:
                    reason = self.refresh_or_reason() or reason
                    redirects = 0
                shard = reply.to
                self._hints[namespace] = shard
            else:
                reason = str(reply.value or reply.kind)
                self._pause(deadline, reply.retry_s, namespace, reason)
                reason = self.refresh_or_reason() or reason
                shard = self._hints.get(namespace) or self.view.route(namespace)
            if time.monotonic() > deadline:
                self._give_up(namespace, reason)

    def many(self, method: str, args: tuple, *, local: bool = True) -> dict[str, Any]:
        """{shard: value} of a request every shard answers at one view version (what makes the union of their
        answers exact while namespaces move); retried until they agree, for up to wait_s."""
        deadline = time.monotonic() + self.wait_s
        while True:
            view = self.view
            here = {s: self._colocated[s].answer(method, view.version, *args) for s in view.shards
                    if local and s in self._colocated and method in _LOCAL_READS}
            sent = {s: self.submit(s, method, view.version, *args) for s in view.shards if here.get(s) is None}
            got = {s: r for s, r in here.items() if r is not None}
            got.update({s: self.collect(s, ref) for s, ref in sent.items()})
            if all(r.kind == replies.OK and r.version == view.version for r in got.values()):
                return {s: r.value for s, r in got.items()}
            for shard, reply in got.items():
                if reply.kind == replies.ERROR:
                    replies.raise_error(reply, shard)
            waiting = sorted(s for s, r in got.items() if r.kind != replies.OK or r.version != view.version)
            reason = "; ".join(f"{s}: {got[s].value or got[s].kind}" for s in waiting)
            retry_s = max([got[s].retry_s for s in waiting] + [0.01])
            self._pause(deadline, retry_s, None, reason)
            self.refresh_or_reason(force=True)  # a directory restarting: the shards' versions say why, next time

    def _pause(self, deadline: float, seconds: float, namespace: str | None, reason: str) -> None:
        if time.monotonic() + seconds > deadline:
            self._give_up(namespace, reason)
        time.sleep(seconds)

    def _give_up(self, namespace: str | None, reason: str) -> None:
        what = f"namespace {namespace!r}" if namespace is not None else "a request over every shard"
        raise ShardUnavailable(f"{what} could not be served within {self.wait_s:.0f} s ({reason}): its shard is "
                               "restarting or its namespaces are moving; nothing partial was returned, call again",
                               retry_after_s=1.0)

    def close(self) -> None:
        """Closes the co-located stores this process opened."""
        for local in self._colocated.values():
            try:
                local.close()
            except Exception as exc:
                logger.warning("tiered-recall: closing the co-located store of %s failed: %s", local.shard, exc)
        self._colocated.clear()
        if self._filter is not None:
            logging.getLogger("tiered_recall").removeFilter(self._filter)


# The shard methods a co-located store answers in this process (reads); writes always go through the shard's actor.
_LOCAL_READS = frozenset({"search_one", "search_many", "get_many", "vectors_many", "counts_many", "count_one",
                          "memories_page"})
