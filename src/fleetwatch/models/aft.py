"""Weibull accelerated-failure-time risk with covariates (lifelines ``WeibullAFTFitter``).

.. math::

    S(t \\mid x) = \\exp\\!\\left(-\\left(t/\\lambda(x)\\right)^{\\rho}\\right), \\qquad
    \\log \\lambda(x) = \\beta_0 + \\beta^\\top x

so a positive :math:`\\beta_j` stretches lifetimes (lower risk). Risk is conditional on the current
age :math:`a`: :math:`1 - S(a + H \\mid x)/S(a \\mid x)`. The penalizer adds
:math:`\\tfrac{1}{2}\\,\\mathrm{penalizer}\\,(\\mathrm{l1\\_ratio}\\,|\\beta|_1
+ (1 - \\mathrm{l1\\_ratio})\\,\\|\\beta\\|_2^2)` to the negative log-likelihood (lifelines'
elastic net, on standardised covariates).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Self

import numpy as np
import pandas as pd
from lifelines import WeibullAFTFitter
from lifelines.exceptions import ConvergenceError
from numpy.typing import NDArray
from sklearn.base import BaseEstimator

from fleetwatch.models.base import (
    DURATION_COL,
    EVENT_COL,
    ModelFitError,
    check_fitted,
    check_times,
    current_ages,
    validate_training_frame,
)

__all__ = ["WeibullAFTRisk"]


class WeibullAFTRisk(BaseEstimator):  # type: ignore[misc]
    """Weibull AFT model: lifetime scale depends on covariates, shape is shared.

    Parameters
    ----------
    penalizer : float
        Strength of the elastic-net penalty (>= 0); a little (0.01) steadies correlated covariates.
    l1_ratio : float
        Share of L1 in the penalty, in [0, 1].

    Attributes
    ----------
    fitter_ : lifelines.WeibullAFTFitter
    feature_names_ : list of str
        Covariates seen in ``fit``, in order; ``predict_*`` need them in ``X``.
    trained_at_ : datetime
    """

    def __init__(self, penalizer: float = 0.0, l1_ratio: float = 0.0) -> None:
        self.penalizer = penalizer
        self.l1_ratio = l1_ratio

    def fit(self, X: pd.DataFrame, y: pd.DataFrame) -> Self:
        """Fit :math:`\\beta` and :math:`\\rho` by penalised maximum likelihood; return ``self``."""
        if self.penalizer < 0 or not 0.0 <= self.l1_ratio <= 1.0:
            raise ModelFitError(
                f"need penalizer >= 0 and 0 <= l1_ratio <= 1, got {self.penalizer}, {self.l1_ratio}"
            )
        frame = validate_training_frame(X, y)
        features = [c for c in frame.columns if c not in (DURATION_COL, EVENT_COL)]
        if not features:
            raise ModelFitError("X has no covariates; use WeibullRisk for an age-only model")
        constant = [c for c in features if frame[c].nunique() < 2]
        if constant:
            raise ModelFitError(f"covariates {constant} are constant in training; drop them")
        fitter = WeibullAFTFitter(penalizer=self.penalizer, l1_ratio=self.l1_ratio)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # lifelines' StatisticalWarning chatter
                fitter.fit(frame, duration_col=DURATION_COL, event_col=EVENT_COL)
        except ConvergenceError as exc:
            raise ModelFitError(f"Weibull AFT fit did not converge: {exc}") from exc
        self.fitter_ = fitter
        self.feature_names_ = features
        self.trained_at_ = datetime.now(UTC)
        return self

    def _covariates(self, X: pd.DataFrame) -> pd.DataFrame:
        missing = [c for c in self.feature_names_ if c not in X.columns]
        if missing:
            raise ValueError(f"X lacks covariate(s) {missing} used in fit")
        return X[self.feature_names_].reset_index(drop=True).astype(np.float64)

    def _scale_shape(self, X: pd.DataFrame) -> tuple[NDArray[np.float64], float]:
        """Per-row :math:`\\lambda(x)` and the shared :math:`\\rho`."""
        params = self.fitter_.params_
        lam = params.loc["lambda_"]
        log_lam = self._covariates(X).to_numpy() @ lam[self.feature_names_].to_numpy()
        log_lam = log_lam + float(lam["Intercept"])
        rho = float(np.exp(params.loc["rho_"]["Intercept"]))
        return np.exp(log_lam).astype(np.float64), rho

    def coefficients(self) -> pd.Series:
        """:math:`\\beta` per covariate (log-scale effect on lifetime; > 0 means longer-lived)."""
        check_fitted(self)
        beta: pd.Series = self.fitter_.params_.loc["lambda_"][self.feature_names_]
        return beta

    def predict_survival(self, X: pd.DataFrame, times: Sequence[float]) -> NDArray[np.float64]:
        """:math:`S(a + t \\mid x)/S(a \\mid x)` per row and time; shape (rows, times)."""
        check_fitted(self)
        t = check_times(times)
        ages = current_ages(X)[:, None]
        lam, rho = self._scale_shape(X)
        lam2 = lam[:, None]
        log_s = (ages / lam2) ** rho - ((ages + t[None, :]) / lam2) ** rho
        return np.asarray(np.exp(log_s), dtype=np.float64)

    def predict_risk(self, X: pd.DataFrame, horizon_days: float) -> NDArray[np.float64]:
        """P(failure within ``horizon_days`` | survived to the current age, covariates)."""
        risk = 1.0 - self.predict_survival(X, [horizon_days])[:, 0]
        return np.asarray(np.clip(risk, 0.0, 1.0), dtype=np.float64)

    def score(self, X: pd.DataFrame, y: pd.DataFrame) -> float:
        """Harrell's concordance on ``(X, y)`` (lifelines ``score``, ``concordance_index``)."""
        check_fitted(self)
        frame = validate_training_frame(self._covariates(X), y)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = self.fitter_.score(frame, scoring_method="concordance_index")
        return float(value)
