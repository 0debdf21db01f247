"""``fleetwatch report weekly``: the weekly fleet report as JSON, HTML or PDF."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click

from fleetwatch.cli.server_cmds import database_option
from fleetwatch.config import load_server_settings

__all__ = ["report"]


@click.group()
def report() -> None:
    """Fleet reports."""


@report.command()
@click.option("--week", help="ISO week, e.g. 2026-W48 (default: the last complete week)")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "html", "pdf"]),
    default="json",
    show_default=True,
)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Default: stdout")
@database_option
def weekly(week: str | None, fmt: str, out: Path | None, database_url: str | None) -> None:
    """MTBF, MTTR, availability, goodput, drains and calibration for one ISO week (UTC)."""
    from fleetwatch.reports.weeks import IsoWeek, parse_week
    from fleetwatch.server.db.session import Database, make_engine
    from fleetwatch.server.repo.report_rows import compute_weekly

    iso = parse_week(week) if week else IsoWeek.last_complete(datetime.now(UTC), timedelta(0))
    settings = load_server_settings(database_url=database_url)
    db = Database(make_engine(settings))
    try:
        with db.read() as conn:
            built = compute_weekly(conn, iso, settings=settings, now=datetime.now(UTC))
    finally:
        db.dispose()
    body: bytes
    if fmt == "json":
        body = (json.dumps(built.to_dict(), indent=2) + "\n").encode()
    else:
        from fleetwatch.reports.render import render_html, render_pdf

        html = render_html(built)
        body = html.encode() if fmt == "html" else render_pdf(built, html)
    if out is None:
        sys.stdout.buffer.write(body)
    else:
        out.write_bytes(body)
        click.echo(f"wrote {fmt} report for {iso} to {out}", err=True)
