"""Which shard of ``/metrics?shard=i&shards=n`` carries a node's per-GPU series.

A node belongs to shard ``crc32(name) % shards``: a hash of its name alone, so it is the same in
every server process, replica and restart (Python's ``hash()`` is salted per process), and a
node's shard never moves when other nodes join or leave. Every node is in exactly one shard of
``shards``; the shards are about equal in size for any fleet of more than a few hundred nodes.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from fleetwatch.errors import InvalidInput

__all__ = ["MAX_SHARDS", "Shard", "node_hash", "shard_from_query"]

MAX_SHARDS = 1024


def node_hash(name: str) -> int:
    """The stable hash a node's shard is taken from (CRC-32 of its UTF-8 name)."""
    return zlib.crc32(name.encode("utf-8"))


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count``; the caller has checked ``0 <= index < count <= MAX_SHARDS``."""

    index: int
    count: int

    def holds(self, name: str) -> bool:
        return node_hash(name) % self.count == self.index

    def holds_hash(self, hashed: int) -> bool:
        """:meth:`holds` for a node whose :func:`node_hash` is already known."""
        return hashed % self.count == self.index


def shard_from_query(shard: int | None, shards: int | None) -> Shard | None:
    """The shard ``?shard=&shards=`` asks for; ``None`` for the default page (neither given).
    The ranges of each are checked by the route; this checks them together."""
    if shard is None and shards is None:
        return None
    if shards is None:
        raise _invalid("shards", f"required with shard; 1 to {MAX_SHARDS}")
    if shard is None:
        raise _invalid("shard", f"required with shards; 0 to {shards - 1}")
    if not 0 <= shard < shards:
        raise _invalid("shard", f"must be at least 0 and less than shards ({shards})")
    return Shard(shard, shards)


def _invalid(field: str, message: str) -> InvalidInput:
    return InvalidInput(
        f"invalid request: query.{field}: {message}", [{"loc": ["query", field], "msg": message}]
    )
