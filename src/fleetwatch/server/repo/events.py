"""Reading events (Xid and others), as records the API's ``EventPublic`` validates."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, insert, select

from fleetwatch.server.db.tables import events, nodes

__all__ = ["event_from_row", "list_events", "record_fleet_event"]


def event_from_row(row: Row[Any]) -> dict[str, Any]:
    return {
        "id": row.id,
        "node": row.node_name,
        "kind": row.kind,
        "ts": row.ts,
        "received_at": row.received_at,
        "gpu_uuid": row.gpu_uuid,
        "pci_bus_id": row.pci_bus_id,
        "xid": row.xid,
        "message": row.message,
        "pid": row.pid,
        "process": row.process,
        "details": row.details,
    }


def list_events(
    conn: Connection,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    node: str | None = None,
    kind: str | None = None,
    xid: int | None = None,
    gpu_uuid: str | None = None,
    limit: int = 1000,
) -> list[dict[str, Any]]:
    """Newest first."""
    # Outer join: fleet-wide events (a model's wear-out onset) have no node.
    query = select(events, nodes.c.name.label("node_name")).outerjoin(
        nodes, nodes.c.id == events.c.node_id
    )
    if since is not None:
        query = query.where(events.c.ts >= since)
    if until is not None:
        query = query.where(events.c.ts < until)
    if node is not None:
        query = query.where(nodes.c.name == node)
    if kind is not None:
        query = query.where(events.c.kind == kind)
    if xid is not None:
        query = query.where(events.c.xid == xid)
    if gpu_uuid is not None:
        query = query.where(events.c.gpu_uuid == gpu_uuid)
    query = query.order_by(events.c.ts.desc(), events.c.id.desc()).limit(limit)
    return [event_from_row(row) for row in conn.execute(query)]


def record_fleet_event(
    conn: Connection, *, kind: str, now: datetime, message: str, details: dict[str, Any]
) -> None:
    """Store an event about the whole fleet (no node): a drain budget spent, a wear-out onset."""
    conn.execute(
        insert(events).values(
            node_id=None, kind=kind, ts=now, received_at=now, message=message, details=details
        )
    )
