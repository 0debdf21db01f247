"""What a job says of itself (issue 14): its start, end and outcome, checkpoints and restarts,
and the node failures a failed job is attributed to.

Every write is idempotent, as a client retries: a start widens the job (earliest start, union of
nodes, most ranks), an end is the newest word on how the job ended (a requeued job ends again),
a checkpoint is keyed by its start and a restart by its resume time (a repeat is ignored).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from fleetwatch.reports.job_failures import NodeFailure
from fleetwatch.server.db.tables import (
    evictions,
    gpu_lifetimes,
    job_checkpoints,
    job_restarts,
    job_steps,
    jobs,
    nodes,
)

__all__ = [
    "checkpoint_summary",
    "end_job",
    "jobs_in",
    "mean_step_s",
    "node_failures",
    "restart_summary",
    "start_job",
    "store_checkpoint",
    "store_restart",
]


def _insert(conn: Connection, table: Any) -> Any:
    return (pg_insert if conn.dialect.name == "postgresql" else sqlite_insert)(table)


def _ensure_job(conn: Connection, job_id: str, at: datetime, names: Sequence[str]) -> Any:
    """The job's row, locked; created (seen at ``at``) when the job reported nothing before."""
    new = {"job_id": job_id, "first_seen": at, "last_seen": at, "ranks": 0, "nodes": sorted(names)}
    conn.execute(_insert(conn, jobs).values(new).on_conflict_do_nothing(index_elements=["job_id"]))
    return conn.execute(select(jobs).where(jobs.c.job_id == job_id).with_for_update()).one()


def start_job(
    conn: Connection,
    job_id: str,
    started_at: datetime,
    names: Sequence[str],
    ranks: int | None,
    *,
    notice_risk_threshold: float | None = None,
    notice_horizon_h: float | None = None,
) -> None:
    """``notice_*``: what the job chose for its risk notices (issue 15); None keeps the earlier
    choice (or the server's default)."""
    row = _ensure_job(conn, job_id, started_at, names)
    start = started_at if row.started_at is None else min(row.started_at, started_at)
    chosen = {"notice_risk_threshold": notice_risk_threshold, "notice_horizon_h": notice_horizon_h}
    conn.execute(
        update(jobs)
        .where(jobs.c.job_id == job_id)
        .values(
            started_at=start,
            nodes=sorted(set(row.nodes) | set(names)),
            ranks=max(row.ranks, ranks or 0),
            **{k: v for k, v in chosen.items() if v is not None},
        )
    )


def end_job(
    conn: Connection,
    job_id: str,
    ended_at: datetime,
    outcome: str,
    reason: str | None,
    names: Sequence[str],
) -> None:
    row = _ensure_job(conn, job_id, ended_at, names)
    conn.execute(
        update(jobs)
        .where(jobs.c.job_id == job_id)
        .values(
            ended_at=ended_at,
            outcome=outcome,
            end_reason=reason,
            nodes=sorted(set(row.nodes) | set(names)),
        )
    )


def store_checkpoint(conn: Connection, job_id: str, values: dict[str, Any]) -> bool:
    """True when stored; False when this checkpoint (job, start) was stored before."""
    _ensure_job(conn, job_id, values["started_at"], ())
    new = _insert(conn, job_checkpoints).values(job_id=job_id, **values)
    new = new.on_conflict_do_nothing(index_elements=["job_id", "started_at"])
    return conn.execute(new.returning(job_checkpoints.c.id)).first() is not None


def store_restart(conn: Connection, job_id: str, values: dict[str, Any]) -> bool:
    """True when stored; False when this restart (job, resume time) was stored before."""
    _ensure_job(conn, job_id, values["resumed_at"], ())
    new = _insert(conn, job_restarts).values(job_id=job_id, **values)
    new = new.on_conflict_do_nothing(index_elements=["job_id", "resumed_at"])
    return conn.execute(new.returning(job_restarts.c.id)).first() is not None


def checkpoint_summary(conn: Connection, job_id: str) -> dict[str, Any]:
    row = conn.execute(
        select(
            func.count(),
            func.sum(job_checkpoints.c.duration_s),
            func.avg(job_checkpoints.c.duration_s),
            func.max(job_checkpoints.c.step),
        ).where(job_checkpoints.c.job_id == job_id)
    ).one()
    return {"count": row[0], "total_s": row[1], "mean_s": row[2], "last_step": row[3]}


def restart_summary(conn: Connection, job_id: str) -> dict[str, Any]:
    found = list(conn.execute(select(job_restarts).where(job_restarts.c.job_id == job_id)))
    steps = [r.lost_steps for r in found if r.lost_steps is not None]
    lost = [r.lost_s for r in found if r.lost_s is not None]
    recover = [
        (r.resumed_at - r.interrupted_at).total_seconds()
        for r in found
        if r.interrupted_at is not None
    ]
    return {
        "count": len(found),
        "lost_steps": sum(steps) if steps else None,
        "lost_s": sum(lost) if lost else None,
        "mean_recover_s": sum(recover) / len(recover) if recover else None,
    }


def mean_step_s(conn: Connection, job_ids: Iterable[str]) -> dict[str, float]:
    """Each job's mean reported step time, seconds (jobs with no steps are absent)."""
    ids = sorted(set(job_ids))
    out: dict[str, float] = {}
    for i in range(0, len(ids), 1000):
        rows = conn.execute(
            select(job_steps.c.job_id, func.avg(job_steps.c.duration_ms))
            .where(job_steps.c.job_id.in_(ids[i : i + 1000]))
            .group_by(job_steps.c.job_id)
        )
        out.update({r[0]: float(r[1]) / 1000.0 for r in rows if r[1] is not None})
    return out


def node_failures(
    conn: Connection, start: datetime, end: datetime, names: Sequence[str] | None = None
) -> list[NodeFailure]:
    """Hardware failures in ``[start, end]``: GPU lifetimes ended by a failure, and drains
    created by a rule (an Xid, host or port rule), optionally only of ``names``."""
    gpu = (
        select(
            nodes.c.name, gpu_lifetimes.c.removed_at, gpu_lifetimes.c.serial, gpu_lifetimes.c.cause
        )
        .join(nodes, nodes.c.id == gpu_lifetimes.c.node_id)
        .where(
            gpu_lifetimes.c.end_kind == "failure",
            gpu_lifetimes.c.removed_at >= start,
            gpu_lifetimes.c.removed_at <= end,
        )
    )
    drains = select(evictions.c.node, evictions.c.created_at, evictions.c.reason).where(
        evictions.c.reason_kind == "rule",
        evictions.c.created_at >= start,
        evictions.c.created_at <= end,
    )
    if names is not None:
        gpu = gpu.where(nodes.c.name.in_(list(names)))
        drains = drains.where(evictions.c.node.in_(list(names)))
    found = [
        NodeFailure(r.name, r.removed_at, "gpu_failure", f"GPU {r.serial}: {r.cause or 'failure'}")
        for r in conn.execute(gpu)
    ]
    found += [NodeFailure(r.node, r.created_at, "drain", r.reason) for r in conn.execute(drains)]
    return found


def jobs_in(conn: Connection, since: datetime, until: datetime) -> list[Any]:
    """Jobs that ran or ended in ``[since, until)`` by their own report."""
    running = and_(
        jobs.c.started_at < until, or_(jobs.c.ended_at.is_(None), jobs.c.ended_at >= since)
    )
    ended = and_(jobs.c.ended_at >= since, jobs.c.ended_at < until)
    return list(conn.execute(select(jobs).where(or_(running, ended))))
