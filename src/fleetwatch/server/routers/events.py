"""Events: Xid errors, GPUs lost from the bus, reboots."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from fleetwatch.server.db.base import utcnow
from fleetwatch.server.deps import DatabaseDep, ReadAuth
from fleetwatch.server.repo.events import list_events
from fleetwatch.server.routers.gpus import TimeArg
from fleetwatch.server.schemas.fields import INT32_MAX, Text
from fleetwatch.server.schemas.fleet import EventPublic, EventsPublic
from fleetwatch.server.timeparse import parse_instant

__all__ = ["router"]

router = APIRouter(prefix="/events", tags=["events"])


@router.get("", response_model=EventsPublic, summary="Search events, newest first")
def read_events(
    db: DatabaseDep,
    _token: ReadAuth,
    since: TimeArg = None,
    until: TimeArg = None,
    node: Text | None = None,
    kind: Annotated[Text | None, Query(description="xid, gpu_lost, node_boot, ...")] = None,
    xid: Annotated[int | None, Query(ge=0, le=INT32_MAX)] = None,
    uuid: Annotated[Text | None, Query(description="GPU uuid")] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
) -> EventsPublic:
    """Events matching every filter given, newest first."""
    now = utcnow()
    with db.read() as conn:
        found = list_events(
            conn,
            since=parse_instant(since, name="since", now=now),
            until=parse_instant(until, name="until", now=now),
            node=node,
            kind=kind,
            xid=xid,
            gpu_uuid=uuid,
            limit=limit,
        )
    return EventsPublic(data=[EventPublic.model_validate(e) for e in found], count=len(found))
