"""Day-by-day figures: counts land on their UTC day, and each day's availability equals the
whole computation's for that day alone (the shortcut for untouched nodes changes nothing)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from fleetwatch.reports.availability import FleetPeriod, Outage, SlaTargets, compute_availability
from fleetwatch.reports.daily import daily_figures, day_starts

T0 = datetime(2026, 11, 1, tzinfo=UTC)
H = timedelta(hours=1)


def _period() -> FleetPeriod:
    return FleetPeriod(
        since=T0,
        until=T0 + timedelta(days=2, hours=12),
        nodes={"a": {}, "b": {}, "c": {}, "d": {}},
        joined={"a": T0 - timedelta(days=9), "b": T0, "c": T0, "d": T0 + timedelta(hours=30)},
        planned={"c": [(T0 + 2 * H, T0 + 8 * H)]},
        outages=[
            Outage("a", T0 + 10 * H, T0 + 34 * H, "drain:rule"),  # drained day 1, back day 2
            Outage("b", T0 + 25 * H, None, "gpu_failure"),  # failed day 2, still out
            Outage("b", T0 - 5 * H, T0 + 1 * H, "drain:risk"),  # back on day 1
        ],
    )


def test_day_starts_are_utc_midnights_ending_today() -> None:
    assert day_starts(T0 + timedelta(days=2, hours=5), 3) == [
        T0,
        T0 + timedelta(days=1),
        T0 + timedelta(days=2),
    ]


def test_daily_figures_count_events_on_their_day() -> None:
    days = daily_figures(_period(), day_starts(T0 + timedelta(days=2), 3))
    assert [(d.day, d.failures, d.drains, d.returns) for d in days] == [
        (date(2026, 11, 1), 0, 1, 1),
        (date(2026, 11, 2), 1, 0, 1),
        (date(2026, 11, 3), 0, 0, 0),
    ]


def test_daily_availability_equals_the_whole_computation_per_day() -> None:
    p = _period()
    days = daily_figures(p, day_starts(T0 + timedelta(days=2), 3))
    for d in days:
        start = datetime(d.day.year, d.day.month, d.day.day, tzinfo=UTC)
        end = min(start + timedelta(days=1), p.until)
        whole = FleetPeriod(
            since=start,
            until=end,
            nodes=p.nodes,
            joined=p.joined,
            planned=p.planned,
            outages=p.outages,
        )
        fleet = compute_availability(whole, SlaTargets(0.99, 30), by=())["fleet"]
        assert d.availability == pytest.approx(fleet["workload_availability"], abs=1e-12)
    # day 1: a, b, c exposed 24 h each (d joins later), c's 6 planned hours excluded; a down
    # 14 h, b 1 h
    assert days[0].availability == pytest.approx((66 - 15) / 66)
    # day 3 is cut at noon: a, b (down), c, d (joined at 06:00 the day before) for 12 h
    assert days[2].availability == pytest.approx((48 - 12) / 48)


def test_daily_figures_with_no_node_have_no_availability() -> None:
    p = FleetPeriod(since=T0, until=T0 + timedelta(days=1), nodes={})
    assert [d.availability for d in daily_figures(p, [T0])] == [None]
