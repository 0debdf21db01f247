"""WeibullRisk recovers known parameters and computes conditional risk and MTBF."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from tests.unit.models.synth import SEED, weibull_data

from fleetwatch.models.weibull import WeibullRisk


@pytest.mark.parametrize(("scale", "shape"), [(1500.0, 0.8), (900.0, 2.5)])
def test_recovers_scale_and_shape_under_censoring(rng, scale, shape) -> None:
    y = weibull_data(rng, 3000, scale, shape, censor_at=1.5 * scale)
    model = WeibullRisk().fit(pd.DataFrame(index=y.index), y)
    lam, rho = float(model.fitter_.lambda_), float(model.fitter_.rho_)
    assert lam == pytest.approx(scale, rel=0.10), f"seed {SEED}"
    assert rho == pytest.approx(shape, rel=0.10), f"seed {SEED}"
    mean, lo, hi = model.mtbf()
    true_mean = scale * math.gamma(1.0 + 1.0 / shape)
    assert lo < mean < hi
    assert lo <= true_mean * 1.02 and true_mean * 0.98 <= hi


def test_conditional_risk_matches_formula(rng) -> None:
    y = weibull_data(rng, 2000, 1000.0, 2.0)
    model = WeibullRisk().fit(pd.DataFrame(index=y.index), y)
    lam, rho = float(model.fitter_.lambda_), float(model.fitter_.rho_)
    ages = np.array([0.0, 500.0, 1500.0])
    risk = model.predict_risk(pd.DataFrame({"age_days": ages}), 100.0)
    expected = 1.0 - np.exp((ages / lam) ** rho - ((ages + 100.0) / lam) ** rho)
    np.testing.assert_allclose(risk, expected, rtol=1e-10)
    assert risk[0] < risk[1] < risk[2]  # wear-out: older units are riskier


def test_per_group_fits_separate_scales(rng) -> None:
    a = weibull_data(rng, 1500, 500.0, 1.5)
    b = weibull_data(rng, 1500, 2000.0, 1.5)
    y = pd.concat([a, b], ignore_index=True)
    X = pd.DataFrame({"cage": [0] * 1500 + [1] * 1500, "other": 7})
    model = WeibullRisk(group_col="cage").fit(X, y)
    assert float(model.group_fitters_[0].lambda_) == pytest.approx(500.0, rel=0.1)
    assert float(model.group_fitters_[1].lambda_) == pytest.approx(2000.0, rel=0.1)
    risk = model.predict_risk(pd.DataFrame({"cage": [0, 1, 2]}), 90.0)
    assert risk[0] > risk[1]
    pooled = model.predict_risk(pd.DataFrame({"cage": [2]}), 90.0)
    assert risk[2] == pytest.approx(pooled[0])  # unseen group falls back to the pooled fit
    assert model.mtbf(group=1)[0] > model.mtbf(group=0)[0]
    with pytest.raises(KeyError, match="no fit for group"):
        model.mtbf(group=5)
