"""Time arguments of the read API: ISO 8601 instants or durations back from now ("15m", "7d").

Every answer is a 422 naming the argument or a time in [1970-01-01, 9999-01-01) UTC: a duration
too long for a timedelta, or an instant that overflows when moved to UTC (year 1 at +14:00), is
refused here rather than failing in the query that uses it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from fleetwatch.errors import InvalidInput
from fleetwatch.server.schemas.fields import check_instant

__all__ = ["parse_duration", "parse_instant"]

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d|w)$", re.ASCII)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _invalid(name: str, message: str, value: str) -> InvalidInput:
    return InvalidInput(
        f"{name}: {message}, got {value!r}", [{"loc": ["query", name], "msg": message}]
    )


def parse_duration(value: str, *, name: str) -> timedelta:
    match = _DURATION.match(value.strip())
    if match is None:
        raise _invalid(name, "expected a duration like 30s, 15m, 24h or 7d", value)
    try:
        return timedelta(seconds=float(match[1]) * _UNIT_SECONDS[match[2]])
    except OverflowError:
        raise _invalid(name, "duration too long", value) from None


def parse_instant(value: str | None, *, name: str, now: datetime) -> datetime | None:
    """``None`` passes through; naive ISO times are taken as UTC; ``1h`` means one hour ago."""
    if value is None:
        return None
    if _DURATION.match(value.strip()):
        try:
            parsed = now - parse_duration(value, name=name)
        except OverflowError:
            parsed = datetime.min.replace(tzinfo=UTC)  # before year 1: refused just below
    else:
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise _invalid(
                name, "expected an ISO 8601 time (2026-11-30T05:00:00Z) or a duration (1h)", value
            ) from None
        parsed = parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed
    try:
        return check_instant(parsed)
    except ValueError as exc:
        raise _invalid(name, str(exc), value) from None
