"""``POST /v1/ingest``: wire format v1, acknowledged only after commit."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import zlib
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from fleetwatch.config import ServerSettings
from fleetwatch.errors import InvalidInput, PayloadTooLarge, UnsupportedMediaType
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.rules.xid import XidCatalog
from fleetwatch.server.auth import TokenInfo
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.deps import IngestAuth
from fleetwatch.server.errors import status_for
from fleetwatch.server.ingest.batch_decoder import decode_batch, ingest_limits
from fleetwatch.server.ingest.batch_structs import BatchStruct
from fleetwatch.server.ingest.group_store import GroupedBatch, is_routine
from fleetwatch.server.ingest.group_writer import GroupWriter
from fleetwatch.server.ingest.store import IngestResult, store_batch
from fleetwatch.server.node_binding import check_speaks_for
from fleetwatch.server.routers.urgent_lane import catalog_of, is_urgent, thresholds_of, wake_urgent
from fleetwatch.server.runtime.metric_families import ServerMetrics
from fleetwatch.server.schemas.common import ErrorResponse, IngestAccepted, IngestResponse
from fleetwatch.telemetry import BATCH_EXAMPLE

__all__ = ["read_limited", "router"]

logger = logging.getLogger(__name__)

router = APIRouter(tags=["ingest"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in (
        (401, "No token, or an unknown or revoked one"),
        (
            403,
            "The token's scope may not ingest (needs agent or admin), or the caller may not "
            "speak for the batch's node (a token bound to other nodes; under mutual TLS, a "
            "client certificate naming another node)",
        ),
        (
            409,
            "The batch_id was stored before with different content, or a GPU uuid of the batch "
            "is reported by another node right now (cloned UUID)",
        ),
        (413, "Body larger than the limit (default 8 MiB, after decompression)"),
        (415, "Content-Type is not application/json, or an unsupported Content-Encoding"),
        (422, "Invalid batch: each problem names its field; nothing of the batch was stored"),
    )
}

_BODY_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "One node's readings since its last push. May be sent with "
        "`Content-Encoding: gzip`.",
        "content": {
            "application/json": {
                "schema": {"$ref": "#/components/schemas/Batch"},
                "examples": {"one_gpu_one_xid": {"value": BATCH_EXAMPLE}},
            }
        },
    }
}


async def read_limited(request: Request, limit: int) -> bytes:
    """The body as sent, refusing more than ``limit`` bytes (declared or streamed)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def _read_body(request: Request, limit: int) -> bytes:
    """The decompressed body, refusing more than ``limit`` bytes before or after gunzip."""
    body = await read_limited(request, limit)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding != "gzip":
        raise UnsupportedMediaType(
            f"unsupported Content-Encoding {encoding!r}; send identity or gzip",
            [{"loc": ["header", "content-encoding"], "msg": "must be gzip or identity"}],
        )
    inflater = zlib.decompressobj(wbits=31)
    try:
        # max_length bounds the output, so a small gzip bomb cannot inflate past the limit.
        body = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidInput(
            f"body is not valid gzip: {exc}", [{"loc": ["body"], "msg": "invalid gzip data"}]
        ) from exc
    if len(body) > limit or inflater.unconsumed_tail:
        raise PayloadTooLarge(limit)
    # Without eof the CRC was never checked (truncated stream); unused_data would be dropped.
    if not inflater.eof or inflater.unused_data:
        raise InvalidInput(
            "body is not valid gzip: the stream is truncated or followed by extra bytes",
            [{"loc": ["body"], "msg": "invalid gzip data"}],
        )
    return body


def _check_content_type(request: Request) -> None:
    content_type = request.headers.get("content-type", "application/json").split(";")[0].strip()
    if content_type.lower() != "application/json":
        raise UnsupportedMediaType(
            f"Content-Type must be application/json, got {content_type!r}",
            [{"loc": ["header", "content-type"], "msg": "must be application/json"}],
        )


# A body up to this size is decoded on the event loop (a 48-sample push takes a few hundred
# microseconds): a thread hop would cost about as much. A larger one is decoded in a thread.
_DECODE_INLINE_BYTES = 256 * 1024


def _decode(body: bytes, settings: ServerSettings) -> tuple[BatchStruct, str]:
    """The validated batch and the SHA-256 of its body (what a replay is compared by)."""
    batch = decode_batch(body, ingest_limits(settings, utcnow()))
    return batch, hashlib.sha256(body).hexdigest()


def _store(
    batch: BatchStruct,
    digest: str,
    settings: ServerSettings,
    db: Database,
    slots: threading.Semaphore,
    thresholds: HealthThresholds | None = None,
) -> IngestResult:
    with slots:  # validation runs freely; only the transaction waits for a slot
        return store_batch(
            db,
            batch,
            content_sha256=digest,
            now=utcnow(),
            live_intervals=settings.unreachable_after_intervals,
            thresholds=thresholds,
        )


def _answer(
    batch: BatchStruct, result: IngestResult, catalog: XidCatalog
) -> tuple[IngestResponse, str | None]:
    """The response, and the batch's node when it holds an urgent event (else None)."""
    logger.debug(
        "batch %s from %s: %d samples, %d events, duplicate=%s",
        batch.batch_id,
        batch.node.name,
        result.samples,
        result.events,
        result.duplicate,
    )
    # A port gone down or flapping is derived here from the port readings, not sent as an event.
    urgent = not result.duplicate and (
        result.urgent_ports or any(is_urgent(e, catalog) for e in batch.events)
    )
    response = IngestResponse(
        accepted=IngestAccepted(samples=result.samples, events=result.events),
        duplicate=result.duplicate,
    )
    return response, batch.node.name if urgent else None


async def _decode_and_store(
    request: Request, body: bytes, token: TokenInfo
) -> tuple[IngestResponse, str | None]:
    settings: ServerSettings = request.app.state.settings
    if len(body) <= _DECODE_INLINE_BYTES:
        batch, digest = _decode(body, settings)
    else:
        batch, digest = await run_in_threadpool(_decode, body, settings)
    check_speaks_for(request.scope, token, (batch.node.name,))
    result: IngestResult | None = None
    writer: GroupWriter | None = getattr(request.app.state, "group_writer", None)
    if writer is not None and is_routine(batch):
        result = await writer.store(GroupedBatch(batch, digest))
    if result is None:
        result = await run_in_threadpool(
            _store,
            batch,
            digest,
            settings,
            request.app.state.db,
            request.app.state.ingest_slots,
            thresholds_of(request),
        )
    return _answer(batch, result, catalog_of(request))


@router.post(
    "/ingest",
    response_model=IngestResponse,
    responses=_ERRORS,
    openapi_extra=_BODY_DOC,
    summary="Push a batch of GPU samples and events (wire format v1)",
)
async def ingest(request: Request, token: IngestAuth) -> IngestResponse:
    """Store one node's batch atomically. Answers 200 only after the batch is committed; a
    replayed ``batch_id`` answers 200 with ``duplicate: true`` and stores nothing new."""
    started = time.perf_counter()
    metrics: ServerMetrics = request.app.state.metrics
    settings: ServerSettings = request.app.state.settings
    try:
        _check_content_type(request)
        body = await _read_body(request, settings.max_body_bytes)
        response, urgent_node = await _decode_and_store(request, body, token)
        if urgent_node is not None:
            await wake_urgent(request, [urgent_node])
    except InvalidInput as exc:
        metrics.ingest_batches.labels("rejected").inc()
        metrics.ingest_rejections.labels(str(status_for(exc))).inc()
        raise
    metrics.ingest_batches.labels("duplicate" if response.duplicate else "accepted").inc()
    metrics.ingest_samples.inc(response.accepted.samples)
    metrics.ingest_events.inc(response.accepted.events)
    metrics.ingest_latency.observe(time.perf_counter() - started)
    return response
