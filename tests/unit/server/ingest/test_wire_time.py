"""parse_timestamp against pydantic's reading of ``GpuSample.ts``, on generated timestamps.

Whatever text ``parse_timestamp`` gives a value for, pydantic accepts with the same value (the
same instant, in UTC, microseconds truncated as pydantic truncates them); what it leaves (None),
pydantic decides. And the forms agents send are all read here, not left to pydantic.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from fleetwatch.server.ingest.wire_time import parse_timestamp
from fleetwatch.telemetry import GpuSample, IngestLimits

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
LIMITS = IngestLimits(now=NOW)
# Every instant datetime can hold is within these: the calendar and zones are tested, not limits.
ANY_TIME = replace(
    LIMITS,
    max_past_age=NOW - datetime.min.replace(tzinfo=UTC),
    max_future_skew=datetime.max.replace(tzinfo=UTC) - NOW,
)


def pydantic_reads(text: str, limits: IngestLimits) -> datetime | None:
    body = json.dumps({"uuid": "GPU-1", "ts": text})
    try:
        return GpuSample.model_validate_json(body, context={"limits": limits}).ts
    except ValidationError:
        return None


def _odd(rng: random.Random, usual: str, odd: list[str]) -> str:
    return rng.choice(odd) if rng.random() < 0.12 else usual


def generated(rng: random.Random) -> str:
    """A timestamp-like text near NOW: mostly well formed, every part sometimes out of range or
    odd (other digits, separators, zones, fractions of any length), sometimes damaged."""
    when = NOW + timedelta(seconds=rng.uniform(-32 * 86400, 900))
    digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 12)))
    hh, mm = (
        rng.choice(["00", "02", "05", "14", "23", "24", "2"]),
        rng.choice(["00", "30", "59", "60"]),
    )
    parts = [
        _odd(rng, f"{when.year:04d}", ["0001", "9999", "0000", "226", "20266", "２０２６", "1970"]),
        "-",
        _odd(rng, f"{when.month:02d}", ["02", "00", "13", "1"]),
        "-",
        _odd(rng, f"{when.day:02d}", ["29", "31", "00", "32", "3"]),
        _odd(rng, "T", ["t", " ", "_", "", "TT"]),
        _odd(rng, f"{when.hour:02d}", ["00", "23", "24", "1", "99"]),
        ":",
        _odd(rng, f"{when.minute:02d}", ["00", "60", "5"]),
        ":",
        _odd(rng, f"{when.second:02d}", ["60", "61", "5"]),
        rng.choice(["", f".{digits}", f".{digits}", ".", f",{digits}", ".٣"]),
        rng.choice(
            ["Z", "Z", "z", "", f"+{hh}:{mm}", f"-{hh}:{mm}", f"+{hh}{mm}", f"+{hh}", " Z", "UTC"]
        ),
    ]
    text = "".join(parts)
    if rng.random() < 0.1:
        at = rng.randrange(len(text))
        text = text[:at] + rng.choice(["", " ", "\n", "x", "0", "-"]) + text[at + 1 :]
    return text


@pytest.mark.parametrize("limits", [ANY_TIME, LIMITS], ids=["any_time", "server_limits"])
def test_wire_time_reads_nothing_pydantic_would_not_and_reads_it_the_same(
    limits: IngestLimits,
) -> None:
    rng = random.Random(20261130)
    read = 0
    for _ in range(20_000):
        text = generated(rng)
        ours, theirs = parse_timestamp(text, limits), pydantic_reads(text, limits)
        if ours is not None:
            read += 1
            assert theirs is not None, f"read {text!r}, which pydantic refuses"
            assert ours == theirs and ours.utcoffset() == theirs.utcoffset() == timedelta(0), text
            assert ours.microsecond == theirs.microsecond, text
    assert read > 1000  # the generator makes readable timestamps often enough to test values


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-30T11:00:00.1234567Z",  # truncated, as pydantic does (msgspec would round)
        "2026-11-30T11:00:00.9999999Z",  # truncated: not rounded up into the next second
        "2026-11-30T11:00:00.123456789+02:00",
        "2026-11-30 11:00:00z",
        "2026-11-30t13:00:00+0200",
        "2026-11-30T06:30:00-05:30",
        "2026-11-30T11:00:00-00:00",
    ],
)
def test_wire_time_reads_these_as_pydantic_does(text: str) -> None:
    ours = parse_timestamp(text, LIMITS)
    assert ours is not None and ours == pydantic_reads(text, LIMITS)
    assert ours.tzinfo is UTC


@pytest.mark.parametrize("seconds", [0, 0.5, 59.999999])
@pytest.mark.parametrize("offset_minutes", [0, 60, -330, 840, -840])
def test_wire_time_reads_what_python_agents_write(seconds: float, offset_minutes: int) -> None:
    when = NOW - timedelta(hours=1, seconds=seconds)
    for text in (
        when.isoformat(),
        when.astimezone(timezone(timedelta(minutes=offset_minutes))).isoformat(),
        when.isoformat().replace("+00:00", "Z"),
        when.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",  # JavaScript's toISOString()
    ):
        assert parse_timestamp(text, LIMITS) == pydantic_reads(text, LIMITS) is not None, text


def test_wire_time_limits_are_inclusive_as_the_models_are() -> None:
    edge_future = (NOW + LIMITS.max_future_skew).isoformat()
    edge_past = (NOW - LIMITS.max_past_age).isoformat()
    for text in (edge_future, edge_past):
        assert parse_timestamp(text, LIMITS) == pydantic_reads(text, LIMITS) is not None
    beyond = (NOW + LIMITS.max_future_skew + timedelta(microseconds=1)).isoformat()
    assert parse_timestamp(beyond, LIMITS) is None and pydantic_reads(beyond, LIMITS) is None
