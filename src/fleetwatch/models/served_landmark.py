"""The landmark model the server fits on its own fleet, next to the Weibull fits and the AFT.

Trained on :mod:`fleetwatch.models.telemetry_landmarks` rows (every GPU at each past midnight,
its age and telemetry then, whether it failed within the horizon), it learns directly what the
server asks at scoring time: P(failure within :math:`H` | in service now, age and telemetry now).
The AFT instead learns from each lifetime's last window before its end, a window that for a
failure lies just before it, and scores the window before now: the two see different things.

One classifier per horizon of :data:`~fleetwatch.models.landmark_risk.LandmarkRisk`; a horizon
needs :data:`~fleetwatch.models.landmarks.MIN_FAILURES` failures within it among the rows,
else there is no landmark part and the bundle scores by the AFT or the Weibull fits. The
hyper-parameters below were chosen on one simulated fleet (seed 0) and checked on another
(seed 1): BENCHMARKS.md, "The served landmark model".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from fleetwatch.models.base import AGE_COL, ModelFitError
from fleetwatch.models.landmark_scoring import LandmarkScorer
from fleetwatch.models.landmarks import (
    LANDMARK_COL,
    MIN_FAILURES,
    failures_within,
    too_few_failures,
)

__all__ = ["SERVED_HYPERPARAMETERS", "fit_served_landmark"]

SERVED_HYPERPARAMETERS: dict[str, Any] = {
    "max_leaf_nodes": 7,
    "min_samples_leaf": 50,
    "learning_rate": 0.05,
    "max_iter": 100,
    "l2_regularization": 1.0,
}


def fit_served_landmark(
    X: pd.DataFrame, y: pd.DataFrame, horizons_days: Sequence[float]
) -> tuple[LandmarkScorer | None, dict[str, Any]]:
    """The fitted scorer and its metrics; None and the reason when it cannot be fitted.

    Rows are taken as given (already sampled, ``y["weight"]`` their inverse sampling
    probability), so the classifier keeps every row it is handed.
    """
    failures = {f"{h:g}": failures_within(y, h) for h in horizons_days}
    metrics: dict[str, Any] = {
        "n": len(X),
        "landmarks": int(y[LANDMARK_COL].nunique()) if len(y) else 0,
        "failures_within": failures,
        "covariates": [str(c) for c in X.columns],
    }
    if len(X) == 0:
        return None, {**metrics, "error": "no GPU was in service at any landmark"}
    fewest = min(horizons_days, key=lambda h: failures[f"{h:g}"])
    if failures[f"{fewest:g}"] < MIN_FAILURES:
        # Said before scikit-learn is imported: most refits of a young fleet end here.
        error = too_few_failures(failures[f"{fewest:g}"], fewest)
        return None, {**metrics, "error": f"ModelFitError: {error}"}
    from fleetwatch.models.landmark_risk import LandmarkRisk  # scikit-learn: only when fitting

    # A covariate no GPU reported tells the trees nothing (and cannot be binned).
    unreported = [str(c) for c in X.columns if c != AGE_COL and X[c].isna().all()]
    metrics["covariates"] = [c for c in metrics["covariates"] if c not in unreported]
    metrics["unreported"] = unreported
    model = LandmarkRisk(
        groups=(), horizons=tuple(horizons_days), negative_fraction=1.0, **SERVED_HYPERPARAMETERS
    )
    try:
        model.fit(X.drop(columns=unreported), y)
    except (ModelFitError, ValueError) as exc:
        # The refit still stores the Weibull fits and the AFT; the metrics say why this part
        # is missing.
        return None, {**metrics, "error": f"{type(exc).__name__}: {exc}"}
    return model.scorer(), metrics
