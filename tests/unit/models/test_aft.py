"""WeibullAFTRisk recovers the sign and size of covariate effects."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from tests.unit.models.synth import SEED

from fleetwatch.models.aft import WeibullAFTRisk
from fleetwatch.models.base import ModelFitError


def test_recovers_covariate_effects(rng) -> None:
    n = 4000
    hot = rng.integers(0, 2, size=n).astype(float)
    load = rng.normal(size=n)
    beta_hot, beta_load, shape = -0.7, 0.3, 1.8
    scale = np.exp(7.0 + beta_hot * hot + beta_load * load)
    t = scale * rng.weibull(shape, size=n)
    y = pd.DataFrame({"duration": np.minimum(t, 1500.0), "event": t <= 1500.0})
    X = pd.DataFrame({"hot": hot, "load": load})
    model = WeibullAFTRisk().fit(X, y)
    beta = model.coefficients()
    assert beta["hot"] == pytest.approx(beta_hot, abs=0.07), f"seed {SEED}"
    assert beta["load"] == pytest.approx(beta_load, abs=0.05), f"seed {SEED}"
    risk = model.predict_risk(
        pd.DataFrame({"hot": [0.0, 1.0], "load": [0.0, 0.0], "age_days": [300.0, 300.0]}), 90.0
    )
    assert risk[1] > risk[0]  # hot units fail sooner


def test_matches_lifelines_conditional_survival(synthetic) -> None:
    X, y = synthetic
    model = WeibullAFTRisk(penalizer=0.05).fit(X, y)
    ages = np.linspace(0.0, 800.0, len(X))
    ours = model.predict_survival(X.assign(age_days=ages), [60.0])[:, 0]
    theirs = model.fitter_.predict_survival_function(X, times=[60.0], conditional_after=ages)
    np.testing.assert_allclose(ours, theirs.to_numpy()[0], rtol=1e-8)


def test_refuses_constant_or_missing_covariates(synthetic) -> None:
    X, y = synthetic
    with pytest.raises(ModelFitError, match="constant"):
        WeibullAFTRisk().fit(X.assign(k=1.0), y)
    with pytest.raises(ModelFitError, match="no covariates"):
        WeibullAFTRisk().fit(X.iloc[:, :0], y)
    with pytest.raises(ModelFitError, match="penalizer"):
        WeibullAFTRisk(penalizer=-1.0).fit(X, y)
    model = WeibullAFTRisk().fit(X, y)
    with pytest.raises(ValueError, match="lacks covariate"):
        model.predict_risk(X[["g"]], 30.0)
