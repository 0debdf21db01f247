"""The report scores each GPU on what the server scored it on: age, SKU, its telemetry window
and its location's parts (reports/scored_units.py); the week's calibration uses them."""

from __future__ import annotations

from collections import namedtuple
from datetime import timedelta

import numpy as np
import pandas as pd
from tests.unit.reports.conftest import START

from fleetwatch.models.registry import RiskBundle
from fleetwatch.models.telemetry_features import FEATURE_NAMES
from fleetwatch.reports.calibration import calibration
from fleetwatch.reports.scored_units import units_at

Lifetime = namedtuple(
    "Lifetime", ["gpu_uuid", "sku", "installed_at", "removed_at", "end_kind", "location"]
)
Model = namedtuple("Model", ["version", "params"])
RACK_PATTERN = r"r(?P<rack>\d+)-u\d+"


def _in_rack(i: int, location: str | None) -> Lifetime:
    return Lifetime(f"GPU-{i}", "H100", START - timedelta(days=30), None, None, location)


def test_units_carry_telemetry_and_location_parts_and_nan_where_absent() -> None:
    lifetimes = [_in_rack(0, "r2-u01"), _in_rack(1, "hall-b"), _in_rack(2, None)]
    features = {"GPU-0": {"sbe_per_day": 4.0}}
    units = units_at(lifetimes, START, features, RACK_PATTERN)
    assert list(units.columns) == ["age_days", "group", *FEATURE_NAMES, "loc_rack"]
    assert units["age_days"].tolist() == [30.0, 30.0, 30.0]
    assert units["sbe_per_day"].iloc[0] == 4.0 and units["sbe_per_day"].iloc[1:].isna().all()
    assert units["loc_rack"].iloc[0] == 2.0 and units["loc_rack"].iloc[1:].isna().all()
    assert "loc_rack" not in units_at(lifetimes, START, features).columns


def test_the_weeks_calibration_scores_the_location_the_model_was_fitted_on() -> None:
    rack = np.repeat([1.0, 2.0], 300)
    rng = np.random.default_rng(3)
    life = np.where(rack == 2, 60.0, 600.0) * rng.weibull(1.5, 600)
    censor = rng.uniform(50, 800, 600)
    frame = pd.DataFrame({
        "duration_days": np.minimum(life, censor), "event": (life <= censor).astype(int),
        "loc_rack": rack,
    })  # fmt: skip
    model = Model(1, RiskBundle.fit(frame).to_params())
    rack2 = [_in_rack(i, f"r2-u{i:02d}") for i in range(20)]
    rack1 = [_in_rack(i, f"r1-u{i:02d}") for i in range(20)]
    end = START + timedelta(days=7)
    worn = calibration(model, rack2, START, end, {}, RACK_PATTERN)["expected"]
    spared = calibration(model, rack1, START, end, {}, RACK_PATTERN)["expected"]
    unplaced = calibration(model, rack2, START, end)["expected"]
    assert worn > 3 * spared, (worn, spared)
    assert spared < unplaced < worn  # without the pattern: the median rack's risk for all
