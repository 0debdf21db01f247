"""Node validations: ``fleetwatch validate`` pushes its result here; the return gate reads it.

Pushing needs ingest scope (the node's agent token, which may be bound to it:
:mod:`fleetwatch.server.node_binding`), reading needs read scope. The result is
stored as sent, with the verdict computed here (no check failed, at least one passed) and the
server's receive time, which is what ``POST /v1/nodes/{name}/return`` compares with the eviction.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from fleetwatch.errors import InvalidInput
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.deps import DatabaseDep, IngestAuth, ReadAuth
from fleetwatch.server.node_binding import check_speaks_for
from fleetwatch.server.repo.nodes import node_id_of
from fleetwatch.server.repo.validations import list_validations, store_validation
from fleetwatch.server.schemas.common import error_responses
from fleetwatch.server.schemas.fields import Text
from fleetwatch.server.schemas.validations import ValidationPublic, ValidationsPublic
from fleetwatch.validation_wire import ValidationReport

__all__ = ["router"]

router = APIRouter(prefix="/nodes", tags=["validations"])


@router.post(
    "/{name}/validations",
    response_model=ValidationPublic,
    status_code=201,
    summary="Store a node's validation result (agent token)",
)
def push_validation(
    name: Text, report: ValidationReport, request: Request, db: DatabaseDep, token: IngestAuth
) -> ValidationPublic:
    """What `fleetwatch validate` sends. A passing result newer than a hardware eviction lets
    the node return (`POST /v1/nodes/{name}/return`); a failing one names what failed. 403 when
    the caller may not speak for the node (a token bound to others, a client certificate
    naming another)."""
    check_speaks_for(request.scope, token, (name,))
    if report.node != name:
        raise InvalidInput(
            f"the result is for node {report.node!r}, pushed to node {name!r}",
            [{"loc": ["body", "node"], "msg": f"must be {name!r}, the node in the path"}],
        )
    with db.write() as conn:
        stored = store_validation(conn, report, pushed_by=token.name, now=utcnow())
    return ValidationPublic.model_validate(stored, from_attributes=True)


@router.get(
    "/{name}/validations",
    response_model=ValidationsPublic,
    responses=error_responses(404),
    summary="A node's validation results, newest first",
)
def read_validations(
    name: Text,
    db: DatabaseDep,
    _token: ReadAuth,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
) -> ValidationsPublic:
    """404 for a node the server has neither heard from nor received a validation of."""
    with db.read() as conn:
        found = list_validations(conn, name, limit=limit)
        if not found:
            node_id_of(conn, name=name)
    return ValidationsPublic(
        count=len(found),
        data=[ValidationPublic.model_validate(v, from_attributes=True) for v in found],
    )
