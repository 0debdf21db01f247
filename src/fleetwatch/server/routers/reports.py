"""The weekly fleet report as JSON, an HTML page or a PDF (read scope)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, Response

from fleetwatch.config import ServerSettings
from fleetwatch.reports.weeks import IsoWeek, parse_week
from fleetwatch.server.csp import report_headers
from fleetwatch.server.db.session import Database
from fleetwatch.server.deps import DatabaseDep, ReadAuth, SettingsDep
from fleetwatch.server.repo.report_rows import compute_weekly
from fleetwatch.server.schemas.common import error_responses
from fleetwatch.server.schemas.fields import Text

__all__ = ["router"]

router = APIRouter(prefix="/reports", tags=["reports"])

Format = Literal["json", "html", "pdf"]


def _build(db: Database, settings: ServerSettings, week: IsoWeek, fmt: Format) -> Response:
    with db.read() as conn:
        report = compute_weekly(conn, week, settings=settings, now=datetime.now(UTC))
    if fmt == "json":
        return JSONResponse(report.to_dict())
    from fleetwatch.reports.render import render_html, render_pdf

    html = render_html(report)
    if fmt == "html":
        return HTMLResponse(html, headers=report_headers(html))
    headers = {"Content-Disposition": f'inline; filename="fleetwatch-{week}.pdf"'}
    return Response(render_pdf(report, html), media_type="application/pdf", headers=headers)


@router.get(
    "/weekly",
    summary="The weekly fleet report: MTBF, MTTR, availability, goodput, drains, calibration",
    response_class=Response,
    responses={
        200: {
            "content": {"application/json": {}, "text/html": {}, "application/pdf": {}},
            "description": "The report in the requested format",
        },
        **error_responses(
            described={422: "Not an ISO week such as 2026-W48 between 1970 and 9998"}
        ),
    },
)
async def get_weekly_report(
    db: DatabaseDep,
    settings: SettingsDep,
    _token: ReadAuth,
    week: Annotated[
        Text | None, Query(description="ISO week, e.g. 2026-W48; default the last complete one")
    ] = None,
    format: Annotated[Format, Query(description="json, html or pdf")] = "json",
) -> Response:
    """Monday 00:00 to Monday 00:00 UTC; figures are defined in docs/telling.md."""
    return await weekly_report_response(db, settings, week, format)


async def weekly_report_response(
    db: Database, settings: ServerSettings, week: str | None, fmt: Format
) -> Response:
    """The report for ``week`` (default: the last complete one) in ``fmt``; 422 on a bad week."""
    iso = parse_week(week) if week else IsoWeek.last_complete(datetime.now(UTC), timedelta(0))
    return await run_in_threadpool(_build, db, settings, iso, fmt)
