"""Age-only Weibull risk, optionally one fit per group (lifelines ``WeibullFitter``).

.. math::

    S(t) = \\exp\\!\\left(-(t/\\lambda)^{\\rho}\\right), \\qquad
    \\mathrm{risk}(a, H) = 1 - \\frac{S(a + H)}{S(a)}
        = 1 - \\exp\\!\\left((a/\\lambda)^{\\rho} - ((a + H)/\\lambda)^{\\rho}\\right)

with scale :math:`\\lambda` (days) and shape :math:`\\rho` (> 1: wear-out, < 1: infant mortality).
The mean time between failures is :math:`\\lambda\\,\\Gamma(1 + 1/\\rho)`.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Sequence
from datetime import UTC, datetime
from typing import Self

import numpy as np
import pandas as pd
from lifelines import WeibullFitter
from lifelines.exceptions import ConvergenceError
from lifelines.utils import concordance_index
from numpy.typing import NDArray
from scipy.special import digamma, gamma
from scipy.stats import norm
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

__all__ = ["WeibullRisk"]


def _fit_weibull(frame: pd.DataFrame, label: str) -> WeibullFitter:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # lifelines' StatisticalWarning chatter
            return WeibullFitter(label=label).fit(frame[DURATION_COL], frame[EVENT_COL])
    except ConvergenceError as exc:
        raise ModelFitError(f"Weibull fit for {label!r} did not converge: {exc}") from exc


class WeibullRisk(BaseEstimator):  # type: ignore[misc]
    """Weibull lifetime model on age alone, pooled or per group.

    Parameters
    ----------
    group_col : str or None
        Column of ``X`` naming each unit's group (e.g. ``cage``); one Weibull per group.
        None fits one pooled Weibull and ignores the covariates in ``X``.
    min_group_events : int
        Groups with fewer failures than this use the pooled fit.

    Attributes
    ----------
    fitter_ : lifelines.WeibullFitter
        The pooled fit.
    group_fitters_ : dict
        Group value to its own ``WeibullFitter`` (empty without ``group_col``).
    trained_at_ : datetime
        When ``fit`` ran (UTC).
    """

    def __init__(self, group_col: str | None = None, min_group_events: int = 10) -> None:
        self.group_col = group_col
        self.min_group_events = min_group_events

    def fit(self, X: pd.DataFrame, y: pd.DataFrame) -> Self:
        """Fit scale and shape by maximum likelihood (right-censored); return ``self``."""
        if self.min_group_events < 1:
            raise ModelFitError(f"min_group_events must be >= 1, got {self.min_group_events}")
        frame = validate_training_frame(X, y)
        if self.group_col is not None and self.group_col not in frame.columns:
            raise ModelFitError(f"group_col {self.group_col!r} is not a column of X")
        fitter = _fit_weibull(frame, "pooled")
        groups: dict[Hashable, WeibullFitter] = {}
        if self.group_col is not None:
            for key, part in frame.groupby(self.group_col):
                if int(part[EVENT_COL].sum()) >= self.min_group_events:
                    groups[key] = _fit_weibull(part, f"{self.group_col}={key}")
        self.fitter_ = fitter
        self.group_fitters_ = groups
        self.feature_names_ = [] if self.group_col is None else [self.group_col]
        self.trained_at_ = datetime.now(UTC)
        return self

    def _params(self, X: pd.DataFrame) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Per-row scale :math:`\\lambda` and shape :math:`\\rho`."""
        lam = np.full(len(X), float(self.fitter_.lambda_))
        rho = np.full(len(X), float(self.fitter_.rho_))
        if self.group_col is not None and self.group_fitters_:
            if self.group_col not in X.columns:
                raise ValueError(f"X lacks the group column {self.group_col!r} used in fit")
            keys = X[self.group_col].to_numpy()
            for key, fitter in self.group_fitters_.items():
                mask = keys == key
                lam[mask] = float(fitter.lambda_)
                rho[mask] = float(fitter.rho_)
        return lam, rho

    def predict_survival(self, X: pd.DataFrame, times: Sequence[float]) -> NDArray[np.float64]:
        """:math:`S(a + t)/S(a)` for each row (age :math:`a`) and time; shape (rows, times)."""
        check_fitted(self)
        t = check_times(times)
        ages = current_ages(X)[:, None]
        lam, rho = self._params(X)
        lam, rho = lam[:, None], rho[:, None]
        log_s = (ages / lam) ** rho - ((ages + t[None, :]) / lam) ** rho
        return np.asarray(np.exp(log_s), dtype=np.float64)

    def predict_risk(self, X: pd.DataFrame, horizon_days: float) -> NDArray[np.float64]:
        """P(failure within ``horizon_days`` | survived to the current age), in [0, 1]."""
        risk = 1.0 - self.predict_survival(X, [horizon_days])[:, 0]
        return np.asarray(np.clip(risk, 0.0, 1.0), dtype=np.float64)

    def score(self, X: pd.DataFrame, y: pd.DataFrame) -> float:
        """Harrell's concordance of the predicted median lifetime with ``y``."""
        check_fitted(self)
        lam, rho = self._params(X)
        median = lam * np.log(2.0) ** (1.0 / rho)
        return float(concordance_index(y[DURATION_COL], median, y[EVENT_COL]))

    def mtbf(
        self, group: Hashable | None = None, alpha: float = 0.05
    ) -> tuple[float, float, float]:
        """Mean time between failures in days, with a ``1 - alpha`` confidence interval.

        :math:`M = \\lambda\\,\\Gamma(1 + 1/\\rho)`; the interval is
        :math:`M \\exp(\\pm z_{1-\\alpha/2}\\,\\mathrm{se}(M)/M)`, with :math:`\\mathrm{se}(M)` by
        the delta method from the fit's covariance of :math:`(\\lambda, \\rho)`, using
        :math:`\\partial M/\\partial\\lambda = \\Gamma(1 + 1/\\rho)` and
        :math:`\\partial M/\\partial\\rho = -\\lambda\\,\\Gamma(1 + 1/\\rho)\\,
        \\psi(1 + 1/\\rho)/\\rho^2`.

        Returns
        -------
        tuple of float
            ``(estimate, lower, upper)``.
        """
        check_fitted(self)
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        fitter = self.fitter_ if group is None else self.group_fitters_.get(group)
        if fitter is None:
            raise KeyError(f"no fit for group {group!r}; fitted: {list(self.group_fitters_)}")
        lam, rho = float(fitter.lambda_), float(fitter.rho_)
        g = 1.0 + 1.0 / rho
        estimate = lam * float(gamma(g))
        grad = np.array([gamma(g), -lam * gamma(g) * digamma(g) / rho**2])
        cov = fitter.variance_matrix_.loc[["lambda_", "rho_"], ["lambda_", "rho_"]].to_numpy()
        se = float(np.sqrt(grad @ cov @ grad))
        half = float(norm.ppf(1.0 - alpha / 2.0)) * se / estimate
        return estimate, estimate * float(np.exp(-half)), estimate * float(np.exp(half))
