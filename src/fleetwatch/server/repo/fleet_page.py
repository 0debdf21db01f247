"""What the fleet page reads: the nodes' clocks, the GPU count, recent fatal Xids, the evictions
waiting for a scheduler or a person, and the stragglers still slow. The page groups and words
them."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, func, select

from fleetwatch.server.db.tables import events, evictions, gpus, nodes, stragglers

__all__ = [
    "active_stragglers",
    "draining_nodes",
    "fatal_xid_events",
    "gpu_count",
    "node_clocks",
    "waiting_evictions",
]


def node_clocks(conn: Connection) -> list[Row[Any]]:
    """Every node's name, labels, last push, interval and push lag, by name."""
    query = select(
        nodes.c.name, nodes.c.labels, nodes.c.last_seen, nodes.c.interval_s, nodes.c.lag_s
    )
    return list(conn.execute(query.order_by(nodes.c.name)))


def gpu_count(conn: Connection) -> int:
    return int(conn.execute(select(func.count()).select_from(gpus)).scalar_one())


def fatal_xid_events(
    conn: Connection, xids: Collection[int], *, since: datetime, limit: int
) -> list[Row[Any]]:
    """The newest Xid events with one of ``xids`` since ``since``, with their node's name."""
    query = (
        select(
            events.c.ts,
            events.c.xid,
            events.c.gpu_uuid,
            events.c.pci_bus_id,
            events.c.message,
            nodes.c.name.label("node"),
        )
        .select_from(events.outerjoin(nodes, events.c.node_id == nodes.c.id))
        .where(events.c.kind == "xid", events.c.ts >= since, events.c.xid.in_(sorted(xids)))
        .order_by(events.c.ts.desc(), events.c.id.desc())
        .limit(limit)
    )
    return list(conn.execute(query))


def waiting_evictions(conn: Connection, *, limit: int) -> list[dict[str, Any]]:
    """The newest pending (waiting for a scheduler) and paged (waiting for a person) evictions."""
    query = (
        select(
            evictions.c.id,
            evictions.c.node,
            evictions.c.state,
            evictions.c.reason_kind,
            evictions.c.reason,
            evictions.c.dry_run,
            evictions.c.created_at,
        )
        .where(evictions.c.state.in_(("pending", "paged")))
        .order_by(evictions.c.created_at.desc(), evictions.c.id.desc())
        .limit(limit)
    )
    return [row._asdict() for row in conn.execute(query)]


def active_stragglers(conn: Connection, *, limit: int) -> list[dict[str, Any]]:
    """Stragglers not ended, slowest first."""
    query = (
        select(
            stragglers.c.job_id,
            stragglers.c.node,
            stragglers.c.kind,
            stragglers.c.ratio,
            stragglers.c.started_at,
        )
        .where(stragglers.c.ended_at.is_(None))
        .order_by(stragglers.c.ratio.desc(), stragglers.c.id)
        .limit(limit)
    )
    return [row._asdict() for row in conn.execute(query)]


def draining_nodes(conn: Connection) -> set[str]:
    """Nodes a scheduler is draining or has drained (an eviction acked or completed, not a
    dry run), until they return."""
    query = select(evictions.c.node).where(
        evictions.c.state.in_(("acked", "completed")), evictions.c.dry_run.is_(False)
    )
    return {row.node for row in conn.execute(query)}
