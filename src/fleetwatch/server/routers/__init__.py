"""One router per resource, all mounted under /v1 by the app factory."""

from __future__ import annotations

from fastapi import APIRouter

from fleetwatch.server.routers import (
    advice,
    events,
    evictions,
    gpus,
    ingest,
    jobs,
    lifetimes,
    models,
    nodes,
    reports,
    risk,
    tokens,
    webhooks,
)

__all__ = ["api_router"]

api_router = APIRouter(prefix="/v1")
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
    advice,
    evictions,
    webhooks,
    reports,
)
for _module in _ROUTERS:
    api_router.include_router(_module.router)
