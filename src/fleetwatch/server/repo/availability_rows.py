"""The rows the availability figures are computed from (:mod:`fleetwatch.reports.availability`).

Outages: a performed drain runs from ``completed_at`` to ``returned_at`` (open while the node is
out); a GPU failure runs from ``removed_at`` until its slot gets a GPU again, and counts as down
for at most ``OPEN_SLOT_LIMIT`` (the weekly report's rule: a slot empty longer is decommissioned).
Planned downtime comes from maintenance windows through :func:`planned_intervals`, the one place
that reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, func, or_, select

from fleetwatch.config import ServerSettings
from fleetwatch.reports.availability import (
    Checkpoint,
    FleetPeriod,
    Interval,
    JobRecord,
    Outage,
    Restart,
    SlaTargets,
    StragglerSpan,
)
from fleetwatch.reports.job_failures import attribute_failure, failures_by_node
from fleetwatch.reports.weekly import OPEN_SLOT_LIMIT
from fleetwatch.server.db.tables import (
    evictions,
    gpu_lifetimes,
    gpus,
    job_checkpoints,
    job_restarts,
    nodes,
    stragglers,
)
from fleetwatch.server.repo.job_outcomes import jobs_in, mean_step_s, node_failures
from fleetwatch.server.repo.maintenance import maintenance_intervals

__all__ = ["load_outages", "load_period", "planned_intervals", "sla_targets"]

# Reports of checkpoints and restarts this long before the period may still overlap it.
LOOKBACK = timedelta(days=7)


def sla_targets(settings: ServerSettings) -> SlaTargets:
    return SlaTargets(settings.sla_availability, settings.sla_recovery_minutes)


def planned_intervals(
    conn: Connection, since: datetime, until: datetime
) -> dict[str, list[Interval]] | None:
    """Each node's planned downtime (its maintenance windows) clipped to ``[since, until)``.

    Always known in this build (no window is a measured 0 h); the ``None`` the computation
    accepts stays for callers that have no windows to give."""
    return maintenance_intervals(conn, since, until)


def _node_labels(
    conn: Connection, until: datetime, with_labels: bool
) -> tuple[dict[str, dict[str, Any]], dict[str, datetime]]:
    """Labels of nodes seen before ``until`` (with ``sku`` from their GPUs when not a label);
    without ``with_labels`` each node's labels are left empty (figures for the whole fleet
    read none, and reading them was most of the /metrics figures' cost at 12,500 nodes)."""
    columns = [nodes.c.id, nodes.c.name, nodes.c.first_seen]
    if with_labels:
        columns.append(nodes.c.labels)
    rows = conn.execute(select(*columns).where(nodes.c.first_seen < until)).all()
    joined = {r.name: r.first_seen for r in rows}
    if not with_labels:
        return {r.name: {} for r in rows}, joined
    skus = _node_skus(conn)
    labels: dict[str, dict[str, Any]] = {}
    for r in rows:
        mine = dict(r.labels or {})
        if "sku" not in mine and r.id in skus:
            mine["sku"] = skus[r.id]
        labels[r.name] = mine
    return labels, joined


def _node_skus(conn: Connection) -> dict[int, str]:
    """Each node's SKU: its GPUs' most common model (ties: the first name in order), counted
    by the database, one row per node and model instead of one per GPU."""
    counted = conn.execute(
        select(gpus.c.node_id, gpus.c.name, func.count())
        .where(gpus.c.name.is_not(None), gpus.c.name != "")
        .group_by(gpus.c.node_id, gpus.c.name)
    )
    best: dict[int, tuple[int, str]] = {}
    for node_id, name, count in counted:
        held = best.get(node_id)
        if held is None or (-count, name) < (-held[0], held[1]):
            best[node_id] = (count, name)
    return {node_id: name for node_id, (_, name) in best.items()}


def _outages(conn: Connection, since: datetime, until: datetime) -> list[Outage]:
    drained = conn.execute(
        select(
            evictions.c.node,
            evictions.c.completed_at,
            evictions.c.returned_at,
            evictions.c.reason_kind,
        ).where(
            evictions.c.dry_run.is_(False),
            evictions.c.completed_at.is_not(None),
            evictions.c.completed_at < until,
            or_(evictions.c.returned_at.is_(None), evictions.c.returned_at >= since),
        )
    )
    found = [
        Outage(r.node, r.completed_at, r.returned_at, f"drain:{r.reason_kind}") for r in drained
    ]
    failed = conn.execute(
        select(nodes.c.name, gpu_lifetimes.c.removed_at, gpu_lifetimes.c.location)
        .join(nodes, nodes.c.id == gpu_lifetimes.c.node_id)
        .where(
            gpu_lifetimes.c.end_kind == "failure",
            gpu_lifetimes.c.removed_at < until,
            gpu_lifetimes.c.removed_at >= since - OPEN_SLOT_LIMIT,
        )
    ).all()
    places = sorted({r.location for r in failed if r.location})
    installs: dict[str, list[datetime]] = {}
    for i in range(0, len(places), 1000):
        for loc, at in conn.execute(
            select(gpu_lifetimes.c.location, gpu_lifetimes.c.installed_at).where(
                gpu_lifetimes.c.location.in_(places[i : i + 1000])
            )
        ):
            installs.setdefault(loc, []).append(at)
    for r in failed:
        later = [t for t in installs.get(r.location, []) if t >= r.removed_at]
        limit = r.removed_at + OPEN_SLOT_LIMIT
        back = min([*later, limit])
        found.append(Outage(r.name, r.removed_at, back if back < until else None, "gpu_failure"))
    return found


def _jobs(
    conn: Connection, since: datetime, until: datetime, settings: ServerSettings
) -> list[JobRecord]:
    rows = jobs_in(conn, since, until)
    before = timedelta(seconds=settings.job_failure_before_s)
    after = timedelta(seconds=settings.job_failure_after_s)
    failed = [r for r in rows if r.outcome == "failed" and r.ended_at is not None]
    by_node = failures_by_node(node_failures(conn, since - before, until + after)) if failed else {}
    out = []
    for r in rows:
        hardware = (
            r.outcome == "failed"
            and r.ended_at is not None
            and attribute_failure(r.nodes, r.ended_at, by_node, before=before, after=after)
            is not None
        )
        out.append(
            JobRecord(
                r.job_id, tuple(r.nodes), r.ranks, r.started_at, r.ended_at, r.outcome, hardware
            )
        )
    return out


def _job_events(
    conn: Connection, since: datetime, until: datetime, job_ids: Sequence[str]
) -> tuple[list[Checkpoint], list[Restart]]:
    ids = set(job_ids)
    ckpts = [
        Checkpoint(r.job_id, r.started_at, r.duration_s)
        for r in conn.execute(
            select(job_checkpoints).where(
                job_checkpoints.c.started_at >= since - LOOKBACK,
                job_checkpoints.c.started_at < until,
            )
        )
        if r.job_id in ids
    ]
    rows = [
        r
        for r in conn.execute(
            select(job_restarts).where(
                job_restarts.c.resumed_at >= since, job_restarts.c.resumed_at < until + LOOKBACK
            )
        )
        if r.job_id in ids
    ]
    steps = mean_step_s(conn, [r.job_id for r in rows if r.lost_s is None and r.lost_steps])
    restarts = []
    for r in rows:
        lost = r.lost_s
        if lost is None and r.lost_steps is not None and r.job_id in steps:
            lost = r.lost_steps * steps[r.job_id]
        restarts.append(Restart(r.job_id, r.resumed_at, r.interrupted_at, lost))
    return ckpts, restarts


def _stragglers(conn: Connection, since: datetime, until: datetime) -> list[StragglerSpan]:
    rows = conn.execute(
        select(stragglers).where(
            stragglers.c.started_at < until,
            or_(stragglers.c.ended_at.is_(None), stragglers.c.ended_at > since),
        )
    )
    return [
        StragglerSpan(r.job_id, r.node, r.kind, r.started_at, r.ended_at, r.ratio) for r in rows
    ]


def load_period(
    conn: Connection,
    since: datetime,
    until: datetime,
    *,
    settings: ServerSettings,
    with_labels: bool = True,
) -> FleetPeriod:
    """The rows of ``[since, until)``; ``with_labels=False`` for figures of the whole fleet
    alone (no breakdown by a node label), which leaves every node's labels empty."""
    labels, joined = _node_labels(conn, until, with_labels)
    planned = planned_intervals(conn, since, until)
    jobs = _jobs(conn, since, until, settings)
    ckpts, restarts = _job_events(conn, since, until, [j.job_id for j in jobs])
    return FleetPeriod(
        since=since,
        until=until,
        nodes=labels,
        joined=joined,
        planned=planned or {},
        planned_known=planned is not None,
        outages=_outages(conn, since, until),
        jobs=jobs,
        checkpoints=ckpts,
        restarts=restarts,
        stragglers=_stragglers(conn, since, until),
    )


def load_outages(conn: Connection, since: datetime, until: datetime) -> FleetPeriod:
    """The nodes, their maintenance and outages of ``[since, until)`` without jobs or labels:
    what availability alone needs (the fleet page's trends, a node's page)."""
    _, joined = _node_labels(conn, until, False)
    planned = planned_intervals(conn, since, until)
    return FleetPeriod(
        since=since,
        until=until,
        nodes={name: {} for name in joined},
        joined=joined,
        planned=planned or {},
        planned_known=planned is not None,
        outages=_outages(conn, since, until),
    )
