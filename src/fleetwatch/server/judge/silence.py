"""Fleet-wide silence: when many nodes fall silent at once, the cause is shared, not each node's.

An overloaded server (pushes queued at the agents or the load balancer), a network partition or
a monitoring outage silences a large share of the fleet at once. Draining each node as
unreachable would then drain healthy nodes and fill the fleet drain budget, so that a real fault
(a fatal Xid) found meanwhile is paged instead of drained. So, when the nodes unreachable (silent
past their deadline, by :mod:`fleetwatch.server.concepts.liveness`) are more than
``unreachable_storm_pct`` of the nodes that count, and at least ``unreachable_storm_min_nodes``
(10), the silence is a *storm*:

- the planner makes no new unreachable eviction (rule evictions, e.g. a fatal Xid, go on);
- no new per-node unreachable alert fires; one ``fleet_silence`` alert does, and resolves when
  the share falls back to the threshold or under it;
- open unreachable evictions and firing unreachable alerts are left as they are: each was made
  on its node's own silence before the storm, and a person may already be acting on it. One
  whose node reports again is cancelled (resolved) as usual; one whose node is still silent
  stays until the storm ends and its node is judged on its own again.

The nodes that count: known, not in a maintenance window, heard within the last day (a node
silent for longer is decommissioned or long known, as for the planner). The share is read from
the database at the pass's ``now``, by the leader's planner and alerter alike: every process
that reads it gets the same answer for the same ``now`` and start. ``0`` turns the guard off.

The fleet's ingest lag (:mod:`fleetwatch.server.concepts.ingest_lag`) is read from the same rows,
once, and moves every node's deadline out alike: :class:`FleetSilence` carries it to the
planner's and the alerter's per-node questions, and names the nodes past their deadline that only
the lag holds back (``held_by_lag``): an unreachable eviction or alert already open for one of
them stays open (its node has not reported since), as in a storm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, NamedTuple

from sqlalchemy import Connection, select

from fleetwatch.server.concepts.ingest_lag import fleet_lag_s
from fleetwatch.server.concepts.liveness import node_state
from fleetwatch.server.concepts.planned import Planned
from fleetwatch.server.db.raw_rows import psycopg_rows
from fleetwatch.server.db.tables import nodes

if TYPE_CHECKING:
    from fleetwatch.config import ServerSettings

__all__ = [
    "FleetSilence",
    "NodeClock",
    "clocks_lag_s",
    "fleet_silence",
    "heard_since_of",
    "is_storm",
    "node_clocks",
]

RECENT = timedelta(days=1)  # silent longer: not news (the planner's ``within``)
# One silent node is that node's own silence, at any fleet size; a small fleet's few silent nodes
# (a rack's power) are drained and paged one by one rather than taken for the server's silence.
MIN_NODES = 2


class NodeClock(NamedTuple):
    """What a node's liveness is read from."""

    name: str
    last_seen: datetime
    interval_s: float
    lag_s: float | None = None  # how late its newest push was stored


def node_clocks(conn: Connection, since: datetime | None = None) -> list[NodeClock]:
    """Every node's clock, or those heard since ``since``. The planner and the alerts read them
    once a pass each (every 10 s); on PostgreSQL as plain tuples (``db/raw_rows.py``: 35 ms for
    12,500 nodes, against 108 ms through SQLAlchemy's rows)."""
    sql = "SELECT name, last_seen, interval_s, lag_s FROM nodes"
    if since is not None:
        sql += " WHERE last_seen >= %(since)s"
    rows = psycopg_rows(conn, sql, {"since": since})
    if rows is not None:
        return list(map(NodeClock._make, rows))
    query = select(nodes.c.name, nodes.c.last_seen, nodes.c.interval_s, nodes.c.lag_s)
    if since is not None:
        query = query.where(nodes.c.last_seen >= since)
    return [
        NodeClock(row.name, row.last_seen, row.interval_s, row.lag_s) for row in conn.execute(query)
    ]


def clocks_lag_s(clocks: Sequence[NodeClock], now: datetime, max_s: float) -> float:
    """The fleet's ingest lag at ``now`` by ``clocks`` (see ingest_lag.fleet_lag_s)."""
    return fleet_lag_s(((c.last_seen, c.lag_s) for c in clocks), now, max_s=max_s)


def heard_since_of(clocks: Sequence[NodeClock], since: datetime) -> list[NodeClock]:
    """The clocks of the nodes heard since ``since`` (as node_clocks with ``since`` reads)."""
    return [c for c in clocks if c.last_seen >= since]


@dataclass(frozen=True)
class FleetSilence:
    """The nodes unreachable now among those that count, and whether that is a storm."""

    silent: frozenset[str]
    counted: int
    threshold_pct: float
    min_nodes: int = MIN_NODES
    lag_s: float = 0.0  # the fleet's ingest lag: every deadline was moved out by it
    # Past their deadline, and not past it moved out by the lag: not unreachable now, not back.
    held_by_lag: frozenset[str] = frozenset()

    @property
    def share_pct(self) -> float:
        return 100.0 * len(self.silent) / self.counted if self.counted else 0.0

    @property
    def storm(self) -> bool:
        return is_storm(len(self.silent), self.counted, self.threshold_pct, self.min_nodes)


def is_storm(silent: int, counted: int, threshold_pct: float, min_nodes: int = MIN_NODES) -> bool:
    """More than ``threshold_pct`` of ``counted`` nodes silent, and at least ``min_nodes`` (never
    fewer than two; ``threshold_pct`` 0: never)."""
    if threshold_pct <= 0 or counted == 0 or silent < max(min_nodes, MIN_NODES):
        return False
    return 100.0 * silent / counted > threshold_pct


def fleet_silence(
    conn: Connection,
    settings: ServerSettings,
    *,
    now: datetime,
    heard_since: datetime | None = None,
    planned: Planned | None = None,
    clocks: Sequence[NodeClock] | None = None,
) -> FleetSilence:
    """The fleet's silence at ``now`` (unreachable as the planner and the alerter judge it),
    by ``settings``' ``unreachable_*`` policy (``unreachable_lag_grace_max_s``: the most the
    fleet's ingest lag moves a deadline; 0: not at all); ``clocks``: every node's, read by the
    caller this pass (else read here)."""
    factor = settings.unreachable_after_intervals
    threshold_pct = settings.unreachable_storm_pct
    min_nodes = settings.unreachable_storm_min_nodes
    lag_max_s = settings.unreachable_lag_grace_max_s
    planned = planned or Planned()
    if clocks is None:
        rows = node_clocks(conn, now - RECENT)
    else:
        rows = heard_since_of(clocks, now - RECENT)
    lag = clocks_lag_s(rows, now, lag_max_s)
    counted = 0
    silent = set()
    held = set()
    for row in rows:
        if planned.covers(row.name):
            continue
        counted += 1
        heard = planned.listen_from(row.name, heard_since)
        if node_state(row.last_seen, row.interval_s, factor, now, heard, lag) == "unreachable":
            silent.add(row.name)
        elif lag and node_state(row.last_seen, row.interval_s, factor, now, heard) != "up":
            held.add(row.name)
    return FleetSilence(frozenset(silent), counted, threshold_pct, min_nodes, lag, frozenset(held))
