"""The estimator contract every survival model follows (STYLE 2.4)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone

from fleetwatch.errors import ModelError
from fleetwatch.models.aft import WeibullAFTRisk
from fleetwatch.models.base import (
    ModelFitError,
    NotFittedError,
    SurvivalModel,
    validate_training_frame,
)
from fleetwatch.models.landmark_risk import LandmarkRisk
from fleetwatch.models.weibull import WeibullRisk

MODELS = [
    pytest.param(lambda: WeibullRisk(), id="weibull"),
    pytest.param(lambda: WeibullRisk(group_col="g"), id="weibull-grouped"),
    pytest.param(lambda: WeibullAFTRisk(penalizer=0.01), id="aft"),
    pytest.param(
        lambda: LandmarkRisk(horizons=(90.0, 365.0), min_samples_leaf=20, max_iter=40),
        id="landmark",
    ),
]


@pytest.mark.parametrize("make", MODELS)
def test_fit_returns_self_and_sets_learned_attributes(make, synthetic) -> None:
    X, y = synthetic
    model = make()
    assert isinstance(model, SurvivalModel)
    assert model.fit(X, y) is model
    assert hasattr(model, "fitter_") or hasattr(model, "ensembles_")
    assert hasattr(model, "trained_at_")
    assert clone(model).get_params() == model.get_params()


@pytest.mark.parametrize("make", MODELS)
def test_predicting_before_fit_raises_not_fitted(make, synthetic) -> None:
    X, y = synthetic
    model = make()
    for call in (
        lambda: model.predict_risk(X, 30.0),
        lambda: model.predict_survival(X, [30.0]),
        lambda: model.score(X, y),
    ):
        with pytest.raises(NotFittedError, match="not fitted") as info:
            call()
        assert isinstance(info.value, ModelError | ValueError)
        assert isinstance(info.value, AttributeError)


@pytest.mark.parametrize("make", MODELS)
def test_risk_in_unit_interval_and_non_decreasing_in_horizon(make, synthetic) -> None:
    X, y = synthetic
    model = make().fit(X, y)
    X_now = X.assign(age_days=np.linspace(0.0, 2000.0, len(X)))
    horizons = [0.0, 1.0, 30.0, 90.0, 365.0, 5000.0]
    risks = np.column_stack([model.predict_risk(X_now, h) for h in horizons])
    assert risks.shape == (len(X), len(horizons))
    assert np.all((risks >= 0.0) & (risks <= 1.0))
    assert np.all(np.diff(risks, axis=1) >= -1e-12)
    np.testing.assert_allclose(risks[:, 0], 0.0, atol=1e-12)
    surv = model.predict_survival(X_now, [30.0, 90.0])
    np.testing.assert_allclose(1.0 - surv[:, 1], risks[:, 3])
    assert 0.5 <= model.score(X, y) <= 1.0 or isinstance(model, WeibullRisk)


@pytest.mark.parametrize("make", MODELS)
def test_negative_age_is_refused(make, synthetic) -> None:
    X, y = synthetic
    model = make().fit(X, y)
    with pytest.raises(ValueError, match="age_days"):
        model.predict_risk(X.assign(age_days=-1.0), 30.0)


def test_validate_training_frame_gives_actionable_messages() -> None:
    X = pd.DataFrame({"x": [1.0, np.nan, 3.0], "name": ["a", "b", "c"]})
    y = pd.DataFrame({"duration": [1.0, 0.0, 2.0], "event": [True, False, True]})
    with pytest.raises(ModelFitError, match="not numeric; encode") as info:
        validate_training_frame(X, y)
    assert "<= 0" in str(info.value)
    with pytest.raises(ModelFitError, match="NaN or inf"):
        validate_training_frame(X[["x"]], y.assign(duration=1.0))
    with pytest.raises(ModelFitError, match="y lacks column"):
        validate_training_frame(X, y[["duration"]])
    with pytest.raises(ModelFitError, match="no failures"):
        validate_training_frame(X[["x"]].fillna(0.0), y.assign(duration=1.0, event=False))
    frame = validate_training_frame(X[["x"]].fillna(0.0).assign(age_days=5.0), y.assign(duration=1))
    assert list(frame.columns) == ["x", "duration", "event"]
    assert frame["event"].dtype == bool
