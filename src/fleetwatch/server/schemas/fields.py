"""Value types every request shares: text the database can store, ids that fit their column,
instants the calendar can hold.

Hostile values used to reach the database and answer 500: a NUL character (PostgreSQL text cannot
hold one), a lone UTF-16 surrogate from a JSON ``\\udXXX`` escape (not encodable as UTF-8), an id
beyond the column's integer range, a time that overflows when moved to UTC. Each request parameter
and body field is declared with one of these types instead, so such a value is a 422 naming the
field before any query runs.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import Path
from pydantic import AfterValidator

__all__ = [
    "INT32_MAX",
    "INT64_MAX",
    "MAX_INSTANT",
    "MIN_INSTANT",
    "AwareInstant",
    "RowId",
    "Text",
    "check_instant",
    "storable_text",
]

INT32_MAX = 2**31 - 1  # SQL INTEGER on PostgreSQL
INT64_MAX = 2**63 - 1  # SQL BIGINT, and SQLite's widest integer
# Nothing FleetWatch keeps predates 1970, and a year of headroom before datetime.max leaves room
# for the window arithmetic (week after, lease ends) that follows a time the caller gave.
MIN_INSTANT = datetime(1970, 1, 1, tzinfo=UTC)
MAX_INSTANT = datetime(9999, 1, 1, tzinfo=UTC)


def storable_text(value: str) -> str:
    """``value`` unchanged if both databases can store it; ValueError naming the reason."""
    if "\x00" in value:
        raise ValueError("must not contain a NUL character (\\u0000)")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode: a lone surrogate (\\ud800-\\udfff)") from None
    return value


def check_instant(value: datetime) -> datetime:
    """``value`` in UTC with an offset, lying in [MIN_INSTANT, MAX_INSTANT); else ValueError."""
    if value.tzinfo is None:
        raise ValueError("needs a UTC offset, e.g. 2026-11-30T05:00:00Z")
    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        utc = None  # e.g. 0001-01-01T00:00:00+14:00 is in year 0
    if utc is None or not MIN_INSTANT <= utc < MAX_INSTANT:
        raise ValueError(f"must lie between {MIN_INSTANT:%Y-%m-%d} and {MAX_INSTANT:%Y-%m-%d} UTC")
    return utc


# Text for a query, path or body field: no NUL, no lone surrogate.
Text = Annotated[str, AfterValidator(storable_text)]
# A path id of an autoincrement INTEGER column: 1 to 2^31-1, or 422 before any query.
RowId = Annotated[int, Path(ge=1, le=INT32_MAX, description="a row id (1 to 2^31-1)")]
AwareInstant = Annotated[datetime, AfterValidator(check_instant)]
