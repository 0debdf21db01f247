"""Evictions for schedulers: which nodes to drain and why; ack, complete, reject, return.

Reading needs read scope (scheduler and admin tokens have it); every change needs scheduler
scope, and the token's name is recorded as the actor and the claimer.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query

from fleetwatch.server.db.base import utcnow
from fleetwatch.server.deps import AdminAuth, DatabaseDep, ReadAuth, SchedulerAuth
from fleetwatch.server.repo.evictions import (
    ack_eviction,
    approve_eviction,
    complete_eviction,
    get_eviction,
    list_evictions,
    reject_eviction,
    return_node,
)
from fleetwatch.server.schemas.common import error_responses
from fleetwatch.server.schemas.evictions import (
    AckBody,
    ApproveBody,
    EvictionDetail,
    EvictionPublic,
    EvictionsPublic,
    RejectBody,
    ReturnBody,
    State,
)
from fleetwatch.server.schemas.fields import RowId, Text

__all__ = ["router"]

router = APIRouter(tags=["evictions"])

_CHANGE_ERRORS = error_responses(
    404,
    described={
        409: "Another scheduler holds the lease, or the eviction's state does not allow this"
    },
)


@router.get("/evictions", response_model=EvictionsPublic,
            summary="Evictions, newest first; state=pending is what to drain now")  # fmt: skip
def read_evictions(
    db: DatabaseDep,
    _token: ReadAuth,
    state: Annotated[State | None, Query(description="only this state")] = None,
    node: Annotated[Text | None, Query(description="only this node")] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
) -> EvictionsPublic:
    with db.read() as conn:
        found = list_evictions(conn, state=state, node=node, limit=limit)
    return EvictionsPublic(count=len(found), data=found)


@router.get("/evictions/{eviction_id}", response_model=EvictionDetail,
            responses=error_responses(404),
            summary="One eviction with its evidence and audit trail")  # fmt: skip
def read_eviction(eviction_id: RowId, db: DatabaseDep, _token: ReadAuth) -> EvictionDetail:
    with db.read() as conn:
        return get_eviction(conn, eviction_id)


@router.post("/evictions/{eviction_id}/ack", response_model=EvictionPublic,
             responses=_CHANGE_ERRORS,
             summary="Claim a pending eviction for lease_s seconds")  # fmt: skip
def ack(
    eviction_id: RowId, db: DatabaseDep, token: SchedulerAuth,
    body: Annotated[AckBody | None, Body()] = None,
) -> EvictionPublic:  # fmt: skip
    """409 while another scheduler holds an unexpired lease. Acking again as the same scheduler
    renews the lease; an expired lease may be taken over."""
    lease_s = (body or AckBody()).lease_s
    with db.write() as conn:
        return ack_eviction(conn, eviction_id, claimer=token.name, lease_s=lease_s, now=utcnow())


@router.post("/evictions/{eviction_id}/complete", response_model=EvictionPublic,
             responses=_CHANGE_ERRORS, summary="The claimer drained the node")  # fmt: skip
def complete(eviction_id: RowId, db: DatabaseDep, token: SchedulerAuth) -> EvictionPublic:
    with db.write() as conn:
        return complete_eviction(conn, eviction_id, claimer=token.name, now=utcnow())


@router.post("/evictions/{eviction_id}/reject", response_model=EvictionPublic,
             responses=_CHANGE_ERRORS, summary="Refuse the drain, with a reason")  # fmt: skip
def reject(
    eviction_id: RowId, body: RejectBody, db: DatabaseDep, token: SchedulerAuth
) -> EvictionPublic:
    with db.write() as conn:
        return reject_eviction(conn, eviction_id, actor=token.name, reason=body.reason,
                               now=utcnow())  # fmt: skip


@router.post("/evictions/{eviction_id}/approve", response_model=EvictionPublic,
             responses=_CHANGE_ERRORS,
             summary="Let a paged (over-budget) or dry-run eviction drain (admin)")  # fmt: skip
def approve(
    eviction_id: RowId, body: ApproveBody, db: DatabaseDep, token: AdminAuth
) -> EvictionPublic:
    """On-call, paged because the fleet drain budget was exhausted, decides this node must drain
    anyway: the eviction becomes pending for the schedulers, and the audit log says who and why."""
    with db.write() as conn:
        return approve_eviction(conn, eviction_id, actor=token.name, note=body.note,
                                now=utcnow())  # fmt: skip


@router.post("/nodes/{name}/return", response_model=EvictionPublic,
             responses=_CHANGE_ERRORS,
             summary="The drained node is back in service (records returned_at)")  # fmt: skip
def return_to_service(
    name: Text, db: DatabaseDep, token: SchedulerAuth,
    body: Annotated[ReturnBody | None, Body()] = None,
) -> EvictionPublic:  # fmt: skip
    with db.write() as conn:
        return return_node(conn, name, actor=token.name, note=(body or ReturnBody()).note,
                           now=utcnow())  # fmt: skip
