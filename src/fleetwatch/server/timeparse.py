"""Time arguments of the read API: ISO 8601 instants or durations back from now ("15m", "7d")."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from fleetwatch.errors import InvalidInput

__all__ = ["parse_duration", "parse_instant"]

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d|w)$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: str, *, name: str) -> timedelta:
    match = _DURATION.match(value.strip())
    if match is None:
        raise InvalidInput(
            f"{name}: expected a duration like 30s, 15m, 24h or 7d, got {value!r}",
            [{"loc": ["query", name], "msg": "expected a duration like 30s, 15m, 24h, 7d"}],
        )
    return timedelta(seconds=float(match[1]) * _UNIT_SECONDS[match[2]])


def parse_instant(value: str | None, *, name: str, now: datetime) -> datetime | None:
    """``None`` passes through; naive ISO times are taken as UTC; ``1h`` means one hour ago."""
    if value is None:
        return None
    if _DURATION.match(value.strip()):
        return now - parse_duration(value, name=name)
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(
            f"{name}: expected an ISO 8601 time (2026-11-30T05:00:00Z) or a duration (1h), "
            f"got {value!r}",
            [{"loc": ["query", name], "msg": "expected ISO 8601 time or duration like 1h"}],
        ) from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
