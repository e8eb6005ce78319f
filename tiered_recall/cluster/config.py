"""A cluster's settings, checked once: its name, where the cold tiers live (object storage and LanceDB's options for
it), how a write is made durable, and what each shard's TieredMemory is; errors name the fix in the caller's spelling
(Python arguments, or the CLI's flags)."""
from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from ..errors import InvalidInput
from .redaction import StorageOptions

DURABILITIES = ("object", "local")
DEVICES = ("auto", "cpu", "cuda", "none")
OBJECT_SCHEMES = ("s3", "gs", "az")
DEFAULT_FLUSH_S = 1.0
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")

# How messages name the settings when Python passed them; the CLI passes its flags (cli/cluster_commands.py).
API_NAMES = {name: name for name in ("name", "storage", "storage_options", "durability", "flush_s", "dim",
                                     "embedder", "device", "hot_capacity", "shards", "shards_per_cpu_node",
                                     "cpus_per_shard", "local_root")}


def storage_scheme(storage: str) -> str:
    """"s3", "gs", "az" for object storage, "local" for a folder (a path, or file://)."""
    head, sep, _ = storage.partition("://")
    if not sep or head == "file":
        return "local"
    return head


def join_uri(storage: str, *parts: str) -> str:
    """storage/part/part (an object store URI or a folder)."""
    return "/".join([storage.rstrip("/"), *parts])


@dataclass(frozen=True)
class ClusterConfig:
    """What a cluster is. storage: "s3://bucket/prefix" (also gs://, az://), or a folder every node can reach (one
    machine, or a shared file system); storage_options: what LanceDB takes for it (aws_endpoint, aws_region,
    aws_access_key_id, aws_secret_access_key, allow_http, ...; credentials never printed). durability: "object"
    (an add returns once its rows are committed to object storage; concurrent adds share one commit) or "local"
    (once durable in the shard's node-local log; flushed to object storage every flush_s seconds, the window of
    acknowledged writes a lost node takes with it). dim / embedder / device / hot_capacity: each shard's
    TieredMemory (embedder None: raw vectors only). shards_per_cpu_node: shards on each node without a GPU (GPU
    nodes get one per GPU); cpus_per_shard: the CPUs Ray reserves for each. local_root: the node-local folder that
    holds each shard's log, mirror and hot-tier segment (None: the user data folder of the process)."""

    storage: str
    name: str = "default"
    storage_options: StorageOptions = field(default_factory=StorageOptions)
    durability: str = "object"
    flush_s: float = DEFAULT_FLUSH_S
    dim: int | None = None
    embedder: str | None = None
    device: str = "auto"
    hot_capacity: int | None = None
    shards_per_cpu_node: int = 1
    cpus_per_shard: float = 1.0
    local_root: str | None = None

    @property
    def scheme(self) -> str:
        """"s3", "gs", "az" or "local"."""
        return storage_scheme(self.storage)

    def shard_table_uri(self, shard: str) -> str:
        """Where a shard's LanceDB table lives."""
        return join_uri(self.storage, shard)

    @property
    def directory_uri(self) -> str:
        """Where the cluster's manifest (the directory's durable state) lives."""
        return join_uri(self.storage, "_cluster")

    @property
    def moves_uri(self) -> str:
        """Where namespaces on their way between shards are staged."""
        return join_uri(self.storage, "_moves")

    def public(self) -> dict[str, Any]:
        """The settings without credentials (the manifest, status): the storage options by name only."""
        out = asdict(self)
        out["storage_options"] = StorageOptions(self.storage_options).shown()
        return out

    def secrets(self) -> tuple[str, ...]:
        """The credential values of the storage options (what redaction takes out)."""
        return self.storage_options.secrets()


def _bad(names: Mapping[str, str], key: str, message: str) -> InvalidInput:
    return InvalidInput(f"{names.get(key, key)} {message}")


def make_config(storage: Any, *, names: Mapping[str, str] | None = None, **settings: Any) -> ClusterConfig:
    """A checked ClusterConfig; `names` maps each setting to how the caller spells it (API_NAMES, or CLI flags)."""
    names = {**API_NAMES, **(names or {})}
    if not isinstance(storage, (str, os.PathLike)) or not os.fspath(storage):
        raise _bad(names, "storage", "must be where the shards' tables live: s3://bucket/prefix (gs://, az://), or a "
                   "folder every node can reach")
    storage = os.fspath(storage)
    scheme = storage_scheme(storage)
    if scheme == "local":
        storage = os.path.abspath(storage.removeprefix("file://"))
    elif scheme not in OBJECT_SCHEMES:
        raise _bad(names, "storage", f"has the scheme {scheme}://, which LanceDB does not take here: use s3://, gs://, "
                   "az:// or a folder")
    elif not storage.partition("://")[2].strip("/"):
        raise _bad(names, "storage", f"names no bucket: give {scheme}://BUCKET/PREFIX")
    options = settings.pop("storage_options", None) or {}
    if not isinstance(options, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in options.items()):
        raise _bad(names, "storage_options", "must map option names to str values (aws_endpoint, aws_region, ...)")
    name = settings.pop("name", "default")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _bad(names, "name", "must be 1-63 letters, digits, '-' or '_', starting with a letter or digit")
    durability = settings.pop("durability", "object")
    if durability not in DURABILITIES:
        raise _bad(names, "durability", "must be 'object' (acknowledged once in object storage) or 'local' "
                   f"(once in the node-local log, flushed every flush_s), got {durability!r}")
    flush_s = settings.pop("flush_s", DEFAULT_FLUSH_S)
    if isinstance(flush_s, bool) or not isinstance(flush_s, (int, float)) or not math.isfinite(flush_s) \
            or not 0 < flush_s <= 3600:
        raise _bad(names, "flush_s", f"must be seconds in (0, 3600] between flushes to object storage, got {flush_s!r}")
    dim = settings.pop("dim", None)
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or dim < 1):
        raise _bad(names, "dim", f"must be a positive int (the vector width), got {dim!r}")
    embedder = settings.pop("embedder", None)
    if embedder is not None and not isinstance(embedder, str):
        raise _bad(names, "embedder", "must be an embedder's name (e5, wordllama, minilm) or None for raw vectors")
    if dim is None and embedder is None:
        raise _bad(names, "dim", "is needed when there is no embedder (the shards store raw vectors of that width)")
    device = settings.pop("device", "auto")
    if device not in DEVICES:
        raise _bad(names, "device", f"must be one of {', '.join(DEVICES)}, got {device!r}")
    hot_capacity = settings.pop("hot_capacity", None)
    if hot_capacity is not None and (isinstance(hot_capacity, bool) or not isinstance(hot_capacity, int)
                                     or hot_capacity < 1):
        raise _bad(names, "hot_capacity", f"must be a positive int (rows each shard's hot tier keeps), got "
                   f"{hot_capacity!r}")
    per_node = settings.pop("shards_per_cpu_node", 1)
    if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1:
        raise _bad(names, "shards_per_cpu_node", f"must be an int >= 1, got {per_node!r}")
    cpus = settings.pop("cpus_per_shard", 1.0)
    if isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or not math.isfinite(cpus) or cpus < 0:
        raise _bad(names, "cpus_per_shard", f"must be a number >= 0 (CPUs Ray reserves per shard), got {cpus!r}")
    local_root = settings.pop("local_root", None)
    if local_root is not None and (not isinstance(local_root, (str, os.PathLike)) or not os.fspath(local_root)):
        raise _bad(names, "local_root", "must be a folder path (node-local) or None")
    if settings:
        raise InvalidInput(f"unknown cluster settings: {', '.join(sorted(settings))}")
    return ClusterConfig(storage=storage, name=name, storage_options=StorageOptions(options), durability=durability,
                         flush_s=float(flush_s), dim=dim, embedder=embedder, device=device, hot_capacity=hot_capacity,
                         shards_per_cpu_node=per_node, cpus_per_shard=float(cpus),
                         local_root=None if local_root is None else os.path.abspath(os.fspath(local_root)))


def config_from_public(public: Mapping[str, Any], storage_options: StorageOptions) -> ClusterConfig:
    """The config a manifest recorded (public()), with the credentials given again."""
    fields = {k: v for k, v in public.items() if k != "storage_options"}
    return ClusterConfig(**{**fields, "storage_options": storage_options})
