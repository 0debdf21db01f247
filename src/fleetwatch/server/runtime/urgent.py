"""The urgent lane: the nodes whose urgent events (a fatal Xid, a lost GPU, an urgent host or
port event) wait for a targeted pass, rather than for a pass over the whole fleet.

Ingest adds a node (here, or on any replica through the leader's NOTIFY: see
:mod:`fleetwatch.server.runtime.leader`); the ``urgent`` job takes the nodes waiting, judges their
GPUs alone, patches the newest snapshot, and on the leader plans and alerts at once (see
:mod:`fleetwatch.server.background`), without waiting for a whole-fleet pass in progress. More
than :data:`MAX_URGENT_NODES` waiting at once (an Xid storm) ask for the whole fleet's pass
instead, which costs less per node.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from fleetwatch.server.runtime.scheduler import Waker

__all__ = ["MAX_URGENT_NODES", "UrgentNodes"]

MAX_URGENT_NODES = 64


class UrgentNodes:
    """The nodes waiting for the urgent lane; :meth:`add` may be called from any thread."""

    def __init__(self, urgent: Waker, fleet: Waker, limit: int = MAX_URGENT_NODES) -> None:
        self.limit = limit
        self._urgent = urgent  # the urgent job's
        self._fleet = fleet  # the whole-fleet assessment's
        self._waiting: set[str] = set()
        self._lock = threading.Lock()

    def add(self, names: Iterable[str] | None) -> None:
        """Judge ``names`` at once; None (nodes unknown, or too many to name) judges the fleet."""
        with self._lock:
            if names is not None:
                self._waiting.update(names)
                if len(self._waiting) <= self.limit:
                    self._urgent.poke()
                    return
            self._waiting.clear()
        self._fleet.poke()

    def take(self) -> frozenset[str]:
        """The nodes waiting (none left waiting)."""
        with self._lock:
            taken = frozenset(self._waiting)
            self._waiting.clear()
        return taken
