"""Wire timestamps read as the pydantic models read them, for the ingest hot path.

:func:`parse_timestamp` takes a subset of what pydantic accepts for ``GpuSample.ts``: RFC 3339
with a time zone (``2026-11-30T05:00:00Z``, ``2026-11-30T05:00:00.123456+02:00``), also with
``t``, space or ``_`` between date and time, ``,`` before the fraction, ``z``, or ``+0200``. It
gives the same value: the instant in UTC, the fraction past microseconds truncated (msgspec's own
parser would round it), within the server's clock limits. Anything else gets None, and pydantic
decides: it refuses the text, or accepts a form left to it.
``tests/unit/server/ingest/test_wire_time.py`` compares the two on generated timestamps.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

from fleetwatch.telemetry import IngestLimits

__all__ = ["parse_timestamp"]

# [0-9], not \d: Python's \d also matches other scripts' digits, which pydantic refuses.
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt _]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:[.,]([0-9]{1,12}))?"
    r"(?:[Zz]|([+-])([0-9]{2}):?([0-9]{2}))\Z"
)


def parse_timestamp(text: str, limits: IngestLimits) -> datetime | None:
    """The UTC instant pydantic would make of ``text`` within ``limits``, or None (see above)."""
    match = _RFC3339.match(text)
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, sign, off_hours, off_minutes = match.groups()
    zone = UTC
    if sign is not None:
        hours, minutes = int(off_hours), int(off_minutes)
        if hours > 23 or minutes > 59:
            return None
        offset = timedelta(hours=hours, minutes=minutes)
        if offset:
            zone = timezone(-offset if sign == "-" else offset)
    try:
        value = datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            int(second),
            int(fraction[:6].ljust(6, "0")) if fraction else 0,
            tzinfo=zone,
        )
        if zone is not UTC:
            value = value.astimezone(UTC)
    except (ValueError, OverflowError):  # no such day or time, or out of range once in UTC
        return None
    if not limits.now - limits.max_past_age <= value <= limits.now + limits.max_future_skew:
        return None
    return value
