"""``fleetwatch inventory``: import historical GPU lifetimes and record endings, straight into the
database (as ``fleetwatch token`` does), without a running server."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TextIO

import click

from fleetwatch.cli.server_cmds import _open_database, database_option
from fleetwatch.errors import FleetWatchError, InvalidInput
from fleetwatch.inventory import (
    TITAN_LOCATION_PATTERN,
    ColumnMap,
    ImportSummary,
    LifetimeRecord,
    parse_utc,
    read_lifetimes,
)

__all__ = ["inventory"]

_SHOW_REJECTED = 10


def _fail(exc: FleetWatchError) -> click.ClickException:
    error = click.ClickException(str(exc))
    error.exit_code = exc.exit_code  # type: ignore[misc]  # click reads it per instance too
    return error


@click.group()
def inventory() -> None:
    """GPU lifetimes: historical imports and operator-recorded failures."""


@inventory.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@database_option
@click.option(
    "--map",
    "mapping",
    multiple=True,
    metavar="FIELD=COLUMN",
    help="Column for a field (serial, location, inserted, removed, event, out); repeatable. "
    "Defaults fit Titan's gc_full.csv: serial=SN inserted=insert removed=remove ...",
)
@click.option(
    "--location-pattern",
    default=TITAN_LOCATION_PATTERN,
    show_default=True,
    help="Regex with named groups for the location; '' keeps locations unparsed.",
)
@click.option("--strict", is_flag=True, help="Store nothing if any row is refused.")
def import_cmd(
    file: Path,
    database_url: str | None,
    mapping: tuple[str, ...],
    location_pattern: str,
    strict: bool,
) -> None:
    """Import lifetimes from a CSV FILE; importing it again stores nothing new."""
    from fleetwatch.server.repo.lifetimes import import_lifetimes

    started = time.monotonic()
    summary = ImportSummary(keep_rejected=1000)
    try:
        columns = ColumnMap.from_pairs(mapping)
        with file.open(encoding="utf-8-sig", newline="") as counting:
            total = max(sum(1 for _ in counting) - 1, 0)
        database = _open_database(database_url)
        try:
            with (
                file.open(encoding="utf-8-sig", newline="") as stream,
                click.progressbar(length=total, label="importing", file=_stderr()) as bar,
            ):

                def advancing(records: Iterator[LifetimeRecord]) -> Iterator[LifetimeRecord]:
                    done = 0
                    for record in records:
                        yield record
                        bar.update(summary.rows - done)
                        done = summary.rows
                    bar.update(summary.rows - done)

                records = read_lifetimes(
                    stream, columns=columns, location_pattern=location_pattern, summary=summary
                )
                with database.write() as conn:
                    counts = import_lifetimes(conn, advancing(records))
                    if strict and summary.rejected_count:
                        raise InvalidInput(
                            f"{summary.rejected_count} of {summary.rows} rows refused; "
                            "--strict given, nothing was stored"
                        )
        finally:
            database.dispose()
    except FleetWatchError as exc:
        _report_rejected(summary)
        raise _fail(exc) from exc
    _report_rejected(summary)
    click.echo(
        f"{file.name}: {summary.rows} rows, {counts.inserted} lifetimes stored, "
        f"{counts.already_stored} already stored, {summary.rejected_count} rejected "
        f"in {time.monotonic() - started:.1f} s"
    )


def _stderr() -> TextIO:
    return sys.stderr  # looked up per call, so CliRunner's captured stream is used


def _report_rejected(summary: ImportSummary) -> None:
    for rejected in summary.rejected[:_SHOW_REJECTED]:
        click.echo(f"line {rejected.line}: {rejected.reason}", err=True)
    if summary.rejected_count > _SHOW_REJECTED:
        click.echo(f"... and {summary.rejected_count - _SHOW_REJECTED} more rejected", err=True)


def _utc_option(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_utc(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an ISO 8601 time", param_hint=name) from None


@inventory.command("record")
@click.argument("serial")
@click.option("--kind", required=True, type=click.Choice(["failure", "repair", "retirement"]))
@click.option("--cause", help="What happened, e.g. 'DBE' or 'Xid 79, fell off the bus'.")
@click.option("--at", "at_text", help="When, ISO 8601 (naive = UTC)  [default now]")
@click.option("--installed-at", "installed_text", help="Stint start, if none is on record.")
@database_option
def record_cmd(
    serial: str,
    kind: str,
    cause: str | None,
    at_text: str | None,
    installed_text: str | None,
    database_url: str | None,
) -> None:
    """End GPU SERIAL's current stint with a failure, repair or retirement."""
    from fleetwatch.server.db.base import utcnow
    from fleetwatch.server.repo.lifetimes import record_lifetime_end

    at = _utc_option(at_text, "--at") or utcnow()
    installed_at = _utc_option(installed_text, "--installed-at")
    try:
        database = _open_database(database_url)
        try:
            with database.write() as conn:
                lifetime = record_lifetime_end(
                    conn,
                    serial=serial,
                    kind=kind,  # type: ignore[arg-type]  # click.Choice checked it
                    at=at,
                    cause=cause,
                    installed_at=installed_at,
                    evidence={"recorded_by": "cli", "recorded_at": utcnow().isoformat()},
                )
        finally:
            database.dispose()
    except FleetWatchError as exc:
        raise _fail(exc) from exc
    click.echo(
        f"lifetime {lifetime.id} of {serial}: {lifetime.end_kind} at "
        f"{lifetime.removed_at:%Y-%m-%d %H:%M:%S}Z ({lifetime.source})"
    )
