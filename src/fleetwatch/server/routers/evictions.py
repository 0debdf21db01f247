"""Evictions for schedulers: which nodes to drain and why; ack, complete, reject, return.

Reading needs read scope (scheduler and admin tokens have it); every change needs scheduler
scope, and the token's name is recorded as the actor and the claimer.

``GET /v1/evictions?wait=N`` is a long-poll: a scheduler hears of a new eviction the moment it
is created, on whichever replica it asks (``server/act/eviction_watch.py`` says how). With several
``state`` values and ``changed_after`` (the ``cursor`` of its last read) it hears of every change
it acts on, e.g. a return as well as a new drain, and not again of what it has already read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import Row

from fleetwatch.server.act.eviction_watch import EvictionWatch, long_poll
from fleetwatch.server.auth import Permission, check_permission
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.deps import AdminAuth, DatabaseDep, ReadAuth, SchedulerAuth
from fleetwatch.server.repo.evictions import (
    ack_eviction,
    approve_eviction,
    complete_eviction,
    eviction_cursor,
    get_eviction,
    list_evictions,
    reject_eviction,
    return_node,
)
from fleetwatch.server.schemas.common import error_responses
from fleetwatch.server.schemas.evictions import (
    AckBody,
    ApproveBody,
    AuditPublic,
    EvictionDetail,
    EvictionPublic,
    EvictionsPublic,
    RejectBody,
    ReturnBody,
    State,
)
from fleetwatch.server.schemas.fields import INT64_MAX, RowId, Text

__all__ = ["router"]

router = APIRouter(tags=["evictions"])

_CHANGE_ERRORS = error_responses(
    404,
    described={
        409: "Another scheduler holds the lease, or the eviction's state does not allow this"
    },
)


_WAIT_DESCRIPTION = (
    "Long-poll: seconds (0 to 60) to hold the request while nothing matches. The answer comes "
    "at once when an eviction matches, else as soon as one is created or changes to match (on "
    "any replica), else after `wait` seconds with an empty list (200). 0 (the default) answers "
    "at once. Example: `state=pending&wait=30` waits for something to drain; "
    "`state=pending&state=returned&changed_after=<cursor>&wait=30` is what the scheduler adapters "
    "wait on: a new drain or a return, whichever comes first."
)
_CHANGED_AFTER_DESCRIPTION = (
    "Only evictions whose state changed after this cursor (the `cursor` of an earlier answer). "
    "With `wait`, the long-poll answers on the next change to a listed state instead of at once "
    "for evictions already in it."
)


def _public(row: Row[Any]) -> EvictionPublic:
    return EvictionPublic.model_validate(row, from_attributes=True)


@router.get(
    "/evictions",
    response_model=EvictionsPublic,
    summary="Evictions, newest first; state=pending is what to drain now",
)
async def read_evictions(
    request: Request,
    db: DatabaseDep,
    _token: ReadAuth,
    state: Annotated[
        list[State] | None,
        Query(description="only this state; repeat it for several (state=pending&state=returned)"),
    ] = None,
    node: Annotated[Text | None, Query(description="only this node")] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
    wait: Annotated[float, Query(ge=0, le=60, description=_WAIT_DESCRIPTION)] = 0,
    changed_after: Annotated[
        int | None, Query(ge=0, le=INT64_MAX, description=_CHANGED_AFTER_DESCRIPTION)
    ] = None,
) -> EvictionsPublic:
    """With ``wait``, the request holds no database connection and no worker thread while it
    waits; it ends early when the client goes away or the server shuts down."""
    watch: EvictionWatch | None = getattr(request.app.state, "eviction_watch", None)
    found, cursor = await long_poll(
        watch,
        lambda: run_in_threadpool(_matching, db, state, node, changed_after, limit),
        wait_s=min(wait, request.app.state.settings.long_poll_max_s),
        gone=request.is_disconnected,
    )
    return EvictionsPublic(count=len(found), data=found, cursor=cursor)


def _matching(
    db: Database,
    states: Sequence[str] | None,
    node: str | None,
    changed_after: int | None,
    limit: int,
) -> tuple[list[EvictionPublic], int]:
    with db.read() as conn:
        # The cursor first: whatever it covers was committed before the list is read.
        cursor = eviction_cursor(conn)
        found = list_evictions(
            conn, states=states, node=node, changed_after=changed_after, limit=limit
        )
    return [_public(row) for row in found], cursor


@router.get(
    "/evictions/{eviction_id}",
    response_model=EvictionDetail,
    responses=error_responses(404),
    summary="One eviction with its evidence and audit trail",
)
def read_eviction(eviction_id: RowId, db: DatabaseDep, _token: ReadAuth) -> EvictionDetail:
    with db.read() as conn:
        row, trail = get_eviction(conn, eviction_id)
    return EvictionDetail(
        **_public(row).model_dump(),
        audit=[AuditPublic.model_validate(a, from_attributes=True) for a in trail],
    )


@router.post(
    "/evictions/{eviction_id}/ack",
    response_model=EvictionPublic,
    responses=_CHANGE_ERRORS,
    summary="Claim a pending eviction for lease_s seconds",
)
def ack(
    eviction_id: RowId,
    db: DatabaseDep,
    token: SchedulerAuth,
    body: Annotated[AckBody | None, Body()] = None,
) -> EvictionPublic:
    """409 while another scheduler holds an unexpired lease. Acking again as the same scheduler
    renews the lease; an expired lease may be taken over."""
    lease_s = (body or AckBody()).lease_s
    with db.write() as conn:
        changed = ack_eviction(conn, eviction_id, claimer=token.name, lease_s=lease_s, now=utcnow())
    return _public(changed)


@router.post(
    "/evictions/{eviction_id}/complete",
    response_model=EvictionPublic,
    responses=_CHANGE_ERRORS,
    summary="The claimer drained the node",
)
def complete(eviction_id: RowId, db: DatabaseDep, token: SchedulerAuth) -> EvictionPublic:
    with db.write() as conn:
        changed = complete_eviction(conn, eviction_id, claimer=token.name, now=utcnow())
    return _public(changed)


@router.post(
    "/evictions/{eviction_id}/reject",
    response_model=EvictionPublic,
    responses=_CHANGE_ERRORS,
    summary="Refuse the drain, with a reason",
)
def reject(
    eviction_id: RowId, body: RejectBody, db: DatabaseDep, token: SchedulerAuth
) -> EvictionPublic:
    with db.write() as conn:
        changed = reject_eviction(
            conn, eviction_id, actor=token.name, reason=body.reason, now=utcnow()
        )
    return _public(changed)


@router.post(
    "/evictions/{eviction_id}/approve",
    response_model=EvictionPublic,
    responses=_CHANGE_ERRORS,
    summary="Let a paged (over-budget) or dry-run eviction drain (admin)",
)
def approve(
    eviction_id: RowId, body: ApproveBody, db: DatabaseDep, token: AdminAuth
) -> EvictionPublic:
    """On-call, paged because the fleet drain budget was exhausted, decides this node must drain
    anyway: the eviction becomes pending for the schedulers, and the audit log says who and why."""
    with db.write() as conn:
        changed = approve_eviction(
            conn, eviction_id, actor=token.name, note=body.note, now=utcnow()
        )
    return _public(changed)


_RETURN_ERRORS = error_responses(
    404,
    described={
        409: "The node was evicted for a hardware reason and has no passing validation newer "
        "than the eviction (the message names the failed checks), or its eviction is not "
        "completed"
    },
)


@router.post(
    "/nodes/{name}/return",
    response_model=EvictionPublic,
    responses=_RETURN_ERRORS,
    summary="The drained node is back in service (records returned_at)",
)
def return_to_service(
    name: Text,
    db: DatabaseDep,
    token: SchedulerAuth,
    body: Annotated[ReturnBody | None, Body()] = None,
) -> EvictionPublic:
    """A node evicted for a hardware reason (a rule verdict other than unreachable, or risk)
    returns only after `fleetwatch validate` on it pushed a passing result newer than the
    eviction; until then 409 names what failed. An admin token may force the return with
    `{"force": true, "reason": "..."}`; the audit log records who, why and what was overridden
    (403 for any other token)."""
    body = body or ReturnBody()
    if body.force:
        check_permission(token.scope, Permission.ADMIN)
    with db.write() as conn:
        returned = return_node(
            conn,
            name,
            actor=token.name,
            note=body.note,
            now=utcnow(),
            force_reason=body.reason if body.force else None,
        )
    return _public(returned)
