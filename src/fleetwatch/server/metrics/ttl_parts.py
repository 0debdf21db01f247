"""Parts of the default /metrics page read from the database, shared for ``ttl_s``.

The port summary, the straggler ratios and the eviction counts are each a query (the port
summary a scan of every port: 100,000 rows at 100,000 GPUs) that a scrape would otherwise repeat
while ingest competes for the same database and cores. Each part is computed at most once per
``ttl_s`` (``metrics_cache_ttl_s``, the staleness the node and event cache already allows) and
shared by every scrape meanwhile: concurrent scrapes (an HA pair of Prometheus, a dashboard's
probe) wait for one computation instead of making their own. A part is therefore at most
``ttl_s`` older than the database when served; with ``ttl_s = 0`` every scrape reads anew.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["TtlParts"]


class TtlParts:
    """Text parts by name, each recomputed when older than ``ttl_s`` (``clock``: monotonic s)."""

    def __init__(self, ttl_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._parts: dict[str, tuple[float, str]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def get(self, name: str, compute: Callable[[], str]) -> str:
        """The part ``name``: the stored text while fresh, else ``compute()`` (stored)."""
        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        # One lock per part: a slow part does not hold the others' scrapes.
        with lock:
            stored = self._parts.get(name)
            now = self._clock()
            if stored is not None and now - stored[0] < self._ttl_s:
                return stored[1]
            text = compute()
            self._parts[name] = (now, text)
            return text
