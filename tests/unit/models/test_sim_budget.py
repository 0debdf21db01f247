"""Simulator drain budgets and notice thresholds on hand-made scores, worked out by hand."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd
import pytest

from fleetwatch.models.sim_budget import (
    NOTICE_THRESHOLDS,
    NoticePoint,
    choose_threshold,
    node_days,
    notice_curve,
    sim_weeks,
)

INF = math.inf


@dataclass
class Scored:
    """The two fields of a simulator backtest result that these functions read."""

    scores: pd.DataFrame
    gpu_nodes: dict[str, str] = field(default_factory=dict)


def _scores() -> Scored:
    """Node n1 has GPUs a and b, n2 has c; midnights 0-3. a (risk 0.3) fails at day 0.5, c
    (risk 0.1) at day 3.5, b (risk 0.01) never; a rule flags b on day 1."""
    rows = [(0, "a", 0.3, 0.5, False)]
    rows += [(d, "b", 0.01, INF, d == 1) for d in range(4)]
    rows += [(d, "c", 0.1, 3.5 - d, False) for d in range(4)]
    frame = pd.DataFrame(rows, columns=["day", "uuid", "risk_1d", "days_to_failure", "rule"])
    frame["risk_7d"] = frame["risk_1d"] * 5
    frame["age_days"] = frame["uuid"].map({"a": 30.0, "b": 10.0, "c": 20.0}) + frame["day"]
    frame["label"] = frame["days_to_failure"] <= 7
    return Scored(frame, {"a": "n1", "b": "n1", "c": "n2"})


def test_node_days_combine_the_node_gpus() -> None:
    nd = node_days(_scores()).set_index(["day", "node"])
    assert nd.loc[(0, "n1"), "risk"] == pytest.approx(1 - 0.7 * 0.99)
    assert nd.loc[(1, "n1"), "risk"] == pytest.approx(0.01)  # a has failed
    assert nd.loc[(1, "n1"), "rule"] and not nd.loc[(0, "n1"), "rule"]
    assert nd.loc[(0, "n1"), "to_failure"] == 0.5 and nd.loc[(1, "n1"), "to_failure"] == INF
    assert nd.loc[(2, "n2"), "to_failure"] == 1.5
    with pytest.raises(ValueError, match="horizon_days"):
        node_days(_scores(), 2.0)


def test_notice_curve_by_hand() -> None:
    low, high = notice_curve(_scores(), [0.05, 0.2])
    # 0.05: n1 on day 0 and n2 on days 0-3; right: n1 day 0 (a at 0.5), n2 day 3 (c at 3.5).
    assert (low.notices, low.right, low.precision) == (5, 2, 0.4)
    assert (low.failures, low.warned, low.recall, low.median_lead_h) == (2, 2, 1.0, 12.0)
    # 0.2: n1 on day 0 alone: right; c is never warned.
    assert (high.notices, high.right, high.precision, high.recall) == (1, 1, 1.0, 0.5)


def test_notice_curve_with_the_rules_notices() -> None:
    [both] = notice_curve(_scores(), [0.2], rules=True)
    assert (both.notices, both.right, both.precision, both.recall) == (2, 1, 0.5, 0.5)
    [rules] = notice_curve(_scores(), [INF], rules=True)  # the rule on n1, day 1, alone
    assert (rules.notices, rules.right, rules.warned) == (1, 0, 0)
    [none] = notice_curve(_scores(), [INF])
    assert none.notices == 0 and math.isnan(none.precision) and none.recall == 0.0


def test_notice_curve_judged_over_a_week() -> None:
    [p] = notice_curve(_scores(), [0.05], judged_days=7.0)
    # every n2 notice precedes c's failure within 7 days; c is first warned 3.5 days ahead
    assert (p.notices, p.right, p.warned) == (5, 5, 2)
    assert p.median_lead_h == pytest.approx((12.0 + 84.0) / 2)


def test_choose_threshold_is_the_lowest_reaching_the_target() -> None:
    def point(theta: float, notices: int, precision: float) -> NoticePoint:
        return NoticePoint(theta, notices, round(notices * precision), precision, 10, 1, 0.1, 1.0)

    curve = [point(0.3, 5, 0.8), point(0.1, 40, 0.2), point(0.2, 20, 0.3), point(0.25, 12, 0.3)]
    assert choose_threshold(curve, 0.25, min_notices=10) == curve[2]  # 0.2, not 0.25
    assert choose_threshold(curve, 0.5, min_notices=10) is None  # 0.3 has too few notices
    assert choose_threshold(curve, 0.5, min_notices=5) == curve[0]


def test_notice_thresholds_are_plain_settings() -> None:
    assert NOTICE_THRESHOLDS[0] == 0.005 and NOTICE_THRESHOLDS[-1] == 0.5
    assert list(NOTICE_THRESHOLDS) == sorted(set(NOTICE_THRESHOLDS))
    assert all(float(f"{t:.2g}") == t for t in NOTICE_THRESHOLDS)


def test_sim_weeks_rank_by_model_age_or_coin() -> None:
    weeks = sim_weeks(_scores(), "model", step_days=2)
    assert [w.at for w in weeks] == [0.0, 2.0]
    first = weeks[0]
    assert list(first.units) == ["a", "b", "c"]
    assert list(first.failure) == [0.5, pytest.approx(math.nan, nan_ok=True), 3.5]
    assert list(weeks[1].failure)[1:] == [3.5]  # c fails at day 3.5 whichever day lists it
    assert list(sim_weeks(_scores(), "age_only", step_days=2)[0].risk) == [30.0, 10.0, 20.0]
    coins = sim_weeks(_scores(), "random", step_days=2, seed=1)
    assert list(coins[0].risk) == list(sim_weeks(_scores(), "random", step_days=2, seed=1)[0].risk)
    with pytest.raises(ValueError, match="ranking"):
        sim_weeks(_scores(), "oracle")
