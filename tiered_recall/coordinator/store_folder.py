"""The store's folder: where it is by default, whether this process may write it, and the config that keeps a
reopened store on the dim and embedder it was made with."""
from __future__ import annotations

import errno
import json
import logging
import os
import threading
from pathlib import Path

from ..embedders import spec_of_stored_name
from ..errors import InvalidInput
from ..spelling import option_set, option_to_fill

logger = logging.getLogger("tiered_recall")

CONFIG_FILE = "tiered_recall.json"
COLD_FOLDER = "cold"


def default_store_path() -> Path:
    """The user's own store (under the platform's data folder), so that a command run in any folder, a source
    checkout included, writes nowhere near it."""
    from platformdirs import user_data_path

    return user_data_path("tiered-recall") / "store"


def settle_read_only(path: Path, read_only: bool | None, option) -> bool:
    """True/False as asked; None: whether the folder can be written (made if missing), tried for real, so a
    read-only mount and a folder of another user both count. option(name) spells an option as the caller does."""
    if path.exists() and not path.is_dir():
        raise InvalidInput(f"{path} is a file, not a store folder: pass a folder "
                           f"({option_to_fill(option('path'), 'FOLDER')}; a new store is made in one that does not exist "
                           "yet)")
    if read_only:
        if not (path / CONFIG_FILE).exists():
            raise InvalidInput(f"no store at {path}: a read-only store must exist (open it writable once)")
        return True
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        # No folder, and none can be made here: read-only would not help, as there is no store to read.
        raise InvalidInput(f"cannot make the store folder {path} ({exc.strerror}): pass a folder you can write "
                           f"({option_to_fill(option('path'), 'FOLDER')})") from exc
    try:
        probe = path / f".write-probe-{os.getpid()}-{threading.get_ident()}"
        probe.touch()
        probe.unlink()
        return False
    except OSError as exc:
        has_store = (path / CONFIG_FILE).exists()
        if read_only is None and has_store and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            logger.info("tiered-recall: %s cannot be written (%s): opened read-only", path, exc.strerror)
            return True
        if not has_store:
            raise InvalidInput(f"cannot write the folder {path} ({exc.strerror}), and it holds no store to read: pass a "
                               f"folder you can write ({option_to_fill(option('path'), 'FOLDER')})") from exc
        raise InvalidInput(f"cannot write the store folder {path} ({exc.strerror}): to read the store without "
                           f"writing, open it with {option_set(option('read_only'), True)}") from exc


def stored_embedder_name(path: Path) -> str | None:
    """The name of the embedder a store was made with (None: a new store, or one made for raw vectors)."""
    config_path = path / CONFIG_FILE
    if not config_path.exists():
        return None
    return json.loads(config_path.read_text()).get("embedder")


def settle_config(path: Path, dim: int | None, embedder, *, read_only: bool) -> int:
    """Reads the store's config (refusing a dim or embedder that does not fit it), or writes it for a new store;
    returns the store's dim."""
    config_path = path / CONFIG_FILE
    name = embedder.name if embedder is not None else None
    if embedder is not None and dim is not None and dim != embedder.dim:
        raise InvalidInput(f"dim={dim} but the embedder {name!r} makes {embedder.dim}-d vectors: drop dim, or pick "
                           "an embedder of that width")
    if config_path.exists():
        config = json.loads(config_path.read_text())
        stored_dim = int(config["dim"])
        if dim is not None and dim != stored_dim:
            raise InvalidInput(f"the store at {path} holds {stored_dim}-d vectors, not {dim}-d: open it with "
                               f"dim={stored_dim} or use another path")
        stored = config.get("embedder")
        spec = spec_of_stored_name(stored) if stored else None
        fix = (f"open it with embedder={spec!r}, or leave embedder out (a store reopens with its own)" if spec else
               f"open it with the embedder it was made with ({stored!r})")
        if embedder is not None and embedder.dim != stored_dim:
            raise InvalidInput(f"the store at {path} holds {stored_dim}-d vectors but the embedder {name!r} makes "
                               f"{embedder.dim}-d ones: {fix}")
        if embedder is not None and stored and stored != name:
            raise InvalidInput(f"the store at {path} was embedded with {stored!r}, not {name!r}: its vectors would "
                               f"not be comparable; {fix}, or use another path")
        return stored_dim
    if read_only:
        raise InvalidInput(f"no store at {path}: a read-only store must exist (open it writable once)")
    if dim is None:
        if embedder is None:
            raise InvalidInput("a store without an embedder needs dim=...: TieredMemory(path, dim=384, embedder=None)")
        dim = embedder.dim
    tmp = config_path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"dim": int(dim), "embedder": name, "layout": 1}))
    os.replace(tmp, config_path)
    return int(dim)
