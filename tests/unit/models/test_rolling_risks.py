"""Weekly risks over a forward split: what each week sees, and that nothing later reaches it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fleetwatch.models.aft import WeibullAFTRisk
from fleetwatch.models.drain_budget import budget_curve
from fleetwatch.models.rolling_risks import RANKINGS, weekly_risks

CUT = pd.Timestamp("2016-01-01")
DATA_END = pd.Timestamp("2017-01-01")


def _inventory(seed: int = 3, slots: int = 160) -> pd.DataFrame:
    """``slots`` Titan-like positions from 2014 on, each refilled the day after its unit fails
    (Weibull lifetimes, shape 1.5); units in cage 2 (the top) live a tenth as long, a signal the
    model can find. A unit alive at the data's end is removed then without an event."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(slots):
        cage = i % 3
        location = f"c{i % 4}-{i // 4 % 2}c{cage}s{i // 8 % 8}n{i // 64}"
        t = pd.Timestamp("2014-01-01") + pd.Timedelta(days=int(rng.integers(0, 300)))
        while t < DATA_END:
            life = (120.0 if cage == 2 else 1200.0) * rng.weibull(1.5)
            end = t + pd.Timedelta(days=float(life))
            failed = end < DATA_END
            serial = f"03237{12 + len(rows) % 3:02d}{len(rows):06d}"
            rows.append(
                (serial, location, t, end if failed else DATA_END, "DBE" if failed else None)
            )
            t = end + pd.Timedelta(days=1)
    return pd.DataFrame(rows, columns=["serial", "location", "inserted", "removed", "event"])


def _factory() -> WeibullAFTRisk:
    return WeibullAFTRisk(penalizer=0.01)


@pytest.fixture(scope="module")
def records() -> pd.DataFrame:
    return _inventory()


def test_weekly_risks_lists_units_in_service_with_later_failures(records: pd.DataFrame) -> None:
    rolled = weekly_risks(records, CUT, 28, [7.0, 28.0], _factory)
    assert set(rolled.weeks) == {(r, h) for r in RANKINGS for h in (7.0, 28.0)}
    weeks = rolled.weeks[("model", 7.0)]
    assert [w.at for w in weeks] == [0.0, 7.0, 14.0, 21.0]
    assert len(weeks[0].units) == rolled.fleet_size > 50
    for w in weeks:
        assert len(set(w.units)) == len(w.units)
        f = w.failure[~np.isnan(w.failure)]
        assert (f > w.at).all()  # a unit in service at t has not failed by t
        assert ((w.risk >= 0) & (w.risk <= 1)).all()
    # every ranking scores the same units on the same days
    for key, other in rolled.weeks.items():
        assert [list(w.units) for w in other] == [list(w.units) for w in weeks], key
    # a longer horizon never lowers a unit's risk
    longer = rolled.weeks[("model", 28.0)]
    assert all((b.risk >= a.risk - 1e-12).all() for a, b in zip(weeks, longer, strict=True))


def test_weekly_risks_sees_nothing_after_each_week(records: pd.DataFrame) -> None:
    """Rewrite everything after day 14: the risks of the weeks up to it must not move."""
    late = CUT + pd.Timedelta(days=14)
    changed = records.copy()
    after = changed["removed"] > late
    changed.loc[after, "event"] = None  # later failures never happened...
    changed.loc[after, "removed"] = DATA_END  # ...and those units stayed to the end
    a = weekly_risks(records, CUT, 28, [56.0], _factory).weeks
    b = weekly_risks(changed, CUT, 28, [56.0], _factory).weeks
    for name in ("model", "age_only"):
        for wa, wb in zip(a[(name, 56.0)][:3], b[(name, 56.0)][:3], strict=True):  # days 0-14
            assert list(wa.units) == list(wb.units)
            np.testing.assert_array_equal(wa.risk, wb.risk)
    # the outcomes did change: failures after day 14 are gone from the rewrite
    fa, fb = a[("model", 56.0)][0].failure, b[("model", 56.0)][0].failure
    assert (fa > 14).sum() >= 3 and not (fb > 14).any()


def test_weekly_risks_model_drains_beat_random(records: pd.DataFrame) -> None:
    rolled = weekly_risks(records, CUT, 56, [28.0], _factory)
    model, coin = (budget_curve(rolled.weeks[(r, 28.0)], [3], 28.0)[0] for r in ("model", "random"))
    assert model.failures == coin.failures > 20
    assert model.hits > coin.hits


def test_weekly_risks_weekly_refit_moves_only_later_weeks(records: pd.DataFrame) -> None:
    once = weekly_risks(records, CUT, 14, [28.0], _factory).weeks[("model", 28.0)]
    weekly = weekly_risks(records, CUT, 14, [28.0], _factory, refit="weekly")
    again = weekly.weeks[("model", 28.0)]
    assert weekly.refit == "weekly"
    np.testing.assert_array_equal(once[0].risk, again[0].risk)  # the same fit at the cutoff
    assert not np.allclose(once[1].risk, again[1].risk)  # refitted on a week more


def test_weekly_risks_refuses_a_window_past_the_data(records: pd.DataFrame) -> None:
    with pytest.raises(ValueError, match="past the end of the records"):
        weekly_risks(records, "2016-12-01", 28, [28.0], _factory)
    with pytest.raises(ValueError, match="must be > 0"):
        weekly_risks(records, CUT, 28, [0.0], _factory)
