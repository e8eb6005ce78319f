"""Rendezvous hashing of namespaces onto shards: each namespace goes to the shard with the highest weight for it, so
adding or removing a shard moves only the namespaces that shard wins or held (about 1/N of them)."""
from __future__ import annotations

import hashlib
from functools import lru_cache


def weight(namespace: str, shard: str) -> int:
    """The namespace's weight on a shard: 64 bits of BLAKE2b over both names (the same in every process)."""
    digest = hashlib.blake2b(shard.encode("utf-8") + b"\x00" + namespace.encode("utf-8", "surrogatepass"),
                             digest_size=8).digest()
    return int.from_bytes(digest, "little")


@lru_cache(maxsize=1 << 18)
def owner(namespace: str, shards: tuple[str, ...]) -> str:
    """The shard that owns a namespace (its stored name: a tuple namespace hashes as its stored string) among
    `shards` (ties, which 64-bit weights make unlikely, go to the smaller name)."""
    if not shards:
        raise ValueError("no shards to own a namespace")
    return max(shards, key=lambda shard: (weight(namespace, shard), _reverse(shard)))


def _reverse(shard: str) -> tuple[int, ...]:
    return tuple(-ord(c) for c in shard)


def moving(namespaces, before: tuple[str, ...], after: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """The namespaces whose owner differs between two sets of shards: {namespace: (old owner, new owner)}."""
    out = {}
    for namespace in namespaces:
        old, new = owner(namespace, before), owner(namespace, after)
        if old != new:
            out[namespace] = (old, new)
    return out
