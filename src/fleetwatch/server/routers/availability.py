"""Availability, downtime, MTBF/MTTR by label, jobs, goodput and SLA over a period (read scope)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool

from fleetwatch.config import ServerSettings
from fleetwatch.errors import InvalidInput
from fleetwatch.reports.availability import compute_availability
from fleetwatch.server.db.session import Database
from fleetwatch.server.deps import DatabaseDep, ReadAuth, SettingsDep
from fleetwatch.server.repo.availability_rows import load_period, sla_targets
from fleetwatch.server.schemas.availability import AvailabilityPublic
from fleetwatch.server.timeparse import parse_instant

__all__ = ["figures", "router"]

router = APIRouter(tags=["availability"])

MAX_PERIOD = timedelta(days=400)
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$")


def figures(
    db: Database, settings: ServerSettings, since: datetime, until: datetime, by: list[str]
) -> dict[str, Any]:
    with db.read() as conn:
        period = load_period(conn, since, until, settings=settings)
    return compute_availability(period, sla_targets(settings), by=by)


@router.get(
    "/availability",
    response_model=AvailabilityPublic,
    summary="Availability, downtime, MTBF/MTTR by label, jobs, goodput and SLA over a period",
)
async def get_availability(
    db: DatabaseDep,
    settings: SettingsDep,
    _token: ReadAuth,
    since: Annotated[str | None, Query(description="ISO 8601 or a duration back (7d)")] = None,
    until: Annotated[
        str | None, Query(description="ISO 8601 or a duration back; default now")
    ] = None,
    by: Annotated[
        list[str] | None,
        Query(max_length=8, description="Node labels to break MTBF/MTTR down by (sku, rack, ...)"),
    ] = None,
) -> dict[str, Any]:
    """Figures over ``[since, until)`` (default: the last 7 days). Definitions: docs/telling.md's
    "Availability" section."""
    now = datetime.now(UTC)
    end = parse_instant(until, name="until", now=now) or now
    start = parse_instant(since, name="since", now=now) or end - timedelta(days=7)
    if start >= end:
        raise InvalidInput(
            "since: not before until", [{"loc": ["query", "since"], "msg": "not before until"}]
        )
    if end - start > MAX_PERIOD:
        raise InvalidInput(
            f"since: period longer than {MAX_PERIOD.days} days",
            [{"loc": ["query", "since"], "msg": f"more than {MAX_PERIOD.days} days"}],
        )
    labels = by or ["sku", "rack"]
    for i, label in enumerate(labels):
        if not _LABEL.match(label):
            raise InvalidInput(
                f"by: {label!r} is not a label name",
                [{"loc": ["query", "by", i], "msg": "not a label name"}],
            )
    return await run_in_threadpool(figures, db, settings, start, end, list(dict.fromkeys(labels)))
