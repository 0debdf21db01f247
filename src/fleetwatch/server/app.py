"""The app factory. Nothing is built at import: ``create_app(settings)`` builds everything.

Run with ``uvicorn --factory fleetwatch.server.app:create_app`` (settings from the environment) or
``fleetwatch server``. The background jobs are listed in :mod:`fleetwatch.server.background`,
the ``/healthz``, ``/readyz`` and ``/metrics`` routes live in :mod:`fleetwatch.server.operations`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from prometheus_client import CollectorRegistry

import fleetwatch
from fleetwatch.config import ServerSettings, load_server_settings
from fleetwatch.errors import ConfigError, StorageFull
from fleetwatch.server.access_log import log_accepted_pushes
from fleetwatch.server.act.eviction_watch import EvictionWatch
from fleetwatch.server.act.notices import CHANNEL as NOTICE_CHANNEL
from fleetwatch.server.background import BackgroundJobs
from fleetwatch.server.concepts.liveness import Liveness
from fleetwatch.server.db.migrate import prepare_database
from fleetwatch.server.db.secret_box import SecretBox, load_secret_box, reseal_secrets
from fleetwatch.server.db.session import Database, make_engine, sqlite_directory
from fleetwatch.server.db.storage import StorageCollector, StorageHealth
from fleetwatch.server.docs import add_offline_docs
from fleetwatch.server.errors import install_error_handlers
from fleetwatch.server.http_guard import (
    LIFESPAN_KEY,
    ConnectionGuard,
    ConnectionLimits,
    open_files_limit,
)
from fleetwatch.server.ingest.group_writer import GroupWriter
from fleetwatch.server.metrics.availability_exposition import AvailabilityExposition
from fleetwatch.server.metrics.exposition import FleetExposition
from fleetwatch.server.metrics.page_prefetch import PagePrefetch
from fleetwatch.server.node_page import router as node_page_router
from fleetwatch.server.operations import add_operational_routes
from fleetwatch.server.page import router as page_router
from fleetwatch.server.process_tuning import tune_garbage_collector
from fleetwatch.server.routers import api_router, remote_write_router
from fleetwatch.server.runbook_pages import router as runbook_router
from fleetwatch.server.runtime.leader import single_process_problem
from fleetwatch.server.runtime.metric_families import ServerMetrics
from fleetwatch.server.token_cache import TokenCache
from fleetwatch.telemetry import Batch

__all__ = ["create_app"]

logger = logging.getLogger(__name__)

DESCRIPTION = """\
FleetWatch keeps a GPU fleet healthy. Agents push telemetry to `POST /v1/ingest` (wire format v1);
schedulers and people read the fleet through the other endpoints and `/metrics`.

Every endpoint but `/healthz`, `/readyz`, these docs and the runbooks (`/runbooks/`) needs
`Authorization: Bearer <token>` (`fleetwatch token create --scope agent|read|scheduler|admin`).
"""


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


def _group_writer(
    db: Database, settings: ServerSettings, metrics: ServerMetrics
) -> GroupWriter | None:
    """PostgreSQL's group commit of routine pushes (SQLite has one writer: nothing to share)."""
    if db.is_sqlite or settings.ingest_group_max_batches == 0:
        return None
    writer = GroupWriter(
        db,
        max_batches=settings.ingest_group_max_batches,
        linger_s=settings.ingest_group_linger_ms / 1000,
        on_group=metrics.count_group,
    )
    writer.start()
    return writer


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
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        # Everything started is stopped on every way out, a failed start included (a
        # database not migrated, say): in the reverse order of starting, so each watcher
        # restores the signal handler it found, and the engine's pooled connections close.
        async with AsyncExitStack() as stack:
            tune_garbage_collector(settings)
            log_accepted_pushes(settings.log_accepted_pushes)
            engine = make_engine(settings)
            stack.callback(engine.dispose)
            storage = StorageHealth(
                sqlite_directory(engine),
                hold_s=settings.storage_full_hold_s,
                min_free_bytes=settings.storage_min_free_bytes,
            )
            db = Database(engine, storage=storage)
            prepare_database(db.engine, settings)
            # Wakes long-polls of GET /v1/evictions?wait= on an eviction change from any replica.
            app.state.eviction_watch = eviction_watch = EvictionWatch(engine)
            eviction_watch.start()
            stack.callback(eviction_watch.stop)
            # Wakes long-polls of GET /v1/jobs/{id}/notices?wait= on a new notice (act/notices.py).
            app.state.notice_watch = notice_watch = EvictionWatch(engine, NOTICE_CHANNEL)
            notice_watch.start()
            stack.callback(notice_watch.stop)
            app.state.secret_box = secret_box = load_secret_box(settings)
            _seal_plaintext_secrets(db, secret_box)
            # Silence before this moment was not heard by this process: a node's unreachable clock
            # starts here at the earliest (server.concepts.liveness), so a restart marks no node
            # unreachable. The one reading of it: the planner, the alerter and every reader of node
            # state.
            heard_since = now()
            app.state.liveness = liveness = Liveness(
                settings.unreachable_after_intervals,
                heard_since=heard_since,
                clock=now,
                lag_max_s=settings.unreachable_lag_grace_max_s,
            )
            registry = CollectorRegistry()
            registry.register(StorageCollector(storage))
            metrics = ServerMetrics(registry)
            app.state.db = db
            app.state.settings = settings
            app.state.registry = registry
            app.state.metrics = metrics
            app.state.connection_guard = guard = ConnectionGuard(
                ConnectionLimits.from_settings(settings, open_files_limit()), metrics
            )
            app.state.ingest_slots = threading.BoundedSemaphore(settings.max_concurrent_ingest)
            app.state.group_writer = group_writer = _group_writer(db, settings, metrics)
            if group_writer is not None:
                stack.callback(group_writer.stop)
            app.state.token_cache = TokenCache(settings.token_cache_ttl_s)
            app.state.fleet = FleetExposition(
                db,
                ttl_s=settings.metrics_cache_ttl_s,
                liveness=liveness,
                storm_pct=settings.unreachable_storm_pct,
                storm_min_nodes=settings.unreachable_storm_min_nodes,
            )
            app.state.availability = AvailabilityExposition(db, settings)
            stack.callback(app.state.availability.close)
            jobs = BackgroundJobs(
                db, settings, metrics=metrics, secrets=secret_box, heard_since=heard_since
            )
            jobs.notices.on_change = notice_watch.notify  # this process's long-polls (SQLite too)
            # The routes use some of the jobs' objects: the newest assessment, a refit on request,
            # the wakers of the assessment and the webhook delivery.
            app.state.assessor = jobs.assessor
            app.state.planner = jobs.planner
            app.state.notices = jobs.notices
            app.state.stragglers = jobs.stragglers
            app.state.alerter = jobs.alerter
            app.state.outbox = jobs.outbox
            app.state.refitter = jobs.refitter
            app.state.waker = jobs.waker
            app.state.urgent = jobs.urgent
            app.state.precedence = jobs.precedence  # /metrics renders ahead of the fleet's passes
            app.state.is_leader = lambda: jobs.is_leader
            app.state.outbox_waker = jobs.outbox_waker
            metrics.track_leader(settings.role, lambda: jobs.is_leader)
            page_prefetch = PagePrefetch(
                lambda: jobs.assessor.latest,
                settings.risk_horizons_h,
                refreshers=[app.state.availability.refresh],
                warm_while=lambda: jobs.is_leader,
            )
            page_prefetch.start()
            stack.callback(page_prefetch.stop)
            app.state.page_prefetch = page_prefetch
            stack.push_async_callback(jobs.stop)
            jobs.start(engine)
            app.state.elector = jobs.elector
            logger.info(
                "FleetWatch %s serving on %s",
                fleetwatch.__version__,
                db.engine.url.render_as_string(),
            )
            # The lifespan state reaches each connection's protocol (server/http_protocol.py).
            yield {LIFESPAN_KEY: guard}

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
    app.include_router(remote_write_router)  # POST /api/v1/write, Prometheus' path
    app.include_router(page_router)  # the fleet page at /, outside /v1
    app.include_router(runbook_router)  # /runbooks/<name>, what alerts link to
    app.include_router(node_page_router)  # a page per node at /nodes/<name>
    add_operational_routes(app, settings)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app
