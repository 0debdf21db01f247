"""A running job's notices: a drain pending on one of its nodes, a GPU a rule took out, a node
risk over the job's threshold, and their clearing (``server/act/notices.py`` derives them).

Read with the job's own **agent** token (the StepReporter's) or any read token.
``?after=<cursor>`` returns what a rank missed; ``?wait=N`` long-polls on whichever replica it
reaches, woken by ``NOTIFY fleetwatch_notices`` (PostgreSQL) or in-process (SQLite).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool

from fleetwatch.server.act.eviction_watch import EvictionWatch, long_poll
from fleetwatch.server.db.session import Database
from fleetwatch.server.deps import DatabaseDep, NoticeAuth
from fleetwatch.server.repo.notices import list_notices, open_notices
from fleetwatch.server.routers.jobs import JobId
from fleetwatch.server.schemas.fields import INT64_MAX
from fleetwatch.server.schemas.notices import NoticePublic, NoticesPublic

__all__ = ["router"]

router = APIRouter(tags=["jobs"])

_WAIT_DESCRIPTION = (
    "Long-poll: seconds (0 to 60) to hold the request while the job has no notice after `after`. "
    "The answer comes at once when it has, else as soon as one is stored (by any replica), else "
    "after `wait` seconds with an empty list. 0 (the default) answers at once."
)


@router.get(
    "/jobs/{job_id}/notices",
    response_model=NoticesPublic,
    summary="A running job's notices: drain pending, GPU out, risk, cleared (agent or read token)",
)
async def read_notices(
    job_id: JobId,
    request: Request,
    db: DatabaseDep,
    _token: NoticeAuth,
    after: Annotated[
        int, Query(ge=0, le=INT64_MAX, description="Only notices with a larger id (the cursor)")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    wait: Annotated[float, Query(ge=0, le=60, description=_WAIT_DESCRIPTION)] = 0,
) -> NoticesPublic:
    """A job the server has not heard of has no notices (an empty list, not 404): its ranks may
    ask before its first report arrives."""
    watch: EvictionWatch | None = getattr(request.app.state, "notice_watch", None)
    found, open_count = await long_poll(
        watch,
        lambda: run_in_threadpool(_read, db, job_id, after, limit),
        wait_s=min(wait, request.app.state.settings.long_poll_max_s),
        gone=request.is_disconnected,
    )
    cursor = found[-1].id if found else after
    return NoticesPublic(
        job_id=job_id, count=len(found), data=found, cursor=cursor, open=open_count
    )


def _read(db: Database, job_id: str, after: int, limit: int) -> tuple[list[NoticePublic], int]:
    with db.read() as conn:
        found = list_notices(conn, job_id, after=after, limit=limit)
        open_count = open_notices(conn, job_id)
    return [NoticePublic.model_validate(row, from_attributes=True) for row in found], open_count
