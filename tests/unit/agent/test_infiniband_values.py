"""One sysfs InfiniBand attribute's text, read as a value."""

from __future__ import annotations

import pytest

from fleetwatch.agent.parsers import ParseError
from fleetwatch.agent.parsers.infiniband_values import (
    parse_counter,
    parse_node_guid,
    parse_port_state,
    parse_rate,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("400 Gb/sec (4X NDR)\n", (400.0, 4, "NDR")),
        ("200 Gb/sec (2X NDR)", (200.0, 2, "NDR")),
        ("2.5 Gb/sec (1X SDR)", (2.5, 1, "SDR")),
        ("10 Gb/sec (4X)", (10.0, 4, None)),
        ("40 Gb/sec", (40.0, None, None)),
    ],
)
def test_rates(text: str, expected: tuple[float, int | None, str | None]) -> None:
    assert parse_rate(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "400", "400 Gb/s (4X NDR)", "-1 Gb/sec", "10 Gb/sec (0X)", "10 Gb/sec (65X)",
     "100000 Gb/sec (4X)", "10 Gb/sec (-1X)"],
)  # fmt: skip
def test_rates_refused(text: str) -> None:
    with pytest.raises(ParseError):
        parse_rate(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4: ACTIVE\n", (4, "ACTIVE")), ("5: LinkUp", (5, "LinkUp")), ("2: Polling", (2, "Polling"))],
)
def test_states(text: str, expected: tuple[int, str]) -> None:
    assert parse_port_state(text) == expected


@pytest.mark.parametrize("text", ["ACTIVE", "4", "999: ACTIVE", "4: "])
def test_states_refused(text: str) -> None:
    with pytest.raises(ParseError):
        parse_port_state(text)


def test_counters_and_guids() -> None:
    assert parse_counter("230539874932483\n") == 230539874932483
    assert parse_node_guid("0A7F:BC12:45EF:D23B\n") == "0a7f:bc12:45ef:d23b"
    for bad in ("-1", "1.5", "0x10", "١٢"):
        with pytest.raises(ParseError):
            parse_counter(bad)
    with pytest.raises(ParseError):
        parse_node_guid("0x58a2e10300a7820e")
