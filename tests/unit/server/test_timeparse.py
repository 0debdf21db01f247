"""Time arguments of the read API: ISO 8601 instants (zoned or UTC) or durations back from now."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleetwatch.errors import InvalidInput
from fleetwatch.server.timeparse import parse_duration, parse_instant

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("2026-11-30T05:00:00Z", datetime(2026, 11, 30, 5, 0, tzinfo=UTC)),
        ("2026-11-30T05:00:00+00:00", datetime(2026, 11, 30, 5, 0, tzinfo=UTC)),
        ("2026-11-30T07:30:00+02:00", datetime(2026, 11, 30, 5, 30, tzinfo=UTC)),
        ("2026-11-30T05:00:00.250Z", datetime(2026, 11, 30, 5, 0, 0, 250_000, tzinfo=UTC)),
        # Naive times are taken as UTC, not as the server's local time.
        ("2026-11-30T05:00:00", datetime(2026, 11, 30, 5, 0, tzinfo=UTC)),
        ("2026-11-30", datetime(2026, 11, 30, tzinfo=UTC)),
        (" 2026-11-30T05:00:00Z ", datetime(2026, 11, 30, 5, 0, tzinfo=UTC)),
    ],
)
def test_timeparse_iso_instants(raw: str, expected: datetime) -> None:
    parsed = parse_instant(raw, name="since", now=NOW)
    assert parsed == expected
    assert parsed is not None and parsed.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    ("raw", "ago"),
    [
        ("30s", timedelta(seconds=30)),
        ("15m", timedelta(minutes=15)),
        ("24h", timedelta(hours=24)),
        ("1.5h", timedelta(minutes=90)),
        ("7d", timedelta(days=7)),
        ("2w", timedelta(weeks=2)),
        (" 15m ", timedelta(minutes=15)),
    ],
)
def test_timeparse_durations_count_back_from_now(raw: str, ago: timedelta) -> None:
    assert parse_instant(raw, name="since", now=NOW) == NOW - ago


def test_timeparse_none_passes_through() -> None:
    assert parse_instant(None, name="since", now=NOW) is None


@pytest.mark.parametrize("raw", ["junk", "", "15", "15 m", "-1h", "7y", "2026-13-01T00:00:00Z"])
@pytest.mark.parametrize("name", ["since", "until"])
def test_timeparse_junk_names_the_query_parameter(raw: str, name: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_instant(raw, name=name, now=NOW)
    assert str(caught.value).startswith(f"{name}:")
    assert repr(raw) in str(caught.value)
    assert caught.value.detail == [
        {
            "loc": ["query", name],
            "msg": "expected an ISO 8601 time (2026-11-30T05:00:00Z) or a duration (1h)",
        }
    ]


@pytest.mark.parametrize(
    "raw",
    [
        "99999999999d",  # past year 1
        "1" * 400 + "s",  # float('1' * 400) is inf
        "0001-01-01T00:00:00+14:00",  # year 0 once in UTC
        "9999-12-31T23:59:59-14:00",  # year 10000 once in UTC
        "1969-12-31T23:59:59Z",
        "9999-01-01T00:00:00Z",
    ],
)
def test_timeparse_refuses_times_outside_the_calendar(raw: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_instant(raw, name="since", now=NOW)
    assert caught.value.detail[0]["loc"] == ["query", "since"]
    assert str(caught.value).startswith("since:")


def test_timeparse_keeps_the_edges_of_the_calendar() -> None:
    assert parse_instant("1970-01-01T00:00:00Z", name="since", now=NOW) == datetime(
        1970, 1, 1, tzinfo=UTC
    )
    assert parse_instant("9998-12-31T23:59:59Z", name="since", now=NOW) is not None


@pytest.mark.parametrize("raw", ["7x", "h", "1.h", "five minutes"])
def test_timeparse_parse_duration_refuses_junk(raw: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_duration(raw, name="window")
    assert caught.value.detail[0]["loc"] == ["query", "window"]
    assert str(caught.value).startswith("window:")


def test_timeparse_parse_duration_units() -> None:
    assert parse_duration("90s", name="w") == timedelta(seconds=90)
    assert parse_duration("0.5d", name="w") == timedelta(hours=12)
