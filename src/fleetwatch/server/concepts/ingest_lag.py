"""How late the fleet's pushes reach the store, so that a server behind on ingest does not call
its nodes unreachable.

A node is unreachable after ``unreachable_after_intervals`` of its intervals without a stored
push (:mod:`fleetwatch.server.concepts.liveness`). When the server itself falls behind (more pushes
offered than it stores, pushes queued at the agents, the load balancer or its own event loop),
every push is stored late, and some later than the others: a node whose push waited 150 s after
one that waited 10 s looks silent for 200 s though it pushed on time. Measured in the fleet-scale
benchmark at 7,650 of 10,000 GPU rows/s stored (issue 12, runs 14 to 16): 75 to 248 healthy
nodes drained as unreachable in ten minutes, each cancelled when its late push arrived. The
fleet-wide silence guard (:mod:`fleetwatch.server.judge.silence`) did not hold them back: at any
moment only a few percent of the nodes were past their deadline.

Only the store can see this lag, by the readings' own timestamps: each stored push records how
long after its newest reading it was stored (``nodes.lag_s``, the store's clock minus the agent's:
:func:`~fleetwatch.server.ingest.batch_view.push_lag_s`).
The fleet's lag is the median over the nodes heard in the last :data:`WINDOW`: a few nodes with
wrong clocks or an agent replaying its spool after an outage move it little; a server behind on
the whole fleet moves it by as much as it is behind. Every unreachable deadline is moved out by
that lag (never by less than nothing, nor more than ``unreachable_lag_grace_max_s``), so a node
is unreachable once it is silent for its intervals *and* for as long as the fleet's pushes are
late. A node that really died is still called unreachable, later by the lag.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from datetime import datetime, timedelta

__all__ = ["MIN_NODES", "WINDOW", "fleet_lag_s"]

# The nodes whose lag counts: heard this recently. Longer than any push interval in use (60 s by
# default), shorter than the silence a real backlog would bring before it is noticed.
WINDOW = timedelta(minutes=10)
# Fewer nodes heard: no fleet lag. A few nodes do not load a server, and their median is one
# node's own lag (its clock, its spool, readings it took long before pushing them).
MIN_NODES = 10


def fleet_lag_s(
    clocks: Iterable[tuple[datetime, float | None]], now: datetime, *, max_s: float
) -> float:
    """The fleet's lag in seconds at ``now``, from each node's ``(last_seen, lag_s)``: the median
    over the nodes heard within :data:`WINDOW` that have one (0 when fewer than
    :data:`MIN_NODES`), at least 0 and at most ``max_s`` (``max_s`` 0: off, always 0)."""
    if max_s <= 0:
        return 0.0
    since = now - WINDOW
    lags = [lag for seen, lag in clocks if lag is not None and seen >= since]
    if len(lags) < MIN_NODES:
        return 0.0
    return min(max(statistics.median(lags), 0.0), max_s)
