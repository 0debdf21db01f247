"""The port rules (rules.port_health): port events in, node verdicts of component network out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fleetwatch.rules.port_health import is_urgent_port_event, judge_port_events
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.telemetry import Event

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
T = HealthThresholds()


def _ev(kind: str, minutes_ago: float, port: int = 1, **details: Any) -> Event:
    return Event.model_construct(
        kind=kind,
        ts=NOW - timedelta(minutes=minutes_ago),
        uuid=None,
        pci_bus_id=None,
        details={"device": "mlx5_0", "port": port, "netdev": "ib0", **details},
    )


def _rules(events: list[Event]) -> list[str]:
    return [v.rule for v in judge_port_events(events, now=NOW, thresholds=T)]


def test_a_port_down_is_a_critical_node_verdict_of_the_network() -> None:
    [v] = judge_port_events([_ev("port_down", 5, severity="critical")], now=NOW)
    assert (v.rule, v.scope, v.component, v.severity, v.action) == (
        "port_down",
        "node",
        "network",
        "critical",
        "drain_inspect",
    )
    assert v.evidence["device"] == "mlx5_0" and v.evidence["netdev"] == "ib0"
    assert not v.counts_against_gpu


def test_a_port_back_up_clears_port_down() -> None:
    assert _rules([_ev("port_down", 5), _ev("port_up", 1)]) == []


def test_a_port_down_on_another_port_is_not_cleared_by_this_ones_up() -> None:
    assert _rules([_ev("port_down", 5, port=2), _ev("port_up", 1, port=1)]) == ["port_down"]


def test_a_port_down_older_than_the_lookback_is_not_judged() -> None:
    assert _rules([_ev("port_down", 25 * 60)]) == []


def test_degraded_is_a_warning_until_restored() -> None:
    degraded = _ev("port_degraded", 5, rate_gbps=200.0, normal_rate_gbps=400.0)
    [v] = judge_port_events([degraded], now=NOW)
    assert (v.rule, v.severity, v.action) == ("port_degraded", "warning", "investigate")
    assert (v.evidence["rate_gbps"], v.evidence["normal_rate_gbps"]) == (200.0, 400.0)
    assert _rules([degraded, _ev("port_restored", 1)]) == []
    assert _rules([degraded, _ev("port_down", 1)]) == ["port_down"]


@pytest.mark.parametrize(
    ("increases", "fires"),
    [([1, 1], False), ([1, 1, 1], True), ([3], True), ([2], False)],
)
def test_flaps_fire_at_the_limit_within_the_window(increases: list[int], fires: bool) -> None:
    evs = [_ev("port_flap", 10 + i, increase=n) for i, n in enumerate(increases)]
    assert _rules(evs) == (["port_flap"] if fires else [])


def test_three_flaps_spread_over_more_than_the_window_do_not_fire() -> None:
    spread = T.port_flap_window_s / 60 * 0.6
    evs = [_ev("port_flap", 10 + i * spread, increase=1) for i in range(3)]
    assert _rules(evs) == []


def test_a_flapping_link_stays_after_it_comes_back_up() -> None:
    evs = [_ev("port_flap", 30 + i, increase=1) for i in range(3)] + [_ev("port_up", 1)]
    [v] = judge_port_events(evs, now=NOW)
    assert (v.rule, v.severity, v.count, v.evidence["link_downed_increase"]) == (
        "port_flap",
        "critical",
        3,
        3,
    )


def test_port_errors_are_a_warning_that_ages_out_after_two_windows() -> None:
    window_min = T.port_error_window_s / 60
    fresh = _ev("port_errors", window_min, counter="symbol_error", increase=130, limit=120)
    [v] = judge_port_events([fresh], now=NOW)
    assert (v.rule, v.severity) == ("port_errors", "warning")
    assert v.evidence["counters"]["symbol_error"]["increase"] == 130
    stale = _ev("port_errors", 2 * window_min + 1, counter="symbol_error", increase=130)
    assert _rules([stale]) == []


def test_informational_events_alone_make_no_verdict() -> None:
    informational = [_ev("port_up", 5), _ev("port_restored", 3), _ev("port_flap", 2, increase=1)]
    assert _rules(informational) == []


def test_other_event_kinds_are_ignored() -> None:
    assert _rules([_ev("sxid", 5, severity="fatal"), _ev("xid", 5)]) == []


@pytest.mark.parametrize(
    ("kind", "severity", "urgent"),
    [
        ("port_down", "critical", True),
        ("port_flap", "critical", True),
        ("port_flap", "warning", False),
        ("port_degraded", "warning", False),
        ("port_errors", "warning", False),
        ("sxid", "fatal", False),
    ],
)
def test_only_a_port_down_or_a_flap_at_its_limit_is_urgent(
    kind: str, severity: str, urgent: bool
) -> None:
    assert is_urgent_port_event(kind, {"severity": severity}) is urgent
