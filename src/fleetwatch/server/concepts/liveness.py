"""Whether a node is up: it is unreachable once nothing arrived for N of its own intervals.

Silence counts only while the server was up to hear it. A server process that just started (after
a restart, an upgrade, an outage of its own) heard nothing while it was down, so a node's
unreachable clock starts at ``max(last_seen, heard_since)``, where ``heard_since`` is when this
process started. Each process knows its own start: a worker that has been up for long keeps
judging by ``last_seen`` alone while an API replica restarts, and a freshly started worker gives
every node its intervals before calling it unreachable. A node silent past its deadline by
``last_seen`` but not yet past it since ``heard_since`` is *unheard*: neither up nor unreachable,
so nothing is fired, resolved, evicted or cancelled for it until the grace ends.

Readers (``GET /v1/nodes``, the fleet page, ``/metrics``) judge by the same rule and the same
start as the jobs: one :class:`Liveness` per process, on ``app.state.liveness``. They show an
unheard node as ``unheard``, not as up and not as unreachable.

Maintenance windows (``server.concepts.planned``) bend the rule the same way for everyone: a node a
window covers reads ``maintenance``, and after the window its silence counts from the window's
end, as from a start (an ended window is a start too: ``unheard`` during the grace).

While the fleet's pushes are stored late (the server behind on ingest), every deadline moves out
by that lag, ``lag_s`` (:mod:`fleetwatch.server.concepts.ingest_lag`): a late push is not silence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from fleetwatch.server.concepts.planned import Planned

__all__ = ["Liveness", "NodeReading", "is_unheard", "node_state", "unreachable_deadline"]

NodeReading = Literal["up", "unheard", "unreachable", "maintenance"]


def _utcnow() -> datetime:
    return datetime.now(UTC)


def unreachable_deadline(
    last_seen: datetime,
    interval_s: float,
    factor: float,
    heard_since: datetime | None = None,
    lag_s: float = 0.0,
) -> datetime:
    start = last_seen if heard_since is None else max(last_seen, heard_since)
    return start + timedelta(seconds=interval_s * factor + lag_s)


def node_state(
    last_seen: datetime,
    interval_s: float,
    factor: float,
    now: datetime,
    heard_since: datetime | None = None,
    lag_s: float = 0.0,
) -> str:
    deadline = unreachable_deadline(last_seen, interval_s, factor, heard_since, lag_s)
    return "unreachable" if now > deadline else "up"


def is_unheard(
    last_seen: datetime,
    interval_s: float,
    factor: float,
    now: datetime,
    heard_since: datetime,
    lag_s: float = 0.0,
) -> bool:
    """Silent past its deadline by ``last_seen``, but the server has not listened that long."""
    silent = node_state(last_seen, interval_s, factor, now, lag_s=lag_s) == "unreachable"
    return silent and node_state(last_seen, interval_s, factor, now, heard_since, lag_s) == "up"


@dataclass(frozen=True)
class Liveness:
    """How this process reads a node's state: its ``factor``, its start and its clock."""

    factor: float
    heard_since: datetime | None = None
    clock: Callable[[], datetime] = field(default=_utcnow)
    lag_max_s: float = 0.0  # the most the fleet's ingest lag moves a deadline (0: not at all)

    def state(
        self,
        last_seen: datetime,
        interval_s: float,
        now: datetime,
        *,
        planned: Planned | None = None,
        node: str = "",
        lag_s: float = 0.0,
    ) -> NodeReading:
        """``node``'s state; with ``planned`` (the windows at ``now``), maintenance counts;
        ``lag_s``: the fleet's ingest lag at ``now``."""
        heard = self.heard_since
        if planned is not None:
            if planned.covers(node):
                return "maintenance"
            heard = planned.listen_from(node, heard)
        if node_state(last_seen, interval_s, self.factor, now, lag_s=lag_s) == "up":
            return "up"
        if node_state(last_seen, interval_s, self.factor, now, heard, lag_s) == "up":
            return "unheard"
        return "unreachable"
