"""P(failure within H) straight from a classifier trained on past landmarks (gradient boosting).

For each horizon :math:`H` of ``horizons`` one ``HistGradientBoostingClassifier`` learns
:math:`p_H(x) = P(\\text{failure in } (\\ell, \\ell + H] \\mid x_\\ell)` from landmark rows
(:mod:`fleetwatch.models.landmarks`): label 1 if ``event`` and ``duration <= H``, else 0,
over the rows whose ``follow_up`` is at least :math:`H` (their window is complete; a landmark
too recent for :math:`H` is left out whole, failures and survivors alike). Without a
``follow_up`` column (a plain survival frame), rows censored before :math:`H` are left out.
Negatives are subsampled (``negative_fraction``, weight :math:`1/\\text{fraction}` so that
probabilities keep their scale); failures are rare and the fit is many times faster. Rows that
were already sampled when they were built carry their inverse sampling probability in
``y["weight"]``, which multiplies into the fit's weights.

Between and beyond the fitted horizons risk comes from a cumulative hazard made monotone in the
horizon (:mod:`fleetwatch.models.landmark_scoring`, which scores a fitted model with numpy
alone), so it never falls as the horizon grows, whatever the separate classifiers say.

With ``calibration_landmarks = k > 0`` the classifier is fitted on all but the last :math:`k`
landmarks whose windows are complete, and a Platt map :math:`p' = \\sigma(a\\,\\mathrm{logit}\\,p
+ b)` is fitted on those :math:`k` (out of time); that needs the ``landmark`` column in ``y``.

The fitted trees are kept as :class:`~fleetwatch.models.tree_ensemble.TreeEnsemble` arrays, so a
fitted model pickles small and :meth:`LandmarkRisk.to_params` is plain JSON that
:meth:`LandmarkRisk.from_params` scores with numpy alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar, Self

import numpy as np
import pandas as pd
from numpy.typing import NDArray
from sklearn.base import BaseEstimator

from fleetwatch.models.base import (
    DURATION_COL,
    EVENT_COL,
    ModelFitError,
    check_fitted,
)
from fleetwatch.models.landmark_features import FEATURE_GROUPS
from fleetwatch.models.landmark_scoring import LandmarkScorer
from fleetwatch.models.landmarks import (
    FOLLOW_UP_COL,
    LANDMARK_COL,
    MIN_FAILURES,
    WEIGHT_COL,
    too_few_failures,
)
from fleetwatch.models.tree_ensemble import TreeEnsemble

__all__ = ["DEFAULT_GROUPS", "MIN_FAILURES", "LandmarkRisk"]

DEFAULT_GROUPS = tuple(g for g in FEATURE_GROUPS if g != "cohort")
"""Covariate groups of the default model: every group but ``cohort``, the variant that scored best
on the earlier (dev) Titan splits, 2016-01 to 2017-01 (BENCHMARKS.md, "Titan forward splits
(issue 40)"); the hyper-parameter defaults below were chosen there too."""


class LandmarkRisk(BaseEstimator):  # type: ignore[misc]
    """Gradient-boosted landmark classifiers, one per horizon, with monotone interpolation.

    Parameters
    ----------
    groups : sequence of str
        Landmark covariate groups it is fitted on
        (:data:`~fleetwatch.models.landmark_features.FEATURE_GROUPS`); ``fit`` takes ``X`` as
        given, this tells callers which columns to build.
    horizons : sequence of float
        Horizons :math:`H` in days with a classifier each (> 0).
    landmark_freq : str
        Pandas frequency of the landmark grid its training rows come from (``"MS"``: month
        starts); tells callers how to build them.
    max_leaf_nodes, min_samples_leaf, learning_rate, max_iter, l2_regularization
        Passed to ``HistGradientBoostingClassifier`` (small trees: the signal is a few strong
        effects and their interactions, and noise is plentiful).
    negative_fraction : float
        Share of non-failing rows kept for fitting, in (0, 1].
    calibration_landmarks : int
        Latest complete landmarks held out for a Platt map (0: none).
    random_state : int
        Seeds the subsampling and the classifier.

    Attributes
    ----------
    ensembles_ : dict of float to TreeEnsemble
        Per horizon, the fitted trees.
    calibration_ : dict of float to (float, float)
        Per horizon, Platt ``(a, b)``; ``(1, 0)`` when not calibrated.
    feature_names_ : list of str
    n_failures_ : dict of float to int
        Per horizon, failures within it among the rows the classifier learned from.
    trained_at_ : datetime
    """

    training_rows: ClassVar[str] = "landmarks"

    def __init__(
        self,
        groups: Sequence[str] = DEFAULT_GROUPS,
        horizons: Sequence[float] = (90.0, 180.0),
        landmark_freq: str = "MS",
        max_leaf_nodes: int = 7,
        min_samples_leaf: int = 300,
        learning_rate: float = 0.05,
        max_iter: int = 150,
        l2_regularization: float = 1.0,
        negative_fraction: float = 0.2,
        calibration_landmarks: int = 0,
        random_state: int = 0,
    ) -> None:
        self.groups = groups
        self.horizons = horizons
        self.landmark_freq = landmark_freq
        self.max_leaf_nodes = max_leaf_nodes
        self.min_samples_leaf = min_samples_leaf
        self.learning_rate = learning_rate
        self.max_iter = max_iter
        self.l2_regularization = l2_regularization
        self.negative_fraction = negative_fraction
        self.calibration_landmarks = calibration_landmarks
        self.random_state = random_state

    def _check_params(self) -> list[float]:
        horizons = sorted({float(h) for h in self.horizons})
        if not horizons or any(not (math.isfinite(h) and h > 0) for h in horizons):
            raise ModelFitError(f"horizons must be positive days, got {list(self.horizons)}")
        if not 0.0 < self.negative_fraction <= 1.0:
            raise ModelFitError(
                f"negative_fraction must be in (0, 1], got {self.negative_fraction}"
            )
        if self.calibration_landmarks < 0:
            raise ModelFitError(
                f"calibration_landmarks must be >= 0, got {self.calibration_landmarks}"
            )
        return horizons

    def fit(self, X: pd.DataFrame, y: pd.DataFrame) -> Self:
        """Fit one classifier (and its Platt map) per horizon; return ``self``.

        ``y`` has ``duration`` (days from the landmark to the failure or to the end of
        follow-up), ``event`` (bool), ideally ``follow_up`` and, for calibration, ``landmark``
        (:func:`~fleetwatch.models.landmarks.landmark_training_frame` gives all four).

        Raises
        ------
        ModelFitError
            If the inputs are unusable or a horizon has fewer than :data:`MIN_FAILURES` failures.
        """
        horizons = self._check_params()
        x, duration, event = self._training_arrays(X, y)
        weight = np.ones(len(x))
        if WEIGHT_COL in y.columns:
            weight = pd.to_numeric(y[WEIGHT_COL], errors="coerce").to_numpy(np.float64)
            if not np.all(np.isfinite(weight) & (weight > 0)):
                raise ModelFitError(f"y[{WEIGHT_COL!r}] must be finite and > 0")
        follow_up = duration
        if FOLLOW_UP_COL in y.columns:
            follow_up = pd.to_numeric(y[FOLLOW_UP_COL], errors="coerce").to_numpy(np.float64)
        landmark = None
        if self.calibration_landmarks:
            if LANDMARK_COL not in y.columns:
                raise ModelFitError(
                    f"calibration_landmarks needs y[{LANDMARK_COL!r}]: build y with "
                    "landmark_training_frame"
                )
            landmark = pd.to_datetime(y[LANDMARK_COL]).to_numpy()
        ensembles: dict[float, TreeEnsemble] = {}
        calibration: dict[float, tuple[float, float]] = {}
        n_failures: dict[float, int] = {}
        for h in horizons:
            label = event & (duration <= h)
            complete = (follow_up >= h) if FOLLOW_UP_COL in y.columns else label | (duration >= h)
            n_pos = int(label[complete].sum())
            if n_pos < MIN_FAILURES:
                raise ModelFitError(too_few_failures(n_pos, h))
            fit_rows, cal_rows = complete, np.zeros_like(complete)
            if landmark is not None:
                held = np.unique(landmark[complete])[-self.calibration_landmarks :]
                cal_rows = complete & np.isin(landmark, held)
                fit_rows = complete & ~cal_rows
                if int(label[fit_rows].sum()) < MIN_FAILURES or not label[cal_rows].any():
                    raise ModelFitError(
                        f"too few failures within {h:g} days to hold out "
                        f"{self.calibration_landmarks} landmarks for calibration"
                    )
            # seeded per horizon: a horizon's classifier does not depend on the others fitted
            rng = np.random.default_rng([self.random_state, round(h * 1000)])
            ensembles[h] = self._fit_one(x[fit_rows], label[fit_rows], weight[fit_rows], rng)
            calibration[h] = (1.0, 0.0)
            if cal_rows.any():
                calibration[h] = _platt(
                    ensembles[h].decision_function(x[cal_rows]), label[cal_rows]
                )
            n_failures[h] = n_pos
        self.ensembles_ = ensembles
        self.calibration_ = calibration
        self.n_failures_ = n_failures
        self.trained_at_ = datetime.now(UTC)
        return self

    def _training_arrays(
        self, X: pd.DataFrame, y: pd.DataFrame
    ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_]]:
        if not isinstance(X, pd.DataFrame) or not isinstance(y, pd.DataFrame):
            raise ModelFitError("X and y must be pandas DataFrames")
        missing = [c for c in (DURATION_COL, EVENT_COL) if c not in y.columns]
        if missing:
            raise ModelFitError(f"y lacks column(s) {missing}; give duration (days) and event")
        if len(X) != len(y) or len(X) == 0:
            raise ModelFitError(f"X has {len(X)} rows and y {len(y)}; need the same, > 0")
        text = [c for c in X.columns if not pd.api.types.is_numeric_dtype(X[c])]
        if text:
            raise ModelFitError(f"X columns {text} are not numeric; encode them")
        duration = pd.to_numeric(y[DURATION_COL], errors="coerce").to_numpy(dtype=np.float64)
        if not np.all(np.isfinite(duration)) or np.any(duration < 0):
            raise ModelFitError("durations must be finite days >= 0")
        self.feature_names_ = [str(c) for c in X.columns]
        x = X.to_numpy(dtype=np.float64)
        return x, duration, y[EVENT_COL].astype(bool).to_numpy()

    def _fit_one(
        self,
        x: NDArray[np.float64],
        label: NDArray[np.bool_],
        row_weight: NDArray[np.float64],
        rng: np.random.Generator,
    ) -> TreeEnsemble:
        from sklearn.ensemble import HistGradientBoostingClassifier

        keep = label | (rng.random(len(label)) < self.negative_fraction)
        weight = np.where(label[keep], 1.0, 1.0 / self.negative_fraction) * row_weight[keep]
        model = HistGradientBoostingClassifier(
            max_leaf_nodes=self.max_leaf_nodes,
            min_samples_leaf=self.min_samples_leaf,
            learning_rate=self.learning_rate,
            max_iter=self.max_iter,
            l2_regularization=self.l2_regularization,
            early_stopping=False,
            random_state=self.random_state,
        )
        model.fit(x[keep], label[keep], sample_weight=weight)
        return TreeEnsemble.from_sklearn(model)

    def scorer(self) -> LandmarkScorer:
        """The fitted model's numpy-only scoring part, as the server stores and loads it."""
        check_fitted(self, ("ensembles_",))
        return LandmarkScorer(tuple(self.feature_names_), self.ensembles_, self.calibration_)

    def predict_survival(self, X: pd.DataFrame, times: Sequence[float]) -> NDArray[np.float64]:
        """:math:`e^{-\\Lambda(t)}` per row and time; shape (rows, times)."""
        return self.scorer().survival(X, times)

    def predict_risk(self, X: pd.DataFrame, horizon_days: float) -> NDArray[np.float64]:
        """P(failure within ``horizon_days``), in [0, 1]."""
        return self.scorer().risk(X, horizon_days)

    def contributions(self, X: pd.DataFrame, horizon_days: float) -> tuple[float, pd.DataFrame]:
        """:meth:`LandmarkScorer.contributions
        <fleetwatch.models.landmark_scoring.LandmarkScorer.contributions>`."""
        return self.scorer().contributions(X, horizon_days)

    def score(self, X: pd.DataFrame, y: pd.DataFrame) -> float:
        """Harrell's concordance of the largest horizon's risk with ``y``."""
        from lifelines.utils import concordance_index

        check_fitted(self, ("ensembles_",))
        risk = self.predict_risk(X, max(self.ensembles_))
        return float(concordance_index(y[DURATION_COL], -risk, y[EVENT_COL]))

    def to_params(self) -> dict[str, Any]:
        """Everything scoring needs, JSON-safe (:meth:`from_params`)."""
        return {
            **self.scorer().to_params(),
            "groups": list(self.groups),
            "landmark_freq": self.landmark_freq,
        }

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> LandmarkRisk:
        """A fitted model from :meth:`to_params`: its groups, grid and horizons as fitted, the
        other hyper-parameters at their defaults (they only matter for fitting)."""
        scorer = LandmarkScorer.from_params(params)
        model = cls(
            groups=tuple(params["groups"]),
            horizons=tuple(sorted(scorer.ensembles)),
            landmark_freq=str(params["landmark_freq"]),
        )
        model.feature_names_ = list(scorer.feature_names)
        model.ensembles_ = dict(scorer.ensembles)
        model.calibration_ = dict(scorer.calibration)
        model.n_failures_ = {}
        model.trained_at_ = datetime.now(UTC)
        return model


def _platt(raw: NDArray[np.float64], label: NDArray[np.bool_]) -> tuple[float, float]:
    """Platt ``(a, b)`` maximising the likelihood of ``label`` given :math:`\\sigma(a f + b)`."""
    from scipy.optimize import minimize

    y = label.astype(np.float64)

    def nll(theta: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        z = theta[0] * raw + theta[1]
        p = 1.0 / (1.0 + np.exp(-z))
        loss = float(np.sum(np.logaddexp(0.0, z) - y * z))
        g = p - y
        return loss, np.array([float(g @ raw), float(g.sum())])

    res = minimize(nll, np.array([1.0, 0.0]), jac=True, method="L-BFGS-B")
    return float(res.x[0]), float(res.x[1])
