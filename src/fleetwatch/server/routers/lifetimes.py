"""GPU lifetimes: import historical records (admin), record an ending (admin), list (read).

An import stores every valid row in one transaction and reports the refused ones by line; with
``strict=true`` a single refused row refuses the whole file and nothing is stored. A file whose
header lacks a mapped column, or a bad pattern or mapping, is refused whole (422).
"""

from __future__ import annotations

import io
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from fleetwatch.errors import InvalidInput, PayloadTooLarge, UnsupportedMediaType
from fleetwatch.inventory import (
    TITAN_LOCATION_PATTERN,
    ColumnMap,
    ImportSummary,
    compile_location_pattern,
    read_lifetimes,
)
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.deps import AdminAuth, DatabaseDep, ReadAuth
from fleetwatch.server.repo.lifetimes import import_lifetimes, list_lifetimes, record_lifetime_end
from fleetwatch.server.schemas.common import error_responses
from fleetwatch.server.schemas.fields import AwareInstant, Text
from fleetwatch.server.schemas.lifetimes import LifetimePublic, LifetimesPublic

__all__ = ["router"]

router = APIRouter(tags=["lifetimes"])

IMPORT_LIMIT_BYTES = 64 * 1024 * 1024
_CSV_TYPES = {"text/csv", "application/csv", "text/plain"}


class RejectedLinePublic(BaseModel):
    line: int = Field(description="Line number in the file; the header is line 1")
    reason: str


class ImportResult(BaseModel):
    rows: int = Field(description="Data rows read")
    accepted: int = Field(description="Rows that passed validation")
    inserted: int = Field(description="Lifetimes newly stored")
    already_stored: int = Field(description="Valid rows skipped: same serial and install time")
    rejected: int
    first_rejected: list[RejectedLinePublic]


class LifetimeEnd(BaseModel):
    kind: Literal["failure", "repair", "retirement"]
    cause: Text | None = Field(default=None, max_length=4000, examples=["DBE"])
    at: AwareInstant | None = Field(default=None, description="When it ended; default now")
    installed_at: AwareInstant | None = Field(
        default=None, description="Start of the stint, when no open lifetime is on record"
    )


_IMPORT_ERRORS = error_responses(
    described={
        413: f"Body larger than {IMPORT_LIMIT_BYTES} bytes",
        415: "Content-Type is not text/csv",
        422: "Bad header, mapping or pattern, a NUL in the file, or a refused row with "
        "strict=true; nothing stored",
    }
)


async def _read_csv(request: Request) -> str:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type not in _CSV_TYPES:
        raise UnsupportedMediaType(
            f"Content-Type must be text/csv, got {content_type or 'none'!r}",
            [{"loc": ["header", "content-type"], "msg": "must be text/csv"}],
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > IMPORT_LIMIT_BYTES:
            raise PayloadTooLarge(IMPORT_LIMIT_BYTES)
        chunks.append(chunk)
    try:
        text = b"".join(chunks).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            f"the CSV is not UTF-8: {exc}", [{"loc": ["body"], "msg": "not UTF-8"}]
        ) from exc
    if "\x00" in text:  # no database column may hold one; refuse the file, naming the line
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise InvalidInput(
            f"the CSV holds a NUL character (\\u0000) on line {line}; nothing stored",
            [{"loc": ["body", "line", line], "msg": "NUL character"}],
        )
    return text


def _import(
    db: Database, body: str, columns: ColumnMap, pattern: str | None, strict: bool
) -> ImportResult:
    summary = ImportSummary(keep_rejected=100)
    records = read_lifetimes(
        io.StringIO(body, newline=""), columns=columns, location_pattern=pattern, summary=summary
    )
    with db.write() as conn:
        counts = import_lifetimes(conn, records)
        if strict and summary.rejected_count:
            first = summary.rejected[0]
            raise InvalidInput(
                f"{summary.rejected_count} of {summary.rows} rows refused (first: line "
                f"{first.line}: {first.reason}); strict import, nothing was stored",
                [{"loc": ["body", "line", r.line], "msg": r.reason} for r in summary.rejected],
            )
    return ImportResult(
        rows=summary.rows,
        accepted=summary.accepted,
        inserted=counts.inserted,
        already_stored=counts.already_stored,
        rejected=summary.rejected_count,
        first_rejected=[RejectedLinePublic(line=r.line, reason=r.reason) for r in summary.rejected],
    )


@router.post(
    "/inventory/import",
    response_model=ImportResult,
    responses=_IMPORT_ERRORS,
    summary="Import historical GPU lifetimes from CSV",
    openapi_extra={
        "requestBody": {"required": True, "content": {"text/csv": {"schema": {"type": "string"}}}}
    },
)
async def post_inventory_import(
    request: Request,
    db: DatabaseDep,
    _token: AdminAuth,
    map: Annotated[
        list[Text],
        Query(
            description="FIELD=COLUMN overrides, e.g. serial=SN; fields: serial, location, "
            "inserted, removed, event, out (empty COLUMN drops an optional one)"
        ),
    ] = [],  # noqa: B006  (FastAPI copies defaults per request)
    location_pattern: Annotated[
        Text, Query(description="Regex with named groups; empty to keep locations unparsed")
    ] = TITAN_LOCATION_PATTERN,
    strict: Annotated[bool, Query(description="Refuse the whole file if any row is refused")] = (
        False
    ),
) -> ImportResult:
    """Store each valid row once; re-importing the same file stores nothing new."""
    columns = ColumnMap.from_pairs(map)
    compile_location_pattern(location_pattern)  # a bad regex is refused before the body is read
    body = await _read_csv(request)
    return await run_in_threadpool(_import, db, body, columns, location_pattern, strict)


@router.post(
    "/lifetimes/{serial}/events",
    response_model=LifetimePublic,
    responses=error_responses(described={404: "No open lifetime or GPU with this serial"}),
    summary="Record a failure, repair or retirement",
)
def post_lifetime_event(
    serial: Text, body: LifetimeEnd, db: DatabaseDep, token: AdminAuth
) -> LifetimePublic:
    """Close the serial's open stint (or write one) with the operator's verdict."""
    at = body.at if body.at is not None else utcnow()
    installed = body.installed_at
    with db.write() as conn:
        lifetime = record_lifetime_end(
            conn,
            serial=serial,
            kind=body.kind,
            at=at,
            cause=body.cause,
            installed_at=installed,
            evidence={"recorded_by": token.name, "recorded_at": utcnow().isoformat()},
        )
    return LifetimePublic.model_validate(lifetime, from_attributes=True)


@router.get("/lifetimes", response_model=LifetimesPublic, summary="List GPU lifetimes")
def get_lifetimes(
    db: DatabaseDep,
    _token: ReadAuth,
    serial: Text | None = None,
    end_kind: Annotated[
        Literal["failure", "repair", "retirement"] | None, Query(description="Only this ending")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
) -> LifetimesPublic:
    """Lifetimes by serial, then install time."""
    with db.read() as conn:
        found = list_lifetimes(conn, serial=serial, end_kind=end_kind, limit=limit)
    return LifetimesPublic(
        data=[LifetimePublic.model_validate(row, from_attributes=True) for row in found],
        count=len(found),
    )
