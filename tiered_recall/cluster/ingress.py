"""The hook for a cluster's HTTP ingress: the package's HTTP app (any factory of an ASGI app over an object with
TieredMemory's methods, named "module:function") served over a ClusterMemory by an actor on each node, so that each
one reads the shards of its node with no Ray hop. No HTTP app of its own: it serves the one it is given."""
from __future__ import annotations

import importlib
import threading
from typing import Any

from ..errors import InvalidInput
from .shard import RAY_NAMESPACE, actor_name


def load_factory(path: str):
    """The callable that "module:function" names."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise InvalidInput(f"the app factory is named module:function (e.g. tiered_recall.http:create_app), got "
                           f"{path!r}")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise InvalidInput(f"cannot load the app factory {path}: {exc}") from None


class Ingress:
    """A Ray actor: `factory(ClusterMemory(...), **options)` served by uvicorn on `port` of its node."""

    def __init__(self, cluster: str, factory: str, host: str, port: int, options: dict | None = None) -> None:
        import uvicorn

        from .client import ClusterMemory

        self.memory = ClusterMemory(name=cluster)
        app = load_factory(factory)(self.memory, **(options or {}))
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="tiered-recall-ingress", daemon=True)
        self.thread.start()

    def ready(self) -> bool:
        """Whether the server accepts connections."""
        return bool(self.server.started)

    def close(self) -> None:
        """Stops the server and closes the client."""
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.memory.close()


def start_ingress(cluster: str, factory: str, *, port: int = 8000, host: str = "0.0.0.0",
                  nodes: list[str] | None = None, timeout_s: float = 120.0, options: dict | None = None) -> list[Any]:
    """One Ingress actor per node (`nodes`: Ray node ids; default every alive node), named
    `<cluster>:ingress-<node>`, restarted by Ray; returns their handles once each serves. options: keywords the
    factory takes beside the ClusterMemory (the HTTP app's settings: its host, port and bearer tokens)."""
    import time

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from .placement import alive_nodes

    load_factory(factory)  # a wrong name fails here, not in every actor
    handles = []
    for node in nodes or [n["node"] for n in alive_nodes()]:
        handles.append(ray.remote(Ingress).options(
            name=actor_name(cluster, f"ingress-{node[:12]}"), namespace=RAY_NAMESPACE, lifetime="detached",
            max_restarts=-1, num_cpus=0, get_if_exists=True,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
        ).remote(cluster, factory, host, port, options))
    deadline = time.monotonic() + timeout_s
    pending = list(handles)
    while pending and time.monotonic() < deadline:
        pending = [h for h in pending if not ray.get(h.ready.remote(), timeout=timeout_s)]
        if pending:
            time.sleep(0.2)
    if pending:
        raise InvalidInput(f"{len(pending)} ingress servers did not start within {timeout_s:.0f} s (port {port} taken?)")
    return handles
