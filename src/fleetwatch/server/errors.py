"""One table from domain errors to HTTP statuses, and the handlers that apply it.

Every error body has the same shape, documented in the OpenAPI as ``ErrorResponse``:
``{"error": "...", "detail": [{"loc": [...], "msg": "...", "type": "..."}]}``.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from fleetwatch.errors import (
    BatchConflict,
    Conflict,
    FleetWatchError,
    Forbidden,
    InvalidInput,
    MalformedBody,
    NodeForbidden,
    NotFound,
    PayloadTooLarge,
    SchemaOutOfDate,
    StorageError,
    StorageFull,
    Unauthenticated,
    UnsupportedMediaType,
)
from fleetwatch.server.schemas.common import error_body

__all__ = ["ERROR_STATUS", "install_error_handlers"]

logger = logging.getLogger(__name__)

# Most specific first: the first isinstance match wins.
ERROR_STATUS: tuple[tuple[type[FleetWatchError], int], ...] = (
    (Unauthenticated, 401),
    (Forbidden, 403),
    (NodeForbidden, 403),
    (NotFound, 404),
    (BatchConflict, 409),
    (Conflict, 409),
    (PayloadTooLarge, 413),
    (UnsupportedMediaType, 415),
    (MalformedBody, 400),
    (InvalidInput, 422),
    (SchemaOutOfDate, 503),
    (StorageFull, 507),
    (StorageError, 503),
)


def status_for(exc: FleetWatchError) -> int:
    for kind, status in ERROR_STATUS:
        if isinstance(exc, kind):
            return status
    return 500


async def _domain_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FleetWatchError)
    status = status_for(exc)
    detail = exc.detail if isinstance(exc, InvalidInput) else []
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    if status >= 500:
        logger.error("%s %s failed: %s", request.method, request.url.path, exc)
    return JSONResponse(error_body(str(exc), detail), status_code=status, headers=headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    detail = [
        {
            "loc": [str(p) if not isinstance(p, int) else p for p in err["loc"]],
            "msg": str(err["msg"]).removeprefix("Value error, "),
            "type": str(err["type"]),
        }
        for err in exc.errors()
    ]
    first = detail[0] if detail else {"loc": ["request"], "msg": "invalid"}
    where = ".".join(str(p) for p in first["loc"])
    more = f" (and {len(detail) - 1} more)" if len(detail) > 1 else ""
    message = f"invalid request: {where}: {first['msg']}{more}"
    return JSONResponse(error_body(message, detail), status_code=422)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and isinstance(exc.__cause__, UnicodeDecodeError):
        # FastAPI answers a JSON body that is not UTF-8 with a bare 400; every other malformed
        # body is a 422 naming it, so this one is too.
        detail = [{"loc": ["body"], "msg": "not UTF-8", "type": "json_invalid"}]
        return JSONResponse(error_body("invalid request: body: not UTF-8", detail), 422)
    return JSONResponse(
        error_body(str(exc.detail)), status_code=exc.status_code, headers=exc.headers
    )


async def _client_gone(request: Request, exc: Exception) -> Response:
    """The client closed its connection before its request's body was all in (an agent killed
    in the middle of a push, a body cut at ``http_body_timeout_s``). Nothing failed here and
    nobody is left to answer: counted and told in a throttled line, where uvicorn would log an
    ERROR and a 70-line traceback for each."""
    assert isinstance(exc, ClientDisconnect)
    guard = getattr(request.app.state, "connection_guard", None)
    if guard is not None:
        guard.aborted(_route_label(request), request.client)
    # Never sent (uvicorn drops what is sent on a closed connection); 499 as nginx logs it.
    return Response(status_code=499)


def _route_label(request: Request) -> str:
    """The matched route's path template: one label per route, never one per address."""
    template = getattr(request.scope.get("route"), "path", None)
    if template is None:
        return "other"
    path = str(request.scope.get("path", ""))
    # Newer FastAPI keeps an included router's route without the router's prefix ("/ingest");
    # a route without parameters matched only its own address, prefix included ("/v1/ingest").
    if "{" not in template and path.endswith(template):
        return path
    return str(template)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(FleetWatchError, _domain_error)
    app.add_exception_handler(ClientDisconnect, _client_gone)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
