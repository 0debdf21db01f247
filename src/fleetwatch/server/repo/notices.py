"""Reads of a job's notices (written by ``server/act/notices.py``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Row, func, select

from fleetwatch.server.db.tables import job_notices

__all__ = ["list_notices", "open_job_notices", "open_notices"]


def list_notices(conn: Connection, job_id: str, *, after: int, limit: int) -> list[Row[Any]]:
    """The job's notices with ``id > after``, oldest first. Ids are handed out at insert and the
    deriving job is the one writer (an advisory lock), so a later read never finds a smaller id."""
    query = (
        select(job_notices)
        .where(job_notices.c.job_id == job_id, job_notices.c.id > after)
        .order_by(job_notices.c.id)
        .limit(limit)
    )
    return list(conn.execute(query))


def open_notices(conn: Connection, job_id: str) -> int:
    query = select(func.count()).where(
        job_notices.c.job_id == job_id,
        job_notices.c.cleared_at.is_(None),
        job_notices.c.kind != "cleared",
    )
    return int(conn.execute(query).scalar_one())


def open_job_notices(conn: Connection, job_id: str) -> list[Row[Any]]:
    """The job's notices open now, oldest first."""
    query = (
        select(job_notices)
        .where(
            job_notices.c.job_id == job_id,
            job_notices.c.cleared_at.is_(None),
            job_notices.c.kind != "cleared",
        )
        .order_by(job_notices.c.id)
    )
    return list(conn.execute(query))
