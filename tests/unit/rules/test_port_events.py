"""Port events derived from a port's stored reading and its new one (rules.port_events)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fleetwatch.rules.port_events import derive_port_events, link_up
from fleetwatch.rules.thresholds import HealthThresholds

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
T = HealthThresholds()


def _row(seconds: float, **fields: Any) -> dict[str, Any]:
    row = {
        "device": "mlx5_0",
        "port": 1,
        "netdev": "ib0",
        "link_layer": "InfiniBand",
        "ts": T0 + timedelta(seconds=seconds),
        "boot_id": "boot-1",
        "state": "ACTIVE",
        "state_code": 4,
        "phys_state": "LinkUp",
        "phys_state_code": 5,
        "rate_gbps": 400.0,
        "link_width": 4,
        "counters": {"symbol_error": 0, "link_downed": 0},
        "rates": None,
    }
    return row | fields


def _no_flaps(_device: str, _port: int, _since: datetime) -> int:
    return 0


def _walk(*rows: dict[str, Any], recent: int = 0) -> list[list[dict[str, Any]]]:
    """Each row's events, each row derived against the one before (with its memory)."""
    out, before = [], None
    for row in rows:
        change = derive_port_events(
            before, row, thresholds=T, recent_flaps=lambda _d, _p, _s: recent
        )
        out.append(change.events)
        before = {**row, "health": change.health}
    return out


def _kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in events]


@pytest.mark.parametrize(
    ("fields", "up"),
    [
        ({}, True),
        ({"state": "DOWN", "state_code": 1}, False),
        ({"phys_state": "Polling", "phys_state_code": 2}, False),
        ({"state_code": None, "phys_state_code": None}, True),  # names alone
        ({"state": None, "state_code": None, "phys_state": None, "phys_state_code": None}, None),
    ],
)
def test_link_up_reads_logical_and_physical_state(fields: dict[str, Any], up: bool | None) -> None:
    assert link_up(_row(0, **fields)) is up


def test_a_port_that_goes_down_is_one_critical_port_down_and_coming_back_is_port_up() -> None:
    down = {"state": "DOWN", "state_code": 1, "phys_state": "Polling", "phys_state_code": 2}
    steps = _walk(_row(0), _row(10, **down), _row(20, **down), _row(30))
    assert [_kinds(s) for s in steps] == [[], ["port_down"], [], ["port_up"]]
    [event] = steps[1]
    assert event["details"]["severity"] == "critical"
    where = {k: event["details"][k] for k in ("device", "port", "netdev")}
    assert where == {"device": "mlx5_0", "port": 1, "netdev": "ib0"}
    assert event["details"]["was_rate_gbps"] == 400.0


def test_a_port_never_seen_up_makes_no_port_down() -> None:
    down = {"state": "DOWN", "state_code": 1}
    assert _walk(_row(0, **down), _row(10, **down)) == [[], []]


def test_a_rate_below_the_ports_own_normal_is_degraded_until_it_is_restored() -> None:
    steps = _walk(
        _row(0), _row(10, rate_gbps=200.0), _row(20, rate_gbps=200.0), _row(30, rate_gbps=400.0)
    )
    assert [_kinds(s) for s in steps] == [[], ["port_degraded"], [], ["port_restored"]]
    details = steps[1][0]["details"]
    assert (details["rate_gbps"], details["normal_rate_gbps"], details["rate_fraction"]) == (
        200.0,
        400.0,
        0.5,
    )


def test_a_port_that_was_always_at_200_is_not_degraded() -> None:
    assert _walk(_row(0, rate_gbps=200.0), _row(10, rate_gbps=200.0)) == [[], []]


def test_fewer_lanes_than_normal_is_degraded_even_at_the_same_rate() -> None:
    [_, narrowed] = _walk(_row(0), _row(10, link_width=2))
    assert _kinds(narrowed) == ["port_degraded"]
    assert narrowed[0]["details"]["normal_width"] == 4


def test_a_port_that_comes_back_slower_is_degraded_not_up() -> None:
    down = {"state": "DOWN", "state_code": 1}
    steps = _walk(_row(0), _row(10, **down), _row(20, rate_gbps=200.0))
    assert [_kinds(s) for s in steps] == [[], ["port_down"], ["port_degraded"]]


def _flap(increase: int, reset: bool = False) -> dict[str, Any]:
    return {"counters": {"link_downed": {"per_s": 0.1, "increase": increase, "reset": reset}}}


@pytest.mark.parametrize(
    ("recent", "increase", "severity"),
    [(0, 1, "warning"), (1, 1, "warning"), (2, 1, "critical"), (0, 3, "critical")],
)
def test_link_downed_increases_are_flaps_critical_at_the_limit(
    recent: int, increase: int, severity: str
) -> None:
    change = derive_port_events(
        _row(0),
        _row(10, rates=_flap(increase)),
        thresholds=T,
        recent_flaps=lambda _d, _p, _s: recent,
    )
    [event] = change.events
    assert event["kind"] == "port_flap"
    assert event["details"]["severity"] == severity
    assert event["details"]["in_window"] == recent + increase


def test_a_link_downed_reset_is_no_flap() -> None:
    change = derive_port_events(
        _row(0), _row(10, rates=_flap(2, reset=True)), thresholds=T, recent_flaps=_no_flaps
    )
    assert change.events == []


def test_the_flap_window_asked_for_is_the_configured_one() -> None:
    asked: list[datetime] = []

    def recent(_d: str, _p: int, since: datetime) -> int:
        asked.append(since)
        return 0

    derive_port_events(_row(0), _row(10, rates=_flap(1)), thresholds=T, recent_flaps=recent)
    assert asked == [T0 + timedelta(seconds=10) - timedelta(seconds=T.port_flap_window_s)]


def _symbols(*values: int, step_s: float = 60.0) -> list[dict[str, Any]]:
    return [
        _row(i * step_s, counters={"symbol_error": v, "link_downed": 0})
        for i, v in enumerate(values)
    ]


def test_symbol_errors_at_their_limit_within_the_window_are_one_port_errors_event() -> None:
    limit = int(T.port_error_limits["symbol_error"])
    steps = _walk(*_symbols(5, 5 + limit - 1, 5 + limit, 5 + limit + 50))
    assert [_kinds(s) for s in steps] == [[], [], ["port_errors"], []]  # once per window
    details = steps[2][0]["details"]
    assert (details["counter"], details["increase"], details["limit"]) == (
        "symbol_error",
        limit,
        limit,
    )


def test_errors_spread_over_more_than_a_window_make_no_event() -> None:
    limit = int(T.port_error_limits["symbol_error"])
    step = T.port_error_window_s * 0.6
    steps = _walk(*_symbols(0, limit // 2 + 1, limit + 2, step_s=step))
    assert all(s == [] for s in steps)


def test_a_roce_retransmission_counter_over_its_limit_is_a_port_errors_event() -> None:
    limit = int(T.port_error_limits["local_ack_timeout_err"])
    rows = [
        _row(0, link_layer="Ethernet", hw_counters={"local_ack_timeout_err": 7}),
        _row(60, link_layer="Ethernet", hw_counters={"local_ack_timeout_err": 7 + limit}),
    ]
    [_, [event]] = _walk(*rows)
    assert (event["details"]["counter"], event["details"]["link_layer"]) == (
        "local_ack_timeout_err",
        "Ethernet",
    )


def test_a_reboot_starts_a_new_error_window() -> None:
    limit = int(T.port_error_limits["symbol_error"])
    rows = _symbols(0, limit + 10)
    rows[1]["boot_id"] = "boot-2"
    assert _walk(*rows) == [[], []]


def test_a_healthy_port_makes_no_event() -> None:
    rows = [
        _row(i * 10.0, counters={"symbol_error": 3, "link_downed": 1}, rates=_flap(0))
        for i in range(30)
    ]
    assert all(s == [] for s in _walk(*rows))
