"""Scoring a fitted landmark model with numpy alone: risk at any horizon, and why.

A landmark model (:class:`~fleetwatch.models.landmark_risk.LandmarkRisk`) is, once fitted, one
tree ensemble per horizon :math:`H_1 < H_2 < \\dots` and a Platt map each. For a row :math:`x`,
horizon :math:`H_i` gives :math:`p_i = \\sigma(a_i f_i(x) + b_i)` and a cumulative hazard
:math:`\\Lambda_i = -\\ln(1 - p_i)`, made non-decreasing in :math:`i`. Between horizons
:math:`\\Lambda` is linear in :math:`t` from :math:`\\Lambda(0) = 0`; past the longest it grows
at its average rate :math:`\\Lambda_{\\max} / H_{\\max}`. So

.. math:: \\mathrm{risk}(t) = 1 - e^{-\\Lambda(t)}

never falls as :math:`t` grows, whatever the separate classifiers say.

:class:`LandmarkScorer` holds only that, and is what the server loads from a stored model
version: it imports neither scikit-learn nor lifelines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from fleetwatch.models.base import ModelFitError, check_times, current_ages
from fleetwatch.models.tree_ensemble import TreeEnsemble

__all__ = ["SCORER_FORMAT", "LandmarkScorer"]

SCORER_FORMAT = 1
_EPS = 1e-9


@dataclass(frozen=True)
class LandmarkScorer:
    feature_names: tuple[str, ...]
    ensembles: Mapping[float, TreeEnsemble]
    calibration: Mapping[float, tuple[float, float]]
    """Per horizon, Platt ``(a, b)``; ``(1, 0)`` when not calibrated."""

    def _x(self, X: pd.DataFrame) -> NDArray[np.float64]:
        missing = [c for c in self.feature_names if c not in X.columns]
        if missing:
            raise ValueError(f"X lacks covariate(s) {missing} used in fit")
        current_ages(X)  # refuses negative or missing ages with an actionable message
        out: NDArray[np.float64] = X[list(self.feature_names)].to_numpy(dtype=np.float64)
        return out

    def cumulative_hazards(
        self, X: pd.DataFrame
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Fitted horizons (with 0 first) and :math:`\\Lambda` per row at each, non-decreasing."""
        x = self._x(X)
        horizons = sorted(self.ensembles)
        cols = [np.zeros(len(x))]
        for h in horizons:
            a, b = self.calibration[h]
            raw = self.ensembles[h].decision_function(x)
            p = 1.0 / (1.0 + np.exp(-(a * raw + b)))
            cols.append(-np.log1p(-np.clip(p, 0.0, 1.0 - _EPS)))
        hazard = np.maximum.accumulate(np.column_stack(cols), axis=1)
        return np.asarray([0.0, *horizons]), hazard

    def survival(self, X: pd.DataFrame, times: Sequence[float]) -> NDArray[np.float64]:
        """:math:`e^{-\\Lambda(t)}` per row and time; shape (rows, times)."""
        t = check_times(times)
        grid, hazard = self.cumulative_hazards(X)
        rate = hazard[:, -1] / grid[-1]
        out = np.empty((len(hazard), len(t)))
        for j, tj in enumerate(t):
            if tj >= grid[-1]:
                out[:, j] = hazard[:, -1] + rate * (tj - grid[-1])
                continue
            k = int(np.searchsorted(grid, tj, side="right"))
            w = (tj - grid[k - 1]) / (grid[k] - grid[k - 1])
            out[:, j] = (1.0 - w) * hazard[:, k - 1] + w * hazard[:, k]
        return np.asarray(np.exp(-out), dtype=np.float64)

    def risk(self, X: pd.DataFrame, horizon_days: float) -> NDArray[np.float64]:
        """P(failure within ``horizon_days``), in [0, 1]."""
        risk = 1.0 - self.survival(X, [horizon_days])[:, 0]
        return np.asarray(np.clip(risk, 0.0, 1.0), dtype=np.float64)

    def classifier_horizon(self, horizon_days: float) -> float:
        """The fitted horizon whose classifier speaks for ``horizon_days``: the shortest one at
        least as long, else the longest."""
        longer = [h for h in sorted(self.ensembles) if h >= horizon_days]
        return longer[0] if longer else max(self.ensembles)

    def contributions(self, X: pd.DataFrame, horizon_days: float) -> tuple[float, pd.DataFrame]:
        """Each covariate's path contribution to the log-odds of failure within the horizon of
        :meth:`classifier_horizon` (:meth:`TreeEnsemble.contributions
        <fleetwatch.models.tree_ensemble.TreeEnsemble.contributions>`, before the Platt map):
        ``(bias, frame)`` with one column per covariate; > 0 raises the risk."""
        h = self.classifier_horizon(horizon_days)
        bias, out = self.ensembles[h].contributions(self._x(X))
        return bias, pd.DataFrame(out, index=X.index, columns=list(self.feature_names))

    def to_params(self) -> dict[str, Any]:
        """JSON-safe dict for :meth:`from_params`."""
        return {
            "format": SCORER_FORMAT,
            "feature_names": list(self.feature_names),
            "horizons": {
                f"{h:g}": {
                    "trees": self.ensembles[h].to_params(),
                    "platt": list(self.calibration[h]),
                }
                for h in sorted(self.ensembles)
            },
        }

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> LandmarkScorer:
        """The scorer :meth:`to_params` described.

        Raises
        ------
        ModelFitError
            If the params are of a format this version does not read.
        """
        if params.get("format") != SCORER_FORMAT:
            raise ModelFitError(
                f"landmark model params have format {params.get('format')!r}; this version "
                f"reads {SCORER_FORMAT}: refit the model"
            )
        parts = {float(h): v for h, v in params["horizons"].items()}
        return cls(
            feature_names=tuple(params["feature_names"]),
            ensembles={h: TreeEnsemble.from_params(v["trees"]) for h, v in parts.items()},
            calibration={h: (float(v["platt"][0]), float(v["platt"][1])) for h, v in parts.items()},
        )
