"""The app factory. Nothing is built at import: ``create_app(settings)`` builds everything.

Run with ``uvicorn --factory fleetwatch.server.app:create_app`` (settings from the environment) or
``fleetwatch server``.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from sqlalchemy import text

import fleetwatch
from fleetwatch.config import ServerSettings, load_server_settings
from fleetwatch.errors import ConfigError, SchemaOutOfDate, StorageFull
from fleetwatch.metrics import ServerMetrics
from fleetwatch.reports.schedule import WeeklyReportJob
from fleetwatch.server.alerting import Alerter
from fleetwatch.server.auth import Permission
from fleetwatch.server.background import (
    Assessor,
    RollupJob,
    Waker,
    load_rules,
    periodic,
    run_lifecycle,
)
from fleetwatch.server.db.migrate import current_revision, head_revision, upgrade
from fleetwatch.server.db.session import Database, make_engine, sqlite_directory
from fleetwatch.server.db.storage import StorageCollector, StorageHealth
from fleetwatch.server.deps import require
from fleetwatch.server.docs import add_offline_docs
from fleetwatch.server.errors import install_error_handlers
from fleetwatch.server.eviction_exposition import render_evictions
from fleetwatch.server.eviction_watch import EvictionWatch
from fleetwatch.server.exposition import FleetExposition
from fleetwatch.server.isolation import ItemGuard
from fleetwatch.server.leader import LeaderElector, single_process_problem
from fleetwatch.server.liveness import Liveness
from fleetwatch.server.outbox import OutboxWorker
from fleetwatch.server.page import router as page_router
from fleetwatch.server.planner import EvictionPlanner
from fleetwatch.server.refit import Refitter
from fleetwatch.server.risk_exposition import render_risk
from fleetwatch.server.routers import api_router
from fleetwatch.server.schemas.common import error_responses
from fleetwatch.server.secret_box import SecretBox, load_secret_box, reseal_secrets
from fleetwatch.server.straggler_detector import StragglerDetector, render_stragglers
from fleetwatch.telemetry import Batch

__all__ = ["create_app", "prepare_database"]

logger = logging.getLogger(__name__)

DESCRIPTION = """\
FleetWatch keeps a GPU fleet healthy. Agents push telemetry to `POST /v1/ingest` (wire format v1);
schedulers and people read the fleet through the other endpoints and `/metrics`.

Every endpoint but `/healthz`, `/readyz` and these docs needs `Authorization: Bearer <token>`
(`fleetwatch token create --scope agent|read|scheduler|admin`).
"""


def prepare_database(db: Database, settings: ServerSettings) -> None:
    """Migrate the embedded SQLite file; insist that PostgreSQL was migrated by an operator."""
    if settings.is_sqlite:
        upgrade(db.engine)
        return
    current, head = current_revision(db.engine), head_revision()
    if current != head:
        raise SchemaOutOfDate(current, head)


def _seal_plaintext_secrets(db: Database, box: SecretBox) -> None:
    """Webhook secrets stored before encryption at rest get encrypted now."""
    try:
        sealed, left = reseal_secrets(db, box, plaintext_only=True)
    except StorageFull:
        logger.warning("plain-text webhook secrets not encrypted yet: storage full")
        return
    if sealed:
        logger.info("encrypted %d webhook secret(s) stored in plain text", sealed)
    if left:
        logger.error("%d webhook secret(s) could not be encrypted (see above)", left)


def _openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        # The ingest route reads its body itself (to bound and gunzip it before parsing), so
        # the wire format's schema is added here for the docs.
        batch = Batch.model_json_schema(ref_template="#/components/schemas/{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(batch.pop("$defs", {}))
        components["Batch"] = batch
        app.openapi_schema = schema
    return app.openapi_schema


def create_app(
    settings: ServerSettings | None = None, *, clock: Callable[[], datetime] | None = None
) -> FastAPI:
    """``clock`` (UTC now; tests inject one) is the time node liveness is read at: this
    process's start and every reader's now (``/v1/nodes``, the page, ``/metrics``)."""
    settings = settings or load_server_settings()
    now = clock or (lambda: datetime.now(UTC))
    problem = single_process_problem(settings)
    if problem is not None:
        raise ConfigError(problem)
    if settings.insecure_no_auth:
        logger.warning(
            "authentication is OFF (--insecure-no-auth): anyone who can reach this port is admin"
        )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings)
        storage = StorageHealth(
            sqlite_directory(engine),
            hold_s=settings.storage_full_hold_s,
            min_free_bytes=settings.storage_min_free_bytes,
        )
        db = Database(engine, storage=storage)
        prepare_database(db, settings)
        # Wakes long-polls of GET /v1/evictions?wait= on an eviction change from any replica.
        app.state.eviction_watch = eviction_watch = EvictionWatch(engine)
        eviction_watch.start()
        app.state.secret_box = secret_box = load_secret_box(settings)
        _seal_plaintext_secrets(db, secret_box)
        # Silence before this moment was not heard by this process: a node's unreachable clock
        # starts here at the earliest (server.liveness), so a restart marks no node unreachable.
        # The one reading of it: the planner, the alerter and every reader of node state.
        app.state.liveness = liveness = Liveness(
            settings.unreachable_after_intervals, heard_since=now(), clock=now
        )
        heard_since = liveness.heard_since
        registry = CollectorRegistry()
        registry.register(StorageCollector(storage))
        app.state.db = db
        app.state.settings = settings
        app.state.registry = registry
        app.state.metrics = ServerMetrics(registry)
        app.state.ingest_slots = threading.BoundedSemaphore(settings.max_concurrent_ingest)
        app.state.fleet = FleetExposition(
            db,
            ttl_s=settings.metrics_cache_ttl_s,
            liveness=liveness,
        )
        catalog, thresholds = load_rules(settings)
        metrics: ServerMetrics = app.state.metrics

        def guard(job: str) -> ItemGuard:
            return ItemGuard(job, metrics.background_item_errors.labels(job=job))

        def failures(job: str) -> Counter:
            return metrics.background_job_failures.labels(job=job)

        def runs(job: str) -> Counter:
            return metrics.background_runs.labels(job=job)

        app.state.assessor = Assessor(db, settings, catalog, thresholds, guard=guard("assessment"))
        app.state.planner = EvictionPlanner(
            db, settings, app.state.assessor, guard=guard("planner"), heard_since=heard_since
        )
        app.state.stragglers = StragglerDetector(db, settings, guard=guard("stragglers"))
        app.state.waker = waker = Waker()
        waker.bind()
        app.state.outbox_waker = outbox_waker = Waker()
        outbox_waker.bind()
        app.state.alerter = Alerter(
            db, settings, lambda: app.state.assessor.latest, on_queued=outbox_waker.poke,
            guard=guard("alerts"), heard_since=heard_since,
        )  # fmt: skip
        app.state.outbox = OutboxWorker(db, settings, guard=guard("webhooks"), secrets=secret_box)
        app.state.refitter = refitter = Refitter(db, settings, failures=failures("refit"))
        # Write jobs run on the one leader only; every process keeps its own assessment fresh.
        leader_tasks: list[asyncio.Task[None]] = []

        def start_leading() -> None:
            jobs = [
                ("rollups", settings.rollup_interval_s,
                 RollupJob(db, catalog, guard=guard("rollups"))),
                ("lifecycle", settings.lifecycle_interval_s,
                 functools.partial(run_lifecycle, db, settings, catalog, guard=guard("lifecycle"))),
                ("planner", settings.planner_interval_s, app.state.planner.run_once),
                ("stragglers", settings.straggler_interval_s, app.state.stragglers.run_once),
                ("alerts", settings.alert_interval_s, app.state.alerter.run_once),
                ("weekly_report", 600.0,
                 WeeklyReportJob(db, settings, catalog, guard=guard("weekly_report"))),
            ]  # fmt: skip
            leader_tasks.extend(
                asyncio.create_task(
                    _lead(app, *job, failures=failures(job[0]), runs=runs(job[0])), name=job[0]
                )
                for job in jobs
            )
            deliver = ("webhooks", settings.webhook_delivery_interval_s, app.state.outbox.run_once,
                       outbox_waker, failures("webhooks"), runs("webhooks"))  # fmt: skip
            leader_tasks.append(asyncio.create_task(periodic(*deliver), name="webhooks"))
            if settings.refit_interval_s > 0:
                schedule = refitter.run_schedule(settings.refit_interval_s)
                leader_tasks.append(asyncio.create_task(schedule, name="refit"))
            waker.poke()  # a new leader judges and plans at once, not one interval later

        def stop_leading() -> None:
            # At once: a pass already in its worker thread finishes its transaction, no new one
            # starts (the write jobs are idempotent and claim their rows in the database).
            for task in leader_tasks:
                task.cancel()
            leader_tasks.clear()

        def leadership_changed(leading: bool) -> None:
            (start_leading if leading else stop_leading)()

        app.state.elector = elector = None
        if settings.background_jobs and settings.role != "api":
            app.state.elector = elector = LeaderElector.for_engine(
                engine, on_change=leadership_changed, on_wake=waker.poke
            )
        _register_leader_gauge(registry, settings, lambda: elector)
        tasks: list[asyncio.Task[None]] = []
        if settings.background_jobs:
            # Each assessment is followed, on the leader, by a plan and the alerts; a fatal Xid
            # or a lost GPU arriving (here or, through NOTIFY, on any replica) wakes them at once.
            judge = ("assessment", settings.assess_interval_s, _judge_and_plan(app), waker,
                     failures("assessment"), runs("assessment"))  # fmt: skip
            tasks.append(asyncio.create_task(periodic(*judge), name="assessment"))
        if elector is not None:
            elector.start()
        logger.info(
            "FleetWatch %s serving on %s", fleetwatch.__version__, db.engine.url.render_as_string()
        )
        try:
            yield
        finally:
            eviction_watch.stop()
            if elector is not None:
                await asyncio.to_thread(elector.stop)
            tasks.extend(leader_tasks)
            stop_leading()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.to_thread(refitter.wait, 60.0)  # a refit in flight ends before the engine
            await asyncio.to_thread(app.state.outbox.close)
            db.dispose()

    app = FastAPI(
        title="FleetWatch",
        version=fleetwatch.__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # served by add_offline_docs, with assets from this server, not a CDN
        redoc_url=None,
    )
    app.state.settings = settings
    add_offline_docs(app)
    install_error_handlers(app)
    app.include_router(api_router)
    app.include_router(page_router)  # the fleet page at /, outside /v1
    _add_operational_routes(app, settings)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


async def _lead(app: FastAPI, name: str, interval_s: float, job: Callable[[], Any],
                failures: Counter, runs: Counter) -> None:  # fmt: skip
    """Run a leader's job on its timer; the planner and the alerts first wait for a fresh
    assessment, as a standby's snapshot may predate what the old leader acted on (acting on it
    would cancel evictions and resolve alerts whose condition still holds)."""
    while name in ("planner", "alerts"):
        try:
            await asyncio.to_thread(app.state.assessor.run_once)
            break
        except Exception:
            failures.inc()
            logger.exception("%s: no fresh assessment yet; retry in %.0f s", name, interval_s)
            await asyncio.sleep(interval_s)
    await periodic(name, interval_s, job, failures=failures, runs=runs)


def _judge_and_plan(app: FastAPI) -> Callable[[], Any]:
    def run() -> None:
        app.state.assessor.run_once()
        elector: LeaderElector | None = app.state.elector
        if elector is None or not elector.is_leader:
            return  # a replica's snapshot answers its requests; the leader plans and alerts
        # The planner and the alerts have their own loops too: one failing must not keep the
        # other from acting on this assessment (each failure is logged and counted there).
        for job, step in (("planner", app.state.planner), ("alerts", app.state.alerter)):
            try:
                step.run_once()  # a fatal Xid drains and pages without waiting for their ticks
            except Exception:
                app.state.metrics.background_job_failures.labels(job=job).inc()
                logger.exception("background job %s (after the assessment) failed", job)

    return run


def _register_leader_gauge(
    registry: CollectorRegistry,
    settings: ServerSettings,
    elector: Callable[[], LeaderElector | None],
) -> None:
    gauge = Gauge(
        "fleetwatch_leader",
        "1 while this process is the leader that runs the write jobs, else 0",
        ["role"],
        registry=registry,
    )

    def leading() -> float:
        current = elector()
        return 1.0 if current is not None and current.is_leader else 0.0

    gauge.labels(role=settings.role).set_function(leading)


def _add_operational_routes(app: FastAPI, settings: ServerSettings) -> None:
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
