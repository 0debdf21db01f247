"""Maintenance windows: planned downtime over nodes or a label selector (scheduler or admin).

While a window covers a node, its silence, reboots and resets are planned: no unreachable alert,
no eviction, no failure recorded; ``/v1/nodes`` and the fleet page show it ``maintenance``. A
fatal hardware error inside a window still counts (``server.concepts.planned``). Reading needs read
scope; opening and ending need scheduler scope (admin tokens have it), and the token's name is
recorded as who opened or ended the window.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from fleetwatch.server.deps import DatabaseDep, LivenessDep, ReadAuth, SchedulerAuth
from fleetwatch.server.repo.maintenance import (
    Window,
    create_window,
    end_window,
    get_window,
    list_windows,
)
from fleetwatch.server.schemas.common import error_responses
from fleetwatch.server.schemas.fields import RowId, Text
from fleetwatch.server.schemas.maintenance import (
    MaintenanceCreate,
    MaintenancePublic,
    MaintenancesPublic,
    MaintenanceState,
)

__all__ = ["router"]

router = APIRouter(prefix="/maintenance", tags=["maintenance"])


def _public(window: Window) -> MaintenancePublic:
    return MaintenancePublic.model_validate(window, from_attributes=True)


@router.post(
    "",
    response_model=MaintenancePublic,
    status_code=201,
    responses=error_responses(described={409: "A window with this key is still open"}),
    summary="Open a maintenance window over nodes or a label selector",
)
def open_window(
    body: MaintenanceCreate, db: DatabaseDep, liveness: LivenessDep, token: SchedulerAuth
) -> MaintenancePublic:
    """Exactly one of ``nodes`` and ``selector``; no ``ends_at`` means until ended. 422 names
    the field: both or neither of nodes and selector, a selector that is not
    ``label=value[,...]``, ``ends_at`` not after ``starts_at``, an empty or too long reason."""
    with db.write() as conn:
        made = create_window(conn, body, actor=token.name, now=liveness.clock())
    return _public(made)


@router.get(
    "",
    response_model=MaintenancesPublic,
    summary="Maintenance windows, newest first",
)
def read_windows(
    db: DatabaseDep,
    liveness: LivenessDep,
    _token: ReadAuth,
    state: Annotated[
        list[MaintenanceState] | None,
        Query(description="only this state; repeat it for several (state=active&state=upcoming)"),
    ] = None,
    node: Annotated[Text | None, Query(description="only windows covering this node")] = None,
    key_prefix: Annotated[
        Text | None, Query(max_length=256, description="only windows whose key starts so")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> MaintenancesPublic:
    with db.read() as conn:
        found = list_windows(
            conn,
            now=liveness.clock(),
            states=state,
            node=node,
            key_prefix=key_prefix,
            limit=limit,
        )
    return MaintenancesPublic(count=len(found), data=[_public(w) for w in found])


@router.get(
    "/{window_id}",
    response_model=MaintenancePublic,
    responses=error_responses(404),
    summary="One maintenance window",
)
def read_window(
    window_id: RowId, db: DatabaseDep, liveness: LivenessDep, _token: ReadAuth
) -> MaintenancePublic:
    with db.read() as conn:
        found = get_window(conn, window_id, now=liveness.clock())
    return _public(found)


@router.delete(
    "/{window_id}",
    response_model=MaintenancePublic,
    responses=error_responses(404, described={409: "The window has ended already"}),
    summary="End a maintenance window now (cancel it, if it has not begun)",
)
def close_window(
    window_id: RowId, db: DatabaseDep, liveness: LivenessDep, token: SchedulerAuth
) -> MaintenancePublic:
    """Nothing is deleted: the window records ``ended_at`` and ``ended_by``. Its nodes' silence
    counts again from now, after their usual unreachable intervals."""
    with db.write() as conn:
        ended = end_window(conn, window_id, actor=token.name, now=liveness.clock())
    return _public(ended)
