"""``POST /api/v1/write``: Prometheus remote write 1.0 in, read as dcgm-exporter's series.

Answers as Prometheus expects of a receiver: 204 once what the request says is committed
(staged, and its Xid events stored); 400/401/403/413/415 for a request no retry can fix, which
Prometheus drops; 503 or 507 only when a retry can succeed (the database away, the disk full).
A series FleetWatch does not read is no error: it is counted
(``fleetwatch_remote_write_series_total{outcome="unused"}``), so that a Prometheus sending
everything it scrapes is not refused. Neither is a value out of the wire format's bounds: the
value is dropped and counted (``..._samples_total{outcome="invalid"}``), the rest stored; a 4xx
would make Prometheus drop the whole request.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.exc import InterfaceError, OperationalError

from fleetwatch.config import ServerSettings
from fleetwatch.errors import FleetWatchError, MalformedBody, StorageError, UnsupportedMediaType
from fleetwatch.remote_write.node_exporter import is_node_exporter_metric
from fleetwatch.remote_write.wire import RemoteWriteError, decode_write_request, series_of
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.deps import IngestAuth
from fleetwatch.server.errors import status_for
from fleetwatch.server.ingest.remote_write_readings import RequestReadings, limits_for, read_request
from fleetwatch.server.ingest.remote_write_store import RemoteWriteStored, store_request
from fleetwatch.server.node_binding import check_speaks_for
from fleetwatch.server.routers.ingest import read_limited
from fleetwatch.server.routers.urgent_lane import catalog_of, is_urgent, thresholds_of, wake_urgent
from fleetwatch.server.runtime.metric_families import ServerMetrics
from fleetwatch.server.schemas.common import ErrorResponse

__all__ = ["router"]

logger = logging.getLogger(__name__)

router = APIRouter(tags=["ingest"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in (
        (400, "Not a snappy-compressed protobuf WriteRequest (Prometheus drops it)"),
        (401, "No token, or an unknown or revoked one"),
        (403, "The token may not ingest, or is bound to nodes the request's series are not of"),
        (413, "Body larger than the limit (default 8 MiB, compressed or not)"),
        (415, "Not remote write 1.0: Content-Type application/x-protobuf, Content-Encoding snappy"),
        (503, "The database is away: Prometheus retries"),
        (507, "The database's disk is full: Prometheus retries"),
    )
}

_BODY_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "A Prometheus remote write 1.0 WriteRequest, protobuf, snappy "
        "block-compressed (what Prometheus' `remote_write` sends).",
        "content": {"application/x-protobuf": {"schema": {"type": "string", "format": "binary"}}},
    }
}


def _check_headers(request: Request) -> None:
    content_type = request.headers.get("content-type", "").split(";")
    media = content_type[0].strip().lower()
    proto = next((p.split("=", 1)[1].strip() for p in content_type[1:] if "proto=" in p), None)
    if media != "application/x-protobuf" or proto not in (None, "prometheus.WriteRequest"):
        raise UnsupportedMediaType(
            "send Prometheus remote write 1.0: Content-Type application/x-protobuf (a "
            f"prometheus.WriteRequest), got {request.headers.get('content-type')!r}",
            [{"loc": ["header", "content-type"], "msg": "must be application/x-protobuf"}],
        )
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding != "snappy":
        raise UnsupportedMediaType(
            f"remote write bodies are snappy-compressed: Content-Encoding must be snappy, got "
            f"{encoding or 'none'!r}",
            [{"loc": ["header", "content-encoding"], "msg": "must be snappy"}],
        )


def _read(body: bytes, settings: ServerSettings) -> RequestReadings:
    try:
        request = decode_write_request(body, max_bytes=settings.max_body_bytes)
    except RemoteWriteError as exc:
        raise MalformedBody(str(exc), [{"loc": ["body"], "msg": str(exc)}]) from exc
    return read_request(
        series_of(request), limits_for(settings, utcnow()), is_node_series=is_node_exporter_metric
    )


def _store(
    readings: RequestReadings, request: Request, thresholds: HealthThresholds | None
) -> RemoteWriteStored:
    app = request.app
    try:
        with app.state.ingest_slots:
            return store_request(app.state.db, readings, app.state.settings, utcnow(), thresholds)
    except (OperationalError, InterfaceError) as exc:
        # The database is away or restarting: 503 tells Prometheus to keep the samples and retry.
        raise StorageError(f"database unavailable, retry: {exc.orig or exc}") from exc


@router.post(
    "/api/v1/write",
    status_code=204,
    response_class=Response,
    responses=_ERRORS,
    openapi_extra=_BODY_DOC,
    summary="Prometheus remote write 1.0: dcgm-exporter and node_exporter series in",
)
async def remote_write(request: Request, token: IngestAuth) -> Response:
    """Stage the request's dcgm-exporter series as GPU readings; 204 once committed. Each GPU
    scrape is stored as one sample once all its pieces came (``remote_write_settle_s``)."""
    metrics: ServerMetrics = request.app.state.metrics
    settings: ServerSettings = request.app.state.settings
    try:
        _check_headers(request)
        body = await read_limited(request, settings.max_body_bytes)
        readings = await run_in_threadpool(_read, body, settings)
        nodes = sorted({p.node for p in readings.pieces} | {x.node for x in readings.xids})
        check_speaks_for(request.scope, token, nodes)
        stored = await run_in_threadpool(_store, readings, request, thresholds_of(request))
    except FleetWatchError as exc:
        metrics.remote_write_requests.labels(str(status_for(exc))).inc()
        raise
    for outcome, count in readings.series.items():
        metrics.remote_write_series.labels(outcome).inc(count)
    for outcome, count in (readings.samples + stored.samples).items():
        metrics.remote_write_samples.labels(outcome).inc(count)
    catalog = catalog_of(request)
    await wake_urgent(
        request, sorted({node for node, event in stored.events if is_urgent(event, catalog)})
    )
    metrics.remote_write_requests.labels("204").inc()
    return Response(status_code=204)
