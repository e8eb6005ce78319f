"""The `tiered-recall cluster` commands: up, status, down, add-shard, remove-shard, http (docs/cluster.md)."""
from __future__ import annotations

import enum
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table
from rich.text import Text

from ..errors import InvalidInput, TieredRecallError
from .output import console, fail, note, print_json, say

cluster_app = typer.Typer(
    name="cluster",
    help="Past one machine: shards of a store on a Ray cluster, their cold tiers in object storage, memories sharded "
         "by namespace (docs/cluster.md).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# How the cluster's messages name its settings on this command line.
FLAGS = {"name": "--name", "storage": "--storage", "storage_options": "--storage-option", "durability": "--durability",
         "flush_s": "--flush-s", "dim": "--dim", "embedder": "--embedder", "device": "--device",
         "hot_capacity": "--hot-capacity", "shards": "--shards", "shards_per_cpu_node": "--shards-per-cpu-node",
         "cpus_per_shard": "--cpus-per-shard", "local_root": "--local-root"}


class Durability(str, enum.Enum):
    """--durability: when an add is acknowledged."""

    object = "object"
    local = "local"


class Device(str, enum.Enum):
    """--device: each shard's hot tier."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"
    none = "none"


class Kind(str, enum.Enum):
    """--kind: what a new shard runs on."""

    cpu = "cpu"
    gpu = "gpu"


ADDRESS = typer.Option(None, "--address", metavar="HOST:PORT",
                       help="The Ray cluster (its head's GCS address); default: the one this machine runs.")
NAME = typer.Option("default", "--name", metavar="NAME", help="The cluster's name (several may share one Ray).")
JSON = typer.Option(False, "--json", help="Print JSON instead of a table.")


def _storage_options(pairs: List[str]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidInput(f"--storage-option takes KEY=VALUE (e.g. aws_endpoint=http://127.0.0.1:9000), got "
                               f"{pair.split('=')[0]!r}")
        options[key.strip()] = value
    return options


def _connect(address: Optional[str]):
    from ..cluster.launch import connect

    return connect(address)


def _print_status(status: dict, as_json: bool) -> None:
    if as_json:
        print_json(status)
        return
    config, view = status["config"], status["view"]
    say(f"cluster {status['cluster']}: storage {config['storage']}, durability {config['durability']}"
        f"{' (flush every %gs)' % config['flush_s'] if config['durability'] == 'local' else ''}, "
        f"view {view['version']}, ring {', '.join(view['ring'])}")
    table = Table(show_lines=False)
    for column in ("shard", "ready", "node", "incarnation", "error"):
        table.add_column(column)
    for shard in status["shards"]:
        table.add_row(shard["shard"], "yes" if shard.get("ready") else "no", (shard.get("node") or "")[:12],
                      str(shard.get("epoch") or ""), Text(shard.get("error") or ""))
    console.print(table)
    if status.get("transition"):
        move = status["transition"]
        say(f"moving to {', '.join(move['target'])}: {move['moved']} namespaces moved"
            f"{'; last error: ' + move['last_error'] if move.get('last_error') else ''}")


@cluster_app.command("up")
def up_command(
    address: Optional[str] = ADDRESS, name: str = NAME,
    storage: Optional[str] = typer.Option(None, "--storage", metavar="URI",
                                          help="s3://bucket/prefix (gs://, az://), or a folder every node can reach; "
                                               "default: a folder in the user data folder (one machine)."),
    storage_option: List[str] = typer.Option([], "--storage-option", metavar="KEY=VALUE",
                                             help="LanceDB's storage options, e.g. aws_endpoint=..., aws_region=..., "
                                                  "allow_http=true (repeat it); credentials are never printed, and "
                                                  "are better left to the AWS_* environment of every node."),
    durability: Durability = typer.Option(Durability.object, "--durability",
                                          help="object: an add returns once committed to object storage; local: "
                                               "once in the shard's node-local log, flushed every --flush-s."),
    flush_s: float = typer.Option(1.0, "--flush-s", metavar="SECONDS",
                                  help="With --durability local: seconds between flushes (a lost node loses up to "
                                       "this much of acknowledged writes)."),
    shards: Optional[int] = typer.Option(None, "--shards", metavar="N",
                                         help="Shards in all (default: one per GPU, --shards-per-cpu-node on every "
                                              "node without one)."),
    shards_per_cpu_node: int = typer.Option(1, "--shards-per-cpu-node", metavar="N"),
    cpus_per_shard: float = typer.Option(1.0, "--cpus-per-shard", metavar="N",
                                         help="CPUs Ray reserves for each shard."),
    dim: Optional[int] = typer.Option(None, "--dim", metavar="D", help="Vector width (raw vectors, no embedder)."),
    embedder: Optional[str] = typer.Option(None, "--embedder", metavar="NAME",
                                           help="e5, wordllama, minilm: shards embed texts (default: raw vectors)."),
    device: Device = typer.Option(Device.auto, "--device", help="Each shard's hot tier."),
    hot_capacity: Optional[int] = typer.Option(None, "--hot-capacity", metavar="ROWS"),
    local_root: Optional[str] = typer.Option(None, "--local-root", metavar="FOLDER",
                                             help="Node-local folder for each shard's log, mirror and hot tier."),
    as_json: bool = JSON,
) -> None:
    """Start a cluster on the Ray cluster at --address, or on a Ray this command starts here without one; a cluster
    whose storage holds one already starts again with its shards and memories."""
    from ..cluster.config import make_config
    from ..cluster.launch import start_local_ray, up

    try:
        options = _storage_options(storage_option)
        if storage is None:
            import os

            import platformdirs

            storage = os.path.join(platformdirs.user_data_dir("tiered-recall"), "cluster-storage", name)
        config = make_config(storage, names=FLAGS, name=name, storage_options=options, durability=durability.value,
                             flush_s=flush_s, dim=dim, embedder=embedder, device=device.value,
                             hot_capacity=hot_capacity, shards_per_cpu_node=shards_per_cpu_node,
                             cpus_per_shard=cpus_per_shard, local_root=local_root)
        if shards is not None and shards < 1:
            raise InvalidInput(f"--shards must be at least 1, got {shards}")
        if address is None:
            address = start_local_ray()
            note(f"started a local Ray at {address} (`tiered-recall cluster down --stop-local-ray` stops it)")
        _connect(address)
        status = up(config, shards=shards)
    except TieredRecallError as error:
        fail(error)
    _print_status(status, as_json)
    if not as_json:
        say(f"clients: ClusterMemory({address!r}, name={name!r})")


@cluster_app.command("status")
def status_command(address: Optional[str] = ADDRESS, name: str = NAME, as_json: bool = JSON) -> None:
    """The cluster's shards (ready, node, incarnation, last error), its view and any move in progress."""
    from ..cluster.launch import local_ray_address, status

    try:
        _connect(address or local_ray_address())
        _print_status(status(name, address), as_json)
    except TieredRecallError as error:
        fail(error)


STOP_LOCAL_RAY = typer.Option(False, "--stop-local-ray", help="Also stop the local Ray `cluster up` started here.")


@cluster_app.command("down")
def down_command(address: Optional[str] = ADDRESS, name: str = NAME, stop_local_ray: bool = STOP_LOCAL_RAY) -> None:
    """Flush and stop every shard and the directory; the memories stay in storage (`cluster up` starts them
    again)."""
    from ..cluster import launch

    try:
        _connect(address or launch.local_ray_address())
        launch.down(name, address)
        launch.disconnect()
    except TieredRecallError as error:
        fail(error)
    say(f"cluster {name} stopped; its memories stay in its storage")
    if stop_local_ray and launch.stop_local_ray():
        say("stopped the local Ray")


@cluster_app.command("add-shard")
def add_shard_command(address: Optional[str] = ADDRESS, name: str = NAME,
                      kind: Kind = typer.Option(Kind.cpu, "--kind", help="cpu, or gpu (the shard takes one GPU)."),
                      wait: bool = typer.Option(True, "--wait/--no-wait",
                                                help="Wait until the namespaces it now owns have moved.")) -> None:
    """Add a shard; the namespaces it now owns (about 1/N) move to it through object storage."""
    from ..cluster.launch import add_shard, local_ray_address

    try:
        _connect(address or local_ray_address())
        shard = add_shard(name, address, kind=kind.value, wait_done=wait)
    except TieredRecallError as error:
        fail(error)
    say(f"added {shard}" + ("" if wait else " (its namespaces are moving: see `cluster status`)"))


@cluster_app.command("remove-shard")
def remove_shard_command(shard: str = typer.Argument(..., metavar="SHARD", help="e.g. shard-2 (see `cluster status`)."),
                         address: Optional[str] = ADDRESS, name: str = NAME,
                         wait: bool = typer.Option(True, "--wait/--no-wait")) -> None:
    """Move a shard's namespaces to the others, then stop it."""
    from ..cluster.launch import local_ray_address, remove_shard

    try:
        _connect(address or local_ray_address())
        remove_shard(name, shard, address, wait_done=wait)
    except TieredRecallError as error:
        fail(error)
    say(f"removed {shard}" if wait else f"removing {shard} (see `cluster status`)")


@cluster_app.command("http")
def http_command(
    address: Optional[str] = ADDRESS, name: str = NAME,
    port: int = typer.Option(8765, "--port", metavar="PORT", help="Port each node's server listens on."),
    host: str = typer.Option("127.0.0.1", "--host", metavar="HOST", help="Address each node's server listens on: the "
                             "node itself by default; any other (0.0.0.0) needs --token or --token-file."),
    token: Optional[str] = typer.Option(None, "--token", metavar="TOKEN", envvar="TIERED_RECALL_TOKEN",
                                        help="The bearer token every call must carry (or set TIERED_RECALL_TOKEN)."),
    token_file: Optional[Path] = typer.Option(None, "--token-file", metavar="FILE", help="Tokens, one a line: TOKEN, "
                                              "or TOKEN PREFIX for a token that reaches only the namespaces under "
                                              "PREFIX; mode 600."),
    scope: Optional[str] = typer.Option(None, "--scope", metavar="PREFIX",
                                        help="Limit --token to the namespaces under PREFIX."),
) -> None:
    """Serve the cluster over HTTP: the same API and memory browser as `tiered-recall http` (docs/http.md), from a
    server on every node of the Ray cluster, each reading the shards of its own node with no Ray hop."""
    try:
        from ..http.settings import HttpSettings
        from ..http.tokens import given_tokens
    except ImportError as error:
        if (error.name or "").split(".")[0] == "tiered_recall":
            raise
        fail(f"the HTTP server needs FastAPI and uvicorn ({error}): pip install \"tiered-recall[http]\"")
    from ..cluster.ingress import start_ingress
    from ..cluster.launch import local_ray_address

    try:
        tokens = given_tokens(host=host, token=token, token_file=token_file, scope=scope)
        if tokens is None:  # beyond loopback with no token: a cluster has no one folder to keep a made one in
            raise InvalidInput(f"--host {host} lets other machines in: give --token or --token-file")
        settings = HttpSettings(host=host, port=port, tokens=tokens)
        _connect(address or local_ray_address())
        servers = start_ingress(name, "tiered_recall.http:create_app", host=host, port=port,
                                options={"settings": settings, "metrics": None})
    except TieredRecallError as error:
        fail(error)
    say(f"cluster {name}: an HTTP server on each of {len(servers)} node(s), at http://{host}:{port}/ of each; they "
        "keep serving after this command returns (Ray restarts them; `cluster down` stops the cluster)")
