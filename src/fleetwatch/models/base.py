"""What every survival model shares: its errors, its protocol, and training-frame validation.

A survival model here is an sklearn-shaped wrapper around a lifelines fitter (STYLE 2.4):
``fit(X, y)`` returns ``self``, learned state ends in ``_``, and

.. math::

    \\mathrm{risk}_i(H) = P(T_i \\le a_i + H \\mid T_i > a_i) = 1 - \\frac{S_i(a_i + H)}{S_i(a_i)}

where :math:`a_i` is unit *i*'s current age (the ``age_days`` column of ``X``, 0 where absent) and
:math:`H` the horizon in days.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, Self, runtime_checkable

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from fleetwatch.errors import ModelError

__all__ = [
    "AGE_COL",
    "DURATION_COL",
    "EVENT_COL",
    "ModelFitError",
    "NotFittedError",
    "SurvivalModel",
    "check_fitted",
    "check_times",
    "current_ages",
    "validate_training_frame",
]

DURATION_COL = "duration"
EVENT_COL = "event"
AGE_COL = "age_days"
"""Column of ``X`` holding each unit's current age in days; ignored by ``fit``."""


class NotFittedError(ModelError, ValueError, AttributeError):
    """A model was used before ``fit`` (a ``ValueError`` and ``AttributeError``, as in sklearn)."""


class ModelFitError(ModelError):
    """A model cannot be fitted: invalid training data, or lifelines did not converge."""


@runtime_checkable
class SurvivalModel(Protocol):
    """The estimator contract every model in ``fleetwatch.models`` follows."""

    def fit(self, X: pd.DataFrame, y: pd.DataFrame) -> Self: ...

    def predict_survival(self, X: pd.DataFrame, times: Sequence[float]) -> NDArray[np.float64]: ...

    def predict_risk(self, X: pd.DataFrame, horizon_days: float) -> NDArray[np.float64]: ...

    def score(self, X: pd.DataFrame, y: pd.DataFrame) -> float: ...


def check_fitted(model: Any, attributes: Sequence[str] = ("fitter_",)) -> None:
    """Raise :class:`NotFittedError` unless ``model`` has the learned ``attributes``."""
    # Imported here: sklearn brings scipy.stats, a second of CPU at every server start, and
    # only a model in use (its lifelines fit already imported) gets this far.
    from sklearn.exceptions import NotFittedError as SklearnNotFittedError
    from sklearn.utils.validation import check_is_fitted

    try:
        check_is_fitted(model, list(attributes))
    except SklearnNotFittedError as exc:
        raise NotFittedError(
            f"this {type(model).__name__} is not fitted yet; call fit(X, y) before predicting"
        ) from exc


def current_ages(X: pd.DataFrame) -> NDArray[np.float64]:
    """Current ages in days from ``X[AGE_COL]`` (zeros where the column is absent).

    Raises
    ------
    ValueError
        If an age is negative or not finite.
    """
    if AGE_COL not in X.columns:
        return np.zeros(len(X), dtype=np.float64)
    ages: NDArray[np.float64] = pd.to_numeric(X[AGE_COL], errors="coerce").to_numpy(
        dtype=np.float64
    )
    bad = ~np.isfinite(ages) | (ages < 0)
    if bad.any():
        raise ValueError(
            f"{int(bad.sum())} rows of {AGE_COL!r} are negative, missing or not finite "
            f"(first at position {int(np.flatnonzero(bad)[0])}); ages are days since install, >= 0"
        )
    return ages


def check_times(times: Sequence[float] | NDArray[np.float64]) -> NDArray[np.float64]:
    """``times`` as a 1-D float array of finite values >= 0, else ``ValueError``."""
    arr: NDArray[np.float64] = np.atleast_1d(np.asarray(times, dtype=np.float64))
    if arr.ndim != 1 or not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"times must be finite and >= 0 days, got {arr!r}")
    return arr


def validate_training_frame(X: pd.DataFrame, y: pd.DataFrame) -> pd.DataFrame:
    """Check ``X`` and ``y`` and join them into one frame for a lifelines fitter.

    ``X`` holds numeric covariates (``AGE_COL`` is dropped: it is the duration itself). ``y`` holds
    ``duration`` (days, finite, > 0) and ``event`` (bool or 0/1), one row per row of ``X``.

    Returns
    -------
    pandas.DataFrame
        The covariates followed by ``duration`` (float) and ``event`` (bool), index reset.

    Raises
    ------
    ModelFitError
        With one sentence per problem saying what to change.
    """
    if not isinstance(X, pd.DataFrame) or not isinstance(y, pd.DataFrame):
        raise ModelFitError(
            f"X and y must be pandas DataFrames, got {type(X).__name__} and {type(y).__name__}"
        )
    problems: list[str] = []
    missing = [c for c in (DURATION_COL, EVENT_COL) if c not in y.columns]
    if missing:
        problems.append(f"y lacks column(s) {missing}; give y 'duration' (days) and 'event' (bool)")
    if len(X) != len(y):
        problems.append(f"X has {len(X)} rows but y has {len(y)}; pass one y row per X row")
    if len(y) == 0:
        problems.append("the training frame is empty; widen the training window")
    if problems:
        raise ModelFitError("; ".join(problems))

    covariates = X.drop(columns=[AGE_COL], errors="ignore").reset_index(drop=True)
    clash = [c for c in (DURATION_COL, EVENT_COL) if c in covariates.columns]
    if clash:
        problems.append(f"X must not contain {clash}; those belong in y")
    non_numeric = [
        c for c in covariates.columns if not pd.api.types.is_numeric_dtype(covariates[c])
    ]
    if non_numeric:
        problems.append(f"X columns {non_numeric} are not numeric; encode them (e.g. one-hot)")
    else:
        values = covariates.to_numpy(dtype=np.float64)
        finite = np.isfinite(values).all(axis=0)
        bad_cols = [c for c, ok in zip(covariates.columns, finite, strict=True) if not ok]
        if bad_cols:
            problems.append(f"X columns {bad_cols} contain NaN or inf; impute or drop those rows")

    duration = pd.to_numeric(y[DURATION_COL], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(duration) | (duration <= 0)
    if bad.any():
        problems.append(
            f"{int(bad.sum())} durations are missing, non-finite or <= 0 (first at row "
            f"{int(np.flatnonzero(bad)[0])}); durations are days in service and must be > 0"
        )
    event_raw = y[EVENT_COL]
    if not pd.api.types.is_bool_dtype(event_raw) and not set(event_raw.dropna().unique()) <= {0, 1}:
        problems.append("y['event'] must be bool or 0/1 (True = failed, False = censored)")
    elif event_raw.isna().any():
        problems.append("y['event'] has missing values; a unit either failed or was censored")
    if problems:
        raise ModelFitError("; ".join(problems))
    event = event_raw.astype(bool).to_numpy()
    if not event.any():
        raise ModelFitError(
            "no failures among the training rows, so no failure rate can be fitted; "
            "widen the training window or pool groups"
        )
    frame = covariates.copy()
    frame[DURATION_COL] = duration
    frame[EVENT_COL] = event
    return frame
