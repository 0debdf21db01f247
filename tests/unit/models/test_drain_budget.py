"""Drain budgets on hand-made weeks: every figure worked out by hand from the definitions."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest

from fleetwatch.models import drain_budget
from fleetwatch.models.drain_budget import (
    WeekRisks,
    budget_curve,
    budget_k,
    curve_ks,
    simulate_drains,
)

NAN = math.nan


def week(at: float, rows: list[tuple[str, float, float]]) -> WeekRisks:
    units, risk, failure = zip(*rows, strict=True)
    return WeekRisks(at, list(units), np.array(risk), np.array(failure))


# Three weekly decisions, horizon 7 days. Failure times (days):
#   a 3, b 9, c 30 (after the period's end, 14 + 7 = 21), d 16, e never, f 20 (listed from
#   day 7 on), g 2 (listed on day 7 too, but failed by then: not eligible there).
WEEKS = [
    week(0.0, [("a", 0.9, 3.0), ("b", 0.8, 9.0), ("c", 0.7, 30.0), ("d", 0.1, 16.0),
               ("e", 0.2, NAN), ("g", 0.05, 2.0)]),
    week(7.0, [("b", 0.95, 9.0), ("c", 0.6, 30.0), ("d", 0.5, 16.0), ("e", 0.4, NAN),
               ("f", 0.3, 20.0), ("g", 0.99, 2.0)]),
    week(14.0, [("c", 0.2, 30.0), ("d", 0.9, 16.0), ("e", 0.8, NAN), ("f", 0.1, 20.0)]),
]  # fmt: skip
# The period's failures, (0, 14 + 7]: a, b, d, f, g (c fails at 30, e never) -> 5.


def test_drain_budget_one_per_week_by_hand() -> None:
    p = simulate_drains(WEEKS, k=1, horizon_days=7.0)
    # week 0 drains a (fails at 3: hit, lead 3); week 1: g failed at 2 (not eligible), so b
    # (fails at 9: hit, lead 2); week 2: d (fails at 16: hit, lead 2).
    assert (p.k, p.drains, p.hits, p.failures) == (1, 3, 3, 5)
    assert p.precision == 1.0 and p.recall == pytest.approx(3 / 5)
    assert p.median_lead_days == 2.0
    assert p.risk_at_k == 0.9  # lowest drained risk per week: 0.9, 0.95, 0.9


def test_drain_budget_drained_units_leave_the_pool() -> None:
    p = simulate_drains(WEEKS, k=2, horizon_days=7.0)
    # week 0: a (hit, 3), b (fails at 9 > 7: miss). week 1: b is gone, g failed; c (30: miss),
    # d (16 > 14: miss). week 2: c, d gone; e (never: miss), f (20: hit, lead 6).
    assert (p.drains, p.hits, p.failures) == (6, 2, 5)
    assert p.precision == pytest.approx(2 / 6) and p.recall == pytest.approx(2 / 5)
    assert p.median_lead_days == pytest.approx(4.5)


def test_drain_budget_risk_at_k_is_the_median_lowest_drained_risk() -> None:
    p = simulate_drains(WEEKS, k=2, horizon_days=7.0)
    # lowest drained risk per week: week 0 b 0.8, week 1 d 0.5, week 2 f 0.1 -> median 0.5
    assert p.risk_at_k == 0.5


def test_drain_budget_longer_horizon_counts_later_failures() -> None:
    p = simulate_drains(WEEKS, k=2, horizon_days=14.0)
    # Period (0, 28]: a, b, d, f, g -> 5 (c at 30 still outside).
    # week 0: a (3: hit), b (9: hit). week 1: c (30 - 7 = 23 > 14: miss), d (16: hit, 9).
    # week 2: e (miss), f (20: hit, 6). Leads 3, 9, 9, 6 -> median 7.5.
    assert (p.drains, p.hits, p.failures) == (6, 4, 5)
    assert p.median_lead_days == pytest.approx(7.5)


def test_drain_budget_budget_larger_than_pool_drains_everyone_once() -> None:
    p = simulate_drains(WEEKS, k=100, horizon_days=7.0)
    # Day 0 drains all 6 (g fails at 2 > 0: eligible then); day 7 only f is left (fails at
    # 20, 13 days later: a miss); day 14 nothing is left.
    assert p.drains == 7
    # hits: a (3), g (2); b 9 > 7 miss; d 16 miss; c miss; e miss; f at week 1: 13 > 7 miss.
    assert p.hits == 2 and p.recall == pytest.approx(2 / 5)


def test_drain_budget_ties_go_to_the_unit_listed_first() -> None:
    weeks = [week(0.0, [("x", 0.5, NAN), ("y", 0.5, 1.0)])]
    assert simulate_drains(weeks, 1, 7.0).hits == 0
    weeks = [week(0.0, [("y", 0.5, 1.0), ("x", 0.5, NAN)])]
    assert simulate_drains(weeks, 1, 7.0).hits == 1


def test_drain_budget_nothing_to_find_gives_nan_not_zero() -> None:
    weeks = [week(0.0, [("x", 0.5, NAN), ("y", 0.1, NAN)])]
    p = simulate_drains(weeks, 1, 7.0)
    assert p.precision == 0.0 and math.isnan(p.recall) and math.isnan(p.median_lead_days)
    empty = [WeekRisks(0.0, [], np.array([]), np.array([]))]
    q = simulate_drains(empty, 1, 7.0)
    assert q.drains == 0 and math.isnan(q.precision) and math.isnan(q.risk_at_k)


def test_drain_budget_curve_matches_single_runs() -> None:
    ks = [1, 2, 3, 100]
    curve = budget_curve(WEEKS, ks, 7.0)
    assert [p.k for p in curve] == ks
    assert curve == [simulate_drains(WEEKS, k, 7.0) for k in ks]


@pytest.mark.parametrize(
    ("weeks", "k", "horizon", "match"),
    [
        ([], 1, 7.0, "no weeks"),
        (WEEKS, 0, 7.0, ">= 1 drain"),
        (WEEKS, 1, 0.0, "horizon_days"),
        ([WEEKS[1], WEEKS[0]], 1, 7.0, "increase strictly"),
    ],
)
def test_drain_budget_rejects_bad_input(
    weeks: list[WeekRisks], k: int, horizon: float, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        simulate_drains(weeks, k, horizon)


def test_drain_budget_week_checks_lengths_and_finite_risks() -> None:
    with pytest.raises(ValueError, match="one of each per unit"):
        WeekRisks(0.0, ["a", "b"], np.array([0.1]), np.array([NAN, NAN]))
    with pytest.raises(ValueError, match="finite"):
        WeekRisks(0.0, ["a"], np.array([np.nan]), np.array([NAN]))


def test_drain_budget_ks_and_grid() -> None:
    assert budget_k(18_688, 0.001) == 19 and budget_k(18_688, 0.01) == 187
    assert budget_k(320, 0.001) == 1
    with pytest.raises(ValueError):
        budget_k(0, 0.01)
    grid = curve_ks(18_688)
    assert grid[0] == 1 and grid[-1] == budget_k(18_688, 0.02)
    assert {19, 93, 187} <= set(grid) and grid == sorted(set(grid))


def test_drain_budget_docstring_examples() -> None:
    assert doctest.testmod(drain_budget, raise_on_error=False).failed == 0
