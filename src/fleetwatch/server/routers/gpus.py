"""GPUs: identity, latest state, history."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from fleetwatch.server.db.base import utcnow
from fleetwatch.server.deps import DatabaseDep, ReadAuth
from fleetwatch.server.repo.gpus import get_gpu, list_gpus, list_samples, parse_fields
from fleetwatch.server.schemas.common import error_responses
from fleetwatch.server.schemas.fields import Text
from fleetwatch.server.schemas.fleet import GpuDetail, GpuSummary, SamplesPublic
from fleetwatch.server.timeparse import parse_instant

__all__ = ["router"]

router = APIRouter(prefix="/gpus", tags=["gpus"])

TimeArg = Annotated[
    Text | None,
    Query(
        description="ISO 8601 time (2026-11-30T05:00:00Z) or a duration ago (1h), "
        "between 1970-01-01 and 9999-01-01"
    ),
]


@router.get("", response_model=list[GpuSummary], summary="List GPUs with their latest sample")
def read_gpus(
    db: DatabaseDep,
    _token: ReadAuth,
    node: Text | None = None,
    limit: Annotated[int, Query(ge=1, le=200_000)] = 10_000,
) -> list[GpuSummary]:
    """GPUs sorted by node and index."""
    with db.read() as conn:
        found = list_gpus(conn, node=node, limit=limit)
    return [GpuSummary.model_validate(gpu) for gpu in found]


@router.get(
    "/{uuid}",
    response_model=GpuDetail,
    responses=error_responses(404),
    summary="One GPU: identity, latest, recent events",
)
def read_gpu(uuid: Text, db: DatabaseDep, _token: ReadAuth) -> GpuDetail:
    """The GPU's identity, its newest sample and its 20 most recent events."""
    with db.read() as conn:
        found = get_gpu(conn, uuid=uuid)
    return GpuDetail.model_validate(found)


@router.get(
    "/{uuid}/samples",
    response_model=SamplesPublic,
    responses=error_responses(404),
    summary="A GPU's samples over time",
)
def read_samples(
    uuid: Text,
    db: DatabaseDep,
    _token: ReadAuth,
    since: TimeArg = None,
    until: TimeArg = None,
    fields: Annotated[
        Text | None, Query(description="Comma-separated canonical fields; default all")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
    rates: Annotated[bool, Query(description="Add per-second rates of counter fields")] = False,
) -> SamplesPublic:
    """Samples oldest first; fields a GPU did not report are absent from each point."""
    now = utcnow()
    wanted = parse_fields(fields)
    with db.read() as conn:
        found = list_samples(
            conn,
            uuid=uuid,
            fields=wanted,
            since=parse_instant(since, name="since", now=now),
            until=parse_instant(until, name="until", now=now),
            limit=limit,
            rates=rates,
        )
    return SamplesPublic.model_validate(found)
