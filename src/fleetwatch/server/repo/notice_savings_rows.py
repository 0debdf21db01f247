"""The rows the "Work saved by notices" figures are computed from
(:mod:`fleetwatch.reports.notice_savings`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, select

from fleetwatch.config import ServerSettings
from fleetwatch.reports.notice_savings import NOTICE_LOOKBACK, JobSpan, Notice, notice_savings
from fleetwatch.server.db.tables import job_checkpoints, job_notices
from fleetwatch.server.repo.job_outcomes import jobs_in, node_failures

__all__ = ["compute_notice_savings"]


def _jobs(conn: Connection, since: datetime, until: datetime) -> list[JobSpan]:
    return [
        JobSpan(
            r.job_id,
            tuple(r.nodes or ()),
            r.ranks,
            r.started_at or r.first_seen,
            r.ended_at or r.last_seen,
            r.outcome,
            r.ended_at,
        )
        for r in jobs_in(conn, since, until)
    ]


def _notices(conn: Connection, since: datetime, until: datetime) -> list[Notice]:
    rows = conn.execute(
        select(
            job_notices.c.job_id,
            job_notices.c.node,
            job_notices.c.opened_at,
            job_notices.c.cleared_at,
        ).where(
            job_notices.c.kind != "cleared",
            job_notices.c.opened_at >= since,
            job_notices.c.opened_at < until,
        )
    )
    return [Notice(r.job_id, r.node, r.opened_at, r.cleared_at) for r in rows]


def _notices_known(conn: Connection, until: datetime) -> bool:
    query = select(job_notices.c.id).where(job_notices.c.opened_at < until).limit(1)
    return conn.execute(query).first() is not None


def _checkpoints_done(
    conn: Connection, job_ids: Sequence[str], until: datetime
) -> dict[str, list[datetime]]:
    out: dict[str, list[datetime]] = {}
    ids = sorted(set(job_ids))
    for i in range(0, len(ids), 1000):
        rows = conn.execute(
            select(
                job_checkpoints.c.job_id, job_checkpoints.c.started_at, job_checkpoints.c.duration_s
            ).where(
                job_checkpoints.c.job_id.in_(ids[i : i + 1000]),
                job_checkpoints.c.started_at < until,
            )
        )
        for r in rows:
            out.setdefault(r.job_id, []).append(r.started_at + timedelta(seconds=r.duration_s))
    return out


def compute_notice_savings(
    conn: Connection, since: datetime, until: datetime, *, settings: ServerSettings
) -> dict[str, Any]:
    """The figures for ``[since, until)``, read from the stored rows."""
    before = timedelta(seconds=settings.job_failure_before_s)
    after = timedelta(seconds=settings.job_failure_after_s)
    jobs = _jobs(conn, since - before, until + after)
    failures = node_failures(conn, since - before, until + after) if jobs else []
    failed = [j.job_id for j in jobs if j.outcome == "failed"]
    return notice_savings(
        since=since,
        until=until,
        failures=failures,
        jobs=jobs,
        notices=_notices(conn, since - before - NOTICE_LOOKBACK, until),
        notices_known=_notices_known(conn, until),
        checkpoints_done=_checkpoints_done(conn, failed, until + after),
        before=before,
        after=after,
    )
