"""Reading nodes, with their liveness computed at read time, as records the API's ``NodePublic``
and ``NodeDetail`` validate."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, func, select

from fleetwatch.errors import NotFound
from fleetwatch.server.concepts.ingest_lag import WINDOW, fleet_lag_s
from fleetwatch.server.concepts.liveness import Liveness, is_unheard
from fleetwatch.server.concepts.planned import Planned
from fleetwatch.server.db.tables import gpus, nodes
from fleetwatch.server.repo.gpus import gpu_summary_query, summary_from_row
from fleetwatch.server.repo.maintenance import load_planned

__all__ = [
    "count_nodes",
    "get_node",
    "list_nodes",
    "node_id_of",
    "read_fleet_lag_s",
    "unheard_nodes",
]


def read_fleet_lag_s(conn: Connection, now: datetime, *, max_s: float) -> float:
    """:func:`fleet_lag_s` read from the database, for a reader that does not read every node."""
    if max_s <= 0:
        return 0.0
    rows = conn.execute(
        select(nodes.c.last_seen, nodes.c.lag_s).where(
            nodes.c.last_seen >= now - WINDOW, nodes.c.lag_s.is_not(None)
        )
    )
    return fleet_lag_s(((row.last_seen, row.lag_s) for row in rows), now, max_s=max_s)


def _gpu_counts() -> Any:
    return (
        select(gpus.c.node_id, func.count().label("gpu_count")).group_by(gpus.c.node_id).subquery()
    )


def _public(
    row: Row[Any], *, liveness: Liveness, now: datetime, planned: Planned, lag_s: float
) -> dict[str, Any]:
    window = planned.window(row.name)
    state = liveness.state(
        row.last_seen, row.interval_s, now, planned=planned, node=row.name, lag_s=lag_s
    )
    return {
        "name": row.name,
        "state": state,
        "last_seen": row.last_seen,
        "first_seen": row.first_seen,
        "labels": row.labels,
        "interval_s": row.interval_s,
        "agent_version": row.agent_version,
        "gpu_count": row.gpu_count or 0,
        "maintenance": dict(window.__dict__) if window is not None else None,
    }


def list_nodes(
    conn: Connection,
    *,
    now: datetime,
    liveness: Liveness,
    state: str | None = None,
    labels: dict[str, str] | None = None,
    limit: int = 10_000,
    offset: int = 0,
) -> list[dict[str, Any]]:
    counts = _gpu_counts()
    query = (
        select(nodes, counts.c.gpu_count)
        .outerjoin(counts, counts.c.node_id == nodes.c.id)
        .order_by(nodes.c.name)
    )
    found = []
    planned = load_planned(conn, now)
    rows = conn.execute(query).all()
    lag = fleet_lag_s(((r.last_seen, r.lag_s) for r in rows), now, max_s=liveness.lag_max_s)
    for row in rows:
        if labels and any(row.labels.get(k) != v for k, v in labels.items()):
            continue
        node = _public(row, liveness=liveness, now=now, planned=planned, lag_s=lag)
        if state is None or node["state"] == state:
            found.append(node)
    return found[offset : offset + limit]


def get_node(conn: Connection, *, name: str, now: datetime, liveness: Liveness) -> dict[str, Any]:
    counts = _gpu_counts()
    row = conn.execute(
        select(nodes, counts.c.gpu_count)
        .outerjoin(counts, counts.c.node_id == nodes.c.id)
        .where(nodes.c.name == name)
    ).first()
    if row is None:
        raise NotFound("node", name)
    gpu_rows = conn.execute(
        gpu_summary_query().where(gpus.c.node_id == row.id).order_by(gpus.c.index)
    )
    lag = read_fleet_lag_s(conn, now, max_s=liveness.lag_max_s)
    return {
        **_public(row, liveness=liveness, now=now, planned=load_planned(conn, now), lag_s=lag),
        "boot_id": row.boot_id,
        "gpus": [summary_from_row(g) for g in gpu_rows],
    }


def count_nodes(conn: Connection) -> int:
    """How many nodes the server knows."""
    return int(conn.execute(select(func.count()).select_from(nodes)).scalar_one())


def node_id_of(conn: Connection, *, name: str) -> int:
    """The stored id of the node called ``name``; :class:`NotFound` when none is."""
    found = conn.execute(select(nodes.c.id).where(nodes.c.name == name)).scalar()
    if found is None:
        raise NotFound("node", name)
    return int(found)


def unheard_nodes(
    conn: Connection,
    *,
    now: datetime,
    factor: float,
    heard_since: datetime | None,
    planned: Planned | None = None,
    lag_s: float = 0.0,
) -> set[str]:
    """Nodes silent past their deadline, but only since before this process could hear them (or
    since before their maintenance window ended): their open unreachable evictions stay as they
    are until the grace ends (neither new nor cancelled). ``lag_s``: the fleet's ingest lag."""
    planned = planned or Planned()
    starts = [t for t in (heard_since, *planned.ended.values()) if t is not None]
    if not starts:
        return set()
    rows = conn.execute(
        select(nodes.c.name, nodes.c.last_seen, nodes.c.interval_s).where(
            nodes.c.last_seen < max(starts)
        )
    )
    found = set()
    for r in rows:
        heard = planned.listen_from(r.name, heard_since)
        if heard is not None and not planned.covers(r.name):
            if is_unheard(r.last_seen, r.interval_s, factor, now, heard, lag_s):
                found.add(r.name)
    return found
