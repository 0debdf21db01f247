"""Risk-model versions: list and inspect them (read), start a refit (admin)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from sqlalchemy import Row

from fleetwatch.server.deps import AdminAuth, DatabaseDep, ReadAuth
from fleetwatch.server.repo.models import get_model, list_models, serving_version
from fleetwatch.server.schemas.common import error_body, error_responses
from fleetwatch.server.schemas.fields import RowId
from fleetwatch.server.schemas.models import ModelVersionPublic, ModelVersionsPublic, RefitAccepted
from fleetwatch.server.upkeep.refit import Refitter

__all__ = ["router"]

router = APIRouter(prefix="/models", tags=["models"])


@router.get("", response_model=ModelVersionsPublic, summary="List risk-model versions")
def get_models(
    db: DatabaseDep, _token: ReadAuth, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> ModelVersionsPublic:
    """Versions newest first (promoted, rejected and failed) with their metrics or error, their
    held-out evaluation, and which one serves."""
    with db.read() as conn:
        found = list_models(conn, limit)
        serving = serving_version(conn)
    return ModelVersionsPublic(
        data=[_public(row, serving) for row in found], count=len(found), serving=serving
    )


@router.get(
    "/{version}",
    response_model=ModelVersionPublic,
    responses=error_responses(described={404: "No such version"}),
    summary="One risk-model version",
)
def get_model_version(version: RowId, db: DatabaseDep, _token: ReadAuth) -> ModelVersionPublic:
    """The version's trigger, status, metrics, error and held-out evaluation."""
    with db.read() as conn:
        found = get_model(conn, version)
        serving = serving_version(conn)
    return _public(found, serving)


def _public(row: Row[Any], serving: int | None) -> ModelVersionPublic:
    return ModelVersionPublic.model_validate({**row._mapping, "serving": row.version == serving})


@router.post(
    "/refit",
    status_code=202,
    response_model=RefitAccepted,
    responses=error_responses(described={409: "A refit is already running"}),
    summary="Refit the risk models now, in the background",
)
async def post_refit(request: Request, _token: AdminAuth) -> RefitAccepted | JSONResponse:
    """Starts a refit and returns at once; the new version appears in GET /v1/models."""
    refitter: Refitter = request.app.state.refitter
    if not refitter.request("manual"):
        body = error_body(
            "a refit is already running; wait for its version to appear in GET /v1/models",
            [{"loc": ["refit"], "msg": "already running"}],
        )
        return JSONResponse(body, status_code=409)
    return RefitAccepted(accepted=True)
