"""Moves namespaces between shards while a shard is added or removed, batch by batch, through object storage: the
old owner stops taking writes to the batch and stages its rows, the new owner takes them in and commits them, the
view flips the batch to the new owner, the old owner drops its copy. Every step is one the directory can repeat after
a failure or its own restart; every search stays exact (ownership.py)."""
from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import TYPE_CHECKING

from .hashing import owner

if TYPE_CHECKING:
    from .directory import Directory

BATCH_NAMESPACES = 256
PAUSE_AFTER_FAILURE_S = 1.0


async def run_transition(directory: "Directory") -> None:
    """Moves every namespace whose owner changes, then closes the transition."""
    while not directory.stopping and directory.view.target is not None:
        try:
            await _step(directory)
            directory.last_error = None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a shard restarting, storage away: the same step again shortly
            directory.note_error(exc)
            await asyncio.sleep(PAUSE_AFTER_FAILURE_S)


async def _step(directory: "Directory") -> None:
    view = directory.view
    if view.moving:  # a batch a failure (or a restart) interrupted: from its start again
        await _move(directory, dict(view.moving))
        return
    candidates, stale = await survey(directory)
    for shard, names in stale.items():
        await directory.call(shard, "drop", names)
    if not candidates:
        await directory.close_transition()
        return
    (source, destination), names = min(candidates.items())
    batch = {ns: (source, destination) for ns in sorted(names)[:BATCH_NAMESPACES]}
    await directory.update_view(moving=batch)
    await _move(directory, batch)


async def survey(directory: "Directory") -> tuple[dict[tuple[str, str], list[str]], dict[str, list[str]]]:
    """({(old owner, new owner): namespaces still to move}, {shard: namespaces it holds but does not serve: a copy
    an interrupted move left behind})."""
    view = directory.view
    candidates: dict[tuple[str, str], list[str]] = defaultdict(list)
    stale: dict[str, list[str]] = defaultdict(list)
    for shard in view.shards:
        held = await directory.call(shard, "held")
        for namespace in held:
            if not view.serves_held(shard, namespace):
                stale[shard].append(namespace)
                continue
            new = owner(namespace, view.target)
            if new != shard:
                candidates[(shard, new)].append(namespace)
    return dict(candidates), dict(stale)


async def _move(directory: "Directory", batch: dict[str, tuple[str, str]]) -> None:
    source, destination = next(iter(batch.values()))
    names = sorted(batch)
    view = directory.view
    table = f"move-v{view.version}-{source}-{destination}"
    await directory.call(source, "export", names, table)
    await directory.call(destination, "import_rows", names, table)
    await directory.update_view(moving={}, placed={**view.placed, **batch})
    await directory.call(source, "drop", names)
    try:
        await directory.call(destination, "drop_staging", table)
    except Exception as exc:  # a staging table left behind takes space, nothing else
        directory.note_error(exc)
    directory.moved += len(names)
