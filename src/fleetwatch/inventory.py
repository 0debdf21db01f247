"""Historical GPU lifetime records from a CSV file: one row per stint of a serial in a location.

The defaults read Titan's ``gc_full.csv`` (``SN,location,insert,remove,duration,out,event``);
:class:`ColumnMap` renames the columns for other sites. Each data row becomes a
:class:`LifetimeRecord` or a :class:`RejectedLine` naming its line number; nothing is dropped
silently. :class:`ImportSummary` counts both.

How a row ends its stint (``end_kind``):

* a non-empty ``event`` -> ``failure``, with ``cause`` the event text (Titan: ``DBE``, ``OTB``);
* no ``removed`` time -> still in service: ``end_kind`` and ``removed_at`` null;
* ``removed`` without an event -> ``retirement``, unless the optional ``out`` column exists and
  says false: then the unit did not leave service (it moved, or was still installed when the
  record was taken; Titan writes its collection date there), so ``end_kind`` stays null and
  ``removed_at`` keeps the time the file gives.

Location parts matched by the pattern's named groups go to ``evidence["location_parts"]`` (digits
as integers), with ``evidence["out"]`` when that column was read. Timestamps are ISO 8601; naive
ones are taken as UTC and offsets are converted to UTC.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any, Literal

from fleetwatch.errors import InvalidInput

__all__ = [
    "TITAN_LOCATION_PATTERN",
    "ColumnMap",
    "EndKind",
    "ImportSummary",
    "LifetimeRecord",
    "RejectedLine",
    "compile_location_pattern",
    "location_columns",
    "location_covariates",
    "parse_utc",
    "read_lifetimes",
]

TITAN_LOCATION_PATTERN = r"c(?P<col>\d+)-(?P<row>\d+)c(?P<cage>\d+)s(?P<slot>\d+)n(?P<node>\d+)"

EndKind = Literal["failure", "repair", "retirement"]

_TRUE = {"true", "t", "yes", "y", "1"}
_FALSE = {"false", "f", "no", "n", "0"}
_MAX_SERIAL = 64
_MAX_LOCATION = 128


@dataclass(frozen=True)
class ColumnMap:
    """Which CSV column holds each field; ``location``, ``event`` and ``out`` may be None."""

    serial: str = "SN"
    location: str | None = "location"
    inserted: str = "insert"
    removed: str = "remove"
    event: str | None = "event"
    out: str | None = "out"

    @classmethod
    def from_pairs(cls, pairs: Iterable[str]) -> ColumnMap:
        """Overrides like ``["serial=serial_number", "out="]``; an empty value drops an optional
        column. Raises :class:`InvalidInput` naming the bad pair."""
        names = {f.name for f in fields(cls)}
        updates: dict[str, str | None] = {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or key not in names:
                raise InvalidInput(
                    f"bad column mapping {pair!r}; write FIELD=COLUMN with FIELD one of "
                    f"{', '.join(sorted(names))}",
                    [{"loc": ["query", "map"], "msg": f"bad mapping {pair!r}"}],
                )
            if not value and key in ("serial", "inserted", "removed"):
                raise InvalidInput(
                    f"column mapping {pair!r}: {key} is required and needs a column name",
                    [{"loc": ["query", "map"], "msg": f"{key} needs a column"}],
                )
            updates[key] = value or None
        return replace(cls(), **updates)  # type: ignore[arg-type]

    def required(self) -> dict[str, str]:
        return {"serial": self.serial, "inserted": self.inserted, "removed": self.removed}


@dataclass(frozen=True)
class LifetimeRecord:
    line: int
    serial: str
    location: str | None
    installed_at: datetime
    removed_at: datetime | None
    end_kind: EndKind | None
    cause: str | None
    evidence: dict[str, Any] | None


@dataclass(frozen=True)
class RejectedLine:
    line: int
    reason: str


@dataclass
class ImportSummary:
    """Counts as the reader goes; ``rejected`` keeps the first ``keep_rejected`` lines."""

    keep_rejected: int = 100
    rows: int = 0
    accepted: int = 0
    rejected_count: int = 0
    rejected: list[RejectedLine] = field(default_factory=list)

    def reject(self, line: int, reason: str) -> None:
        self.rejected_count += 1
        if len(self.rejected) < self.keep_rejected:
            self.rejected.append(RejectedLine(line, reason))


def compile_location_pattern(pattern: str | None) -> re.Pattern[str] | None:
    """The compiled pattern, None for an empty one; :class:`InvalidInput` for a bad regex."""
    if not pattern:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise InvalidInput(
            f"location pattern {pattern!r} is not a regular expression: {exc}",
            [{"loc": ["query", "location_pattern"], "msg": str(exc)}],
        ) from exc


def location_covariates(location: str | None, pattern: re.Pattern[str]) -> dict[str, float]:
    """``loc_<name>`` for each named group of ``pattern`` that matched a number in the whole
    ``location``: the covariates a model fitted with this pattern reads. A group that did not
    match, or matched no number, is absent (not 0): the model imputes it as it was trained to."""
    match = pattern.fullmatch(location) if location else None
    if match is None:
        return {}
    found = {}
    for name, raw in match.groupdict().items():
        try:
            value = float(raw) if raw is not None else math.nan
        except ValueError:  # a part that is not a number ("c0-0c0s0n0"'s letters) says nothing
            value = math.nan
        if not math.isnan(value):
            found[f"loc_{name}"] = value
    return found


def location_columns(
    locations: Iterable[str | None], pattern: re.Pattern[str]
) -> dict[str, list[float]]:
    """:func:`location_covariates` of each of ``locations`` as one column per named group of
    ``pattern`` (``loc_<name>``), NaN where absent: a model's input."""
    names = [f"loc_{n}" for n in pattern.groupindex]
    parsed = [location_covariates(location, pattern) for location in locations]
    return {name: [found.get(name, math.nan) for found in parsed] for name in names}


def parse_utc(text: str) -> datetime:
    """An ISO 8601 time as aware UTC; a time without offset is taken as UTC."""
    value = datetime.fromisoformat(text.strip())
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _cell(row: dict[str, Any], column: str | None) -> str:
    if column is None:
        return ""
    value = row.get(column)
    return value.strip() if isinstance(value, str) else ""


def _location_parts(match: re.Match[str]) -> dict[str, int | str]:
    return {k: int(v) if v.isdigit() else v for k, v in match.groupdict().items() if v is not None}


def _record(
    line: int, row: dict[str, Any], columns: ColumnMap, pattern: re.Pattern[str] | None
) -> LifetimeRecord | str:
    """The record, or the reason the row is refused."""
    serial = _cell(row, columns.serial)
    if not serial:
        return f"{columns.serial!r} (serial) is empty"
    if len(serial) > _MAX_SERIAL:
        return f"serial {serial[:20]!r}... is longer than {_MAX_SERIAL} characters"
    inserted, removed = _cell(row, columns.inserted), _cell(row, columns.removed)
    if not inserted:
        return f"{columns.inserted!r} (install time) is empty"
    try:
        installed_at = parse_utc(inserted)
    except ValueError:
        return f"{columns.inserted!r} is not an ISO 8601 time: {inserted!r}"
    try:
        removed_at = parse_utc(removed) if removed else None
    except ValueError:
        return f"{columns.removed!r} is not an ISO 8601 time: {removed!r}"
    if removed_at is not None and removed_at < installed_at:
        return f"removed {removed} is before installed {inserted}"

    evidence: dict[str, Any] = {}
    location = _cell(row, columns.location) or None
    if location is not None:
        if len(location) > _MAX_LOCATION:
            return f"location is longer than {_MAX_LOCATION} characters"
        if pattern is not None:
            match = pattern.fullmatch(location)
            if match is None:
                return f"location {location!r} does not match pattern {pattern.pattern!r}"
            evidence["location_parts"] = _location_parts(match)

    out_text = _cell(row, columns.out).lower()
    out: bool | None = None
    if out_text:
        if out_text not in _TRUE | _FALSE:
            return f"{columns.out!r} is neither true nor false: {out_text!r}"
        out = out_text in _TRUE
        evidence["out"] = out

    event = _cell(row, columns.event)
    end_kind: EndKind | None = None
    if event:
        end_kind = "failure"
    elif removed_at is not None and out is not False:
        end_kind = "retirement"
    return LifetimeRecord(
        line=line,
        serial=serial,
        location=location,
        installed_at=installed_at,
        removed_at=removed_at,
        end_kind=end_kind,
        cause=event or None,
        evidence=evidence or None,
    )


def read_lifetimes(
    lines: Iterable[str],
    *,
    columns: ColumnMap | None = None,
    location_pattern: str | None = TITAN_LOCATION_PATTERN,
    summary: ImportSummary | None = None,
) -> Iterator[LifetimeRecord]:
    """Yield the valid records of a CSV text (a file or any iterable of lines).

    Refused rows go to ``summary`` with their line number (the header is line 1). A missing
    header or mapped column raises :class:`InvalidInput` before any record is yielded.
    """
    columns = columns or ColumnMap()
    summary = summary if summary is not None else ImportSummary()
    pattern = compile_location_pattern(location_pattern)
    reader = csv.DictReader(lines, restkey="\0extra")
    header = reader.fieldnames
    if not header:
        raise InvalidInput(
            "the CSV is empty; it needs a header line",
            [{"loc": ["body", "header"], "msg": "no header"}],
        )
    wanted = {**columns.required(), "location": columns.location, "event": columns.event}
    missing = [f"{col!r} ({name})" for name, col in wanted.items() if col and col not in header]
    if missing:
        raise InvalidInput(
            f"the CSV header lacks column(s) {', '.join(missing)}; it has {header}. "
            "Map other names with serial=COLUMN etc.; drop optional ones with location= or event=",
            [{"loc": ["body", "header"], "msg": f"missing {m}"} for m in missing],
        )
    if columns.out is not None and columns.out not in header:
        columns = replace(columns, out=None)  # optional: the rule falls back to retirement
    width = len(header)
    for row in reader:
        line = reader.line_num
        summary.rows += 1
        if "\0extra" in row or None in row.values():
            summary.reject(line, f"has a different number of fields than the header ({width})")
            continue
        result = _record(line, row, columns, pattern)
        if isinstance(result, str):
            summary.reject(line, result)
            continue
        summary.accepted += 1
        yield result
