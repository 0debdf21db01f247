"""The operational routes outside ``/v1``: liveness, readiness and the Prometheus ``/metrics``."""

from __future__ import annotations

import gzip

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from prometheus_client import generate_latest
from sqlalchemy import text

from fleetwatch.config import ServerSettings
from fleetwatch.server.auth import Permission
from fleetwatch.server.db.migrate import current_revision, head_revision
from fleetwatch.server.db.session import Database
from fleetwatch.server.deps import require
from fleetwatch.server.jobs.leader import LeaderElector
from fleetwatch.server.judge.straggler_detector import render_stragglers
from fleetwatch.server.metrics.eviction_exposition import render_evictions
from fleetwatch.server.metrics.exposition import FleetExposition
from fleetwatch.server.metrics.risk_exposition import render_risk
from fleetwatch.server.schemas.common import error_responses

__all__ = ["add_operational_routes"]


def add_operational_routes(app: FastAPI, settings: ServerSettings) -> None:
    read_auth = require(Permission.READ)

    @app.get("/healthz", tags=["operations"], summary="Liveness: the process answers")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["operations"],
        summary="Readiness: the database answers, is migrated and its storage is not full",
    )
    def readyz(request: Request) -> JSONResponse:
        db: Database = request.app.state.db
        try:
            with db.read() as conn:
                conn.execute(text("SELECT 1"))
            current, head = current_revision(db.engine), head_revision()
        except Exception as exc:  # noqa: BLE001 - any failure here means "not ready", with the reason
            return JSONResponse({"status": "unavailable", "reason": str(exc)}, status_code=503)
        if current != head:
            return JSONResponse(
                {"status": "unavailable", "reason": f"schema at {current}, needs {head}"},
                status_code=503,
            )
        full = db.storage.problem()
        if full is not None:
            return JSONResponse({"status": "unavailable", "reason": full}, status_code=503)
        elector: LeaderElector | None = getattr(request.app.state, "elector", None)
        leader = elector is not None and elector.is_leader
        return JSONResponse(
            {"status": "ready", "schema": current, "role": settings.role, "leader": leader}
        )

    @app.get(
        "/metrics",
        tags=["operations"],
        summary="Prometheus metrics: per-GPU latest state, node liveness, Xid counts, ingest",
        response_class=Response,
        dependencies=[Depends(read_auth)] if settings.metrics_require_token else [],
        responses=error_responses(401, 403) if settings.metrics_require_token else None,
    )
    async def metrics(request: Request) -> Response:
        fleet: FleetExposition = request.app.state.fleet
        body = await run_in_threadpool(fleet.render)
        body += await run_in_threadpool(
            render_risk, request.app.state.assessor.latest, settings.risk_horizons_h
        )
        body += await run_in_threadpool(render_stragglers, request.app.state.db)
        body += await run_in_threadpool(
            render_evictions, request.app.state.db, settings.drain_budget_pct
        )
        payload = (generate_latest(request.app.state.registry).decode() + body).encode()
        headers = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        if "gzip" in request.headers.get("accept-encoding", ""):
            # Level 1: a 10,000-GPU page is tens of MB; speed matters more than the last byte.
            payload = await run_in_threadpool(gzip.compress, payload, 1)
            headers["Content-Encoding"] = "gzip"
        return Response(payload, headers=headers)
