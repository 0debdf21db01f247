"""Bodies shared by every resource: errors and the ingest acknowledgement."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

__all__ = [
    "ERROR_DESCRIPTIONS",
    "ErrorDetail",
    "ErrorResponse",
    "IngestAccepted",
    "IngestResponse",
    "error_body",
    "error_responses",
]


class ErrorDetail(BaseModel):
    loc: list[str | int] = Field(
        description="Where the problem is, e.g. ['body', 'samples', 3, 'ts']"
    )
    msg: str = Field(description="What is wrong there, for a person")
    type: str = Field(
        description="What kind of problem, for a program: pydantic's error type for a request "
        "that does not parse (missing, int_parsing, ...), else value_error",
    )


class ErrorResponse(BaseModel):
    error: str = Field(description="What went wrong, in one sentence")
    detail: list[ErrorDetail] = Field(default_factory=list)


class IngestAccepted(BaseModel):
    samples: int
    events: int


class IngestResponse(BaseModel):
    accepted: IngestAccepted
    duplicate: bool = Field(
        description="True when this batch_id was stored before; nothing new stored"
    )


def error_body(message: str, detail: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return ErrorResponse(
        error=message, detail=[ErrorDetail(**{"type": "value_error", **d}) for d in (detail or [])]
    ).model_dump()


# What each error status means anywhere in the API; a route may say more for its own case.
ERROR_DESCRIPTIONS: dict[int, str] = {
    401: "No token, or an unknown or revoked one",
    403: "The token's scope may not do this",
    404: "No such resource",
    409: "Conflicts with the resource's current state",
    413: "Body too large",
    415: "Unsupported Content-Type or Content-Encoding",
    422: "Invalid request: each detail item names a parameter or field and the reason",
    503: "The database is unreachable or its schema is out of date",
    507: "The server's storage is full; nothing was stored",
}


def error_responses(
    *codes: int, described: dict[int, str] | None = None
) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` documenting ``codes`` with the :class:`ErrorResponse` body.

    ``described`` adds statuses with this route's own description, e.g.
    ``error_responses(404, described={409: "A refit is already running"})``.
    """
    own = described or {}
    return {
        code: {"model": ErrorResponse, "description": own.get(code, ERROR_DESCRIPTIONS[code])}
        for code in (*codes, *own)
    }
