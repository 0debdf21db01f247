"""One router per resource, all mounted under /v1 by the app factory.

Every /v1 route needs a token and reaches the database, so each documents the errors any of them
may answer (401, 403, 422, 503, 507) with the one error body; a route adds its own (404, 409).
"""

from __future__ import annotations

from fastapi import APIRouter

from fleetwatch.server.routers import (
    advice,
    availability,
    events,
    evictions,
    gpus,
    ingest,
    jobs,
    lifetimes,
    maintenance,
    models,
    nodes,
    notices,
    remote_write,
    reports,
    risk,
    tokens,
    validations,
    webhooks,
)
from fleetwatch.server.schemas.common import error_responses

__all__ = ["api_router", "remote_write_router"]

# Prometheus' path, outside /v1: a remote_write url is ".../api/v1/write" by convention.
remote_write_router = remote_write.router

api_router = APIRouter(prefix="/v1", responses=error_responses(401, 403, 422, 503, 507))
_ROUTERS = (
    ingest,
    nodes,
    gpus,
    events,
    tokens,
    lifetimes,
    risk,
    models,
    jobs,
    notices,
    advice,
    evictions,
    maintenance,
    validations,
    webhooks,
    reports,
    availability,
)
for _module in _ROUTERS:
    api_router.include_router(_module.router)
