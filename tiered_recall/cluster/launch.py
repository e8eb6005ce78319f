"""Reaching a cluster from a driver process: connecting to Ray (with errors that name the fix), finding a cluster's
directory by name, starting a cluster (`cluster up`), stopping it (`cluster down`), and a local Ray of this machine's
own for `cluster up` without an address."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..errors import ClusterUnavailable, InvalidInput
from .config import ClusterConfig
from .manifest import ManifestStore
from .placement import alive_nodes, initial_layout
from .shard import RAY_NAMESPACE, actor_name

# Settings a cluster keeps for life: its manifest's say over what `cluster up` is given.
FIXED_SETTINGS = ("dim", "embedder", "durability")
DIRECTORY_CALL_TIMEOUT_S = 600.0
HEAD_NODE_RESOURCE = "node:__internal_head__"  # the resource Ray gives its head node alone


def require_ray():
    """The ray module, or ClusterUnavailable saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ClusterUnavailable("Ray is not installed: pip install 'tiered-recall[cluster]' (Ray runs the "
                                 "cluster's shards)") from None
    return ray


_we_connected = False


def connect(address: str | None) -> str:
    """Connects this process to the Ray cluster at `address` ("host:port", "ray://host:port", or None for the one
    this machine runs); returns the address. A process already connected keeps its connection."""
    global _we_connected
    ray = require_ray()
    if ray.is_initialized():
        return address or "(this process's Ray)"
    if address and not _reachable(address):
        raise ClusterUnavailable(
            f"no Ray cluster answers at {address}: check the address (the head's GCS port, 6379 by default), or start "
            "one (`ray start --head`; `tiered-recall cluster up` without --address starts one on this machine)")
    try:
        ray.init(address=address or "auto", namespace=RAY_NAMESPACE, log_to_driver=False,
                 configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = f"at {address}" if address else "on this machine (no address given)"
        raise ClusterUnavailable(
            f"no Ray cluster {where}: start one (`ray start --head`, or `tiered-recall cluster up` without --address "
            f"starts one here), or pass its address ({type(exc).__name__})") from None
    _we_connected = True
    return address or "auto"


def _reachable(address: str, timeout_s: float = 5.0) -> bool:
    """Whether something listens at the address's host and port (Ray itself waits minutes for a GCS that is not
    there)."""
    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return True  # not host:port: Ray reads it and says what is wrong
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def disconnect() -> None:
    """Leaves Ray if this module connected this process to it."""
    global _we_connected
    if _we_connected:
        require_ray().shutdown()
        _we_connected = False


def directory(cluster: str, address: str | None = None):
    """The directory actor of the cluster named `cluster`, or ClusterUnavailable naming the command that starts it."""
    ray = require_ray()
    try:
        return ray.get_actor(actor_name(cluster, "directory"), namespace=RAY_NAMESPACE)
    except ValueError:
        raise ClusterUnavailable(
            f"no tiered-recall cluster named {cluster!r} runs on the Ray cluster {address or ''}".rstrip() +
            f": start it with `tiered-recall cluster up --name {cluster} --storage ...`") from None


def wait(ref, timeout_s: float = DIRECTORY_CALL_TIMEOUT_S, secrets: tuple[str, ...] = ()) -> Any:
    """ray.get of a directory call; the package's error it raised comes back as itself (without Ray's wrapper), any
    other failure as ClusterUnavailable; credentials masked either way."""
    ray = require_ray()
    from .. import errors
    from .redaction import redact

    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, errors.TieredRecallError):
            message = redact(str(cause.args[0]) if cause.args else str(cause), secrets)
            for cls in type(cause).__mro__:
                if cls.__module__ == errors.__name__:
                    raise cls(message) from None
        raise ClusterUnavailable(redact(f"the cluster's directory failed: {exc}", secrets)) from None
    except ray.exceptions.GetTimeoutError:
        raise ClusterUnavailable(f"the cluster's directory did not answer within {timeout_s:.0f} s") from None
    except ray.exceptions.RayActorError as exc:
        raise ClusterUnavailable(f"the cluster's directory is unreachable ({type(exc).__name__}): it restarts by "
                                 "itself; try again shortly") from None


def check_storage(config: ClusterConfig) -> dict | None:
    """Opens the cluster's manifest from this process (a wrong key or an unreachable store fails here, with the
    fix, before any shard starts) and returns the manifest's recorded settings, or None for a new cluster."""
    found = ManifestStore(config).load()
    if found is None:
        return None
    recorded = found[1].get("config") or {}
    for key in FIXED_SETTINGS:
        if key in recorded and recorded[key] != getattr(config, key):
            raise InvalidInput(f"the cluster stored at {config.storage} was made with {key}={recorded[key]!r}, not "
                               f"{getattr(config, key)!r}: give the same, or other storage for a new cluster")
    return recorded


def up(config: ClusterConfig, *, shards: int | None = None) -> dict:
    """Starts the cluster (this process connected to Ray already): its directory, then its shards, placed one per
    GPU and shards_per_cpu_node per CPU node (or `shards` in all); an existing cluster at the same storage starts
    again with its own shards. Returns its status."""
    ray = require_ray()
    check_storage(config)
    from .directory import Directory

    name = actor_name(config.name, "directory")
    try:
        handle = ray.get_actor(name, namespace=RAY_NAMESPACE)
    except ValueError:
        handle = ray.remote(Directory).options(
            # restarted without end; a call it was running is not run again (adding a shard twice would add two)
            name=name, namespace=RAY_NAMESPACE, lifetime="detached", max_restarts=-1, max_task_retries=0,
            # on the head node, whose loss ends the Ray cluster anyway: a worker's loss never takes it away
            num_cpus=0, resources={HEAD_NODE_RESOURCE: 0.001}, get_if_exists=True).remote(config.name, config.public(), config.storage_options)
    layout = initial_layout(alive_nodes(), config, shards)
    if not layout:
        raise ClusterUnavailable("no Ray node has the CPUs a shard reserves (cpus_per_shard) or a GPU: add nodes, or "
                                 "lower cpus_per_shard")
    wait(handle.create.remote(layout), secrets=config.secrets())
    return wait(handle.status.remote(), secrets=config.secrets())


def down(cluster: str, address: str | None = None) -> None:
    """Flushes and stops every shard, then the directory; the data stays in storage (up starts it again)."""
    ray = require_ray()
    handle = directory(cluster, address)
    wait(handle.shutdown.remote())
    ray.kill(handle, no_restart=True)


# ---- a local Ray of this machine's own (`cluster up` without --address) -------------------------------------------
def _state_file() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("tiered-recall")) / "cluster" / "local-ray.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_ray_address() -> str | None:
    """The address of the local Ray `cluster up` started, while it runs."""
    try:
        state = json.loads(_state_file().read_text())
        os.kill(int(state["pid"]), 0)
    except (OSError, ValueError, KeyError):
        return None
    return state["address"]


def start_local_ray(num_cpus: int | None = None, object_store_bytes: int | None = None,
                    timeout_s: float = 120.0) -> str:
    """Starts a Ray head on this machine in the background (`ray start --head --block`, in its own session, so it
    outlives this command) and returns its address; one started earlier is reused."""
    running = local_ray_address()
    if running:
        return running
    require_ray()
    port = _free_port()
    # Ray's sockets live under its temp dir, whose path must stay short: a folder of this user's own under /tmp.
    temp_dir = Path(tempfile.gettempdir()) / f"tiered-recall-ray-{os.getuid()}"
    temp_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    _state_file().parent.mkdir(parents=True, exist_ok=True)
    command = [os.path.join(os.path.dirname(sys.executable), "ray"), "start", "--head", f"--port={port}",
               "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}", "--block"]
    if num_cpus is not None:
        command.append(f"--num-cpus={num_cpus}")
    if object_store_bytes is not None:
        command.append(f"--object-store-memory={object_store_bytes}")
    log_path = _state_file().parent / "ray-start.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ClusterUnavailable(f"`ray start` failed (exit {process.returncode}); see {log_path}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.2)
    else:
        process.terminate()
        raise ClusterUnavailable(f"the local Ray did not start within {timeout_s:.0f} s; see {log_path}")
    _state_file().write_text(json.dumps({"pid": process.pid, "address": address}))
    return address


def stop_local_ray(timeout_s: float = 60.0) -> bool:
    """Stops the local Ray `cluster up` started (its `ray start --block` process stops what it started); False when
    none runs."""
    try:
        state = json.loads(_state_file().read_text())
        pid = int(state["pid"])
    except (OSError, ValueError, KeyError):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        _state_file().unlink(missing_ok=True)
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    _state_file().unlink(missing_ok=True)
    return True


def status(cluster: str, address: str | None = None) -> dict:
    """The cluster's settings (no credential), view, shards (node, incarnation, ready, last error) and any move."""
    return wait(directory(cluster, address).status.remote())


def add_shard(cluster: str, address: str | None = None, *, kind: str = "cpu", node: str | None = None,
              wait_done: bool = True) -> str:
    """Adds a shard ("cpu", or "gpu": one GPU) and moves to it the namespaces it now owns; returns its name."""
    if kind not in ("cpu", "gpu"):
        raise InvalidInput(f"kind must be 'cpu' or 'gpu', got {kind!r}")
    return wait(directory(cluster, address).add_shard.remote(kind, node, wait_done))


def remove_shard(cluster: str, shard: str, address: str | None = None, *, wait_done: bool = True) -> None:
    """Moves a shard's namespaces to the others, then stops it."""
    wait(directory(cluster, address).remove_shard.remote(shard, wait_done))
