"""The operational routes outside ``/v1``: liveness, readiness and the Prometheus ``/metrics``."""

from __future__ import annotations

import gzip
import time
from collections.abc import Callable
from functools import partial
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from sqlalchemy import text

from fleetwatch.config import ServerSettings
from fleetwatch.server.auth import Permission
from fleetwatch.server.db.migrate import current_revision, head_revision
from fleetwatch.server.db.session import Database
from fleetwatch.server.deps import require
from fleetwatch.server.judge.assessor import Assessor
from fleetwatch.server.metrics.pages import default_page, shard_page
from fleetwatch.server.metrics.shards import MAX_SHARDS, shard_from_query
from fleetwatch.server.runtime.leader import LeaderElector
from fleetwatch.server.runtime.metric_families import ServerMetrics
from fleetwatch.server.runtime.precedence import NO_PRECEDENCE, Precedence
from fleetwatch.server.schemas.common import error_responses

__all__ = ["add_operational_routes"]


def _render(
    render: Callable[..., str], assessor: Assessor, precedence: Precedence, **kwargs: Any
) -> str:
    """``render`` given the newest snapshot, taken in the render's thread: a process that
    adopts the leader's snapshots only while read decodes the newest one first. Ahead of the
    process's whole-fleet passes (runtime/precedence.py): Prometheus waits on it."""
    with precedence.ahead():
        return render(snapshot=assessor.newest(), **kwargs)


def _timed(render: Callable[[], str], metrics: ServerMetrics, page: str) -> str:
    """``render()``, its wall and thread CPU time counted under ``page``."""
    started, cpu_started = time.perf_counter(), time.thread_time()
    try:
        return render()
    finally:
        metrics.metrics_render_cpu.labels(page=page).inc(time.thread_time() - cpu_started)
        metrics.metrics_render_seconds.labels(page=page).observe(time.perf_counter() - started)


METRICS_DESCRIPTION = """\
Without parameters: the default page, what only FleetWatch knows and alerts read, small at any
fleet size (node state, verdicts, risk, evictions, stragglers, the fleet's Xid counts, ingest and
background jobs). With `shard` and `shards`: the per-GPU series (telemetry, identity, failure
probability, Xid counts) and node detail of the nodes in that shard, `crc32(node name) % shards`;
scrape every shard of one `shards` to have each series once
(dashboards/prometheus/prometheus.yml does).
"""


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
        summary="Prometheus metrics: the fleet's state (default page), or one shard's GPUs",
        description=METRICS_DESCRIPTION,
        response_class=Response,
        dependencies=[Depends(read_auth)] if settings.metrics_require_token else [],
        responses=error_responses(*((401, 403, 422) if settings.metrics_require_token else (422,))),
    )
    async def metrics(
        request: Request,
        shard: Annotated[
            int | None, Query(ge=0, description="Which shard (0 to shards - 1); with shards")
        ] = None,
        shards: Annotated[
            int | None,
            Query(ge=1, le=MAX_SHARDS, description="How many shards the fleet is cut into"),
        ] = None,
    ) -> Response:
        selected = shard_from_query(shard, shards)
        state = request.app.state
        if selected is None:
            prefetch = getattr(state, "page_prefetch", None)  # None: an app without jobs
            if prefetch is not None:
                prefetch.scraped()
            render = partial(default_page, registry=state.registry, availability=state.availability)
        else:
            render = partial(shard_page, selected)
        page = await run_in_threadpool(
            _timed,
            partial(
                _render,
                render,
                state.assessor,
                getattr(state, "precedence", NO_PRECEDENCE),
                fleet=state.fleet,
                db=state.db,
                settings=settings,
            ),
            state.metrics,
            "default" if selected is None else "shard",
        )
        payload = page.encode()
        headers = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        if "gzip" in request.headers.get("accept-encoding", ""):
            # Level 1: speed matters more than the last byte (a shard can be tens of MB).
            payload = await run_in_threadpool(gzip.compress, payload, 1)
            headers["Content-Encoding"] = "gzip"
        return Response(payload, headers=headers)
