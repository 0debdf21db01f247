"""Smoke fits and one backtest on the public Titan GPU data (../shared/datasets/titan)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fleetwatch.models.aft import WeibullAFTRisk
from fleetwatch.models.backtest import backtest
from fleetwatch.models.features import LOCATION_COLUMNS, read_titan, survival_frame
from fleetwatch.models.weibull import WeibullRisk


@pytest.fixture(scope="module")
def titan(shared_dir: Path) -> pd.DataFrame:
    path = shared_dir / "datasets" / "titan" / "gc_full.csv"
    if not path.is_file():
        pytest.skip(f"Titan data not found at {path}")
    return read_titan(path)


def test_smoke_fit_on_a_titan_slice(titan: pd.DataFrame) -> None:
    frame = survival_frame(titan, "2017-01-01")
    part = frame.sample(1500, random_state=7)
    X, y = part[list(LOCATION_COLUMNS)], part[["duration", "event"]]
    aft = WeibullAFTRisk(penalizer=0.01).fit(X, y)
    weib = WeibullRisk(group_col="cage").fit(X, y)
    now = part[part["in_service"]]
    for model in (aft, weib):
        risk = model.predict_risk(now[[*LOCATION_COLUMNS, "age_days"]], 180.0)
        assert risk.shape == (len(now),) and np.all((risk >= 0) & (risk <= 1))
    mean, lo, hi = weib.mtbf()
    assert 0 < lo < mean < hi


def test_backtest_2017_beats_chance(titan: pd.DataFrame) -> None:
    result = backtest(titan, "2017-01-01", 180, lambda: WeibullAFTRisk(penalizer=0.01))
    m = result.metrics["model"]
    assert 0.5 < m.auc <= 1.0
    assert m.n_failures > 0 and m.n == len(result.risks)
    assert set(result.metrics) == {"model", "aft", "age_only", "location_only"}
    assert all(not math.isnan(x.auc) for x in result.metrics.values())
    assert result.risks["age_days"].min() > 0
    with pytest.raises(ValueError, match="past the end"):
        backtest(titan, "2019-06-01", 180, WeibullRisk)
