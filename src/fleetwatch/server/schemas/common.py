"""Bodies shared by every resource: errors and the ingest acknowledgement."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

__all__ = ["ErrorDetail", "ErrorResponse", "IngestAccepted", "IngestResponse"]


class ErrorDetail(BaseModel):
    loc: list[str | int] = Field(
        description="Where the problem is, e.g. ['body', 'samples', 3, 'ts']"
    )
    msg: str


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
        error=message, detail=[ErrorDetail(**d) for d in (detail or [])]
    ).model_dump()
