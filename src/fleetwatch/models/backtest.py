"""Backtest a survival model on inventory records: fit before a cutoff, score what came after.

At cutoff :math:`c` with horizon :math:`H`:

1. fit on :func:`~fleetwatch.models.features.survival_frame` at :math:`c` (no later knowledge);
2. score every unit in service at :math:`c` that had not failed; its label is
   :math:`y_i = 1` iff its first failure falls in :math:`(c, c + H]`;
3. compare ``risk_i = 1 - S_i(a_i + H)/S_i(a_i)`` with :math:`y_i`: ROC AUC, average precision,
   precision@k (share of failures among the k riskiest) and Harrell's concordance against the
   time to failure after :math:`c` (censored at :math:`H`).

The model's covariates default to :data:`~fleetwatch.models.features.MODEL_COLUMNS`: location
plus history covariates (:mod:`fleetwatch.models.history_features`) computed only from records
known before :math:`c`, for training and scored units alike.

Two baselines run the same way: ``age_only`` (pooled :class:`WeibullRisk`, ranks by age) and
``location_only`` (:class:`WeibullAFTRisk` on location covariates, scored at age 0, so the
ranking ignores age).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from lifelines.utils import concordance_index
from numpy.typing import NDArray
from sklearn.metrics import average_precision_score, roc_auc_score

from fleetwatch.models.aft import WeibullAFTRisk
from fleetwatch.models.base import AGE_COL, SurvivalModel
from fleetwatch.models.features import (
    HISTORY_COLUMNS,
    LOCATION_COLUMNS,
    MODEL_COLUMNS,
    failures_in_window,
    survival_frame,
)
from fleetwatch.models.weibull import WeibullRisk

__all__ = ["BacktestResult", "Metrics", "backtest", "score_risks"]

ModelFactory = Callable[[], SurvivalModel]


@dataclass(frozen=True)
class Metrics:
    """Ranking quality of one model's risks; NaN where only one class is present."""

    auc: float
    average_precision: float
    precision_at_k: float
    concordance: float
    k: int
    n: int
    n_failures: int


@dataclass(frozen=True)
class BacktestResult:
    """Outcome of :func:`backtest`.

    ``risks`` is indexed by serial with ``age_days``, ``label`` (failed in the window),
    ``days_to_failure`` (NaN if none) and one risk column per model (``model``, ``age_only``,
    ``location_only``); ``metrics`` maps the same names to :class:`Metrics`.
    """

    cutoff: pd.Timestamp
    horizon_days: float
    n_train: int
    n_train_failures: int
    risks: pd.DataFrame
    metrics: dict[str, Metrics] = field(default_factory=dict)


def score_risks(
    risk: NDArray[np.float64],
    label: NDArray[np.bool_],
    days_to_event: NDArray[np.float64],
    k: int,
) -> Metrics:
    """AUC, average precision, precision@k and concordance of ``risk`` against outcomes.

    ``days_to_event`` is the time to failure for positives and the horizon for the rest.
    """
    n, n_pos = len(risk), int(label.sum())
    k_eff = min(k, n)
    top = np.argsort(-risk, kind="stable")[:k_eff]
    p_at_k = float(label[top].mean()) if k_eff else math.nan
    if 0 < n_pos < n:
        auc = float(roc_auc_score(label, risk))
        ap = float(average_precision_score(label, risk))
        cindex = float(concordance_index(days_to_event, -risk, label))
    else:
        auc = ap = cindex = math.nan
    return Metrics(auc, ap, p_at_k, cindex, k_eff, n, n_pos)


def _age_only() -> SurvivalModel:
    return WeibullRisk()


def _location_only() -> SurvivalModel:
    return WeibullAFTRisk(penalizer=0.01)


def backtest(
    records: pd.DataFrame,
    cutoff: pd.Timestamp | str,
    horizon_days: float,
    model_factory: ModelFactory,
    *,
    features: Sequence[str] = MODEL_COLUMNS,
    k: int = 100,
    baselines: bool = True,
) -> BacktestResult:
    """Fit ``model_factory()`` on data known before ``cutoff``; score the next ``horizon_days``.

    Parameters
    ----------
    records : pandas.DataFrame
        Inventory records (:data:`~fleetwatch.models.features.RECORD_COLUMNS`).
    cutoff : Timestamp or str
        Training sees only what was known before it; scoring covers ``(cutoff, cutoff + H]``.
    horizon_days : float
        :math:`H`, in days (> 0).
    model_factory : callable
        Returns an unfitted :class:`~fleetwatch.models.base.SurvivalModel`.
    features : sequence of str
        Covariate columns of the survival frame handed to the model (plus ``age_days`` when
        predicting); by default location and the history covariates of
        :data:`~fleetwatch.models.features.MODEL_COLUMNS`, all known before ``cutoff``. A
        covariate that is constant in training at this cutoff is left out of the fit.
    k : int
        For precision@k.
    baselines : bool
        Also run the ``age_only`` and ``location_only`` baselines.

    Raises
    ------
    ValueError
        If the horizon is not positive or reaches past the last timestamp in ``records``.
    """
    if not horizon_days > 0:
        raise ValueError(f"horizon_days must be > 0, got {horizon_days}")
    cut = pd.Timestamp(cutoff)
    end = cut + pd.Timedelta(days=horizon_days)
    data_end = records["removed"].max()
    if end > data_end:
        raise ValueError(
            f"cutoff + horizon ({end}) is past the end of the records ({data_end}); "
            "choose an earlier cutoff or a shorter horizon"
        )
    wanted = list(features)
    frame = survival_frame(records, cut, history=any(c in HISTORY_COLUMNS for c in wanted))
    used = [c for c in wanted if frame[c].nunique() > 1] or wanted
    X_train = frame[used]
    y_train = frame[["duration", "event"]]

    at_risk = frame[frame["in_service"]]
    X_now = at_risk[used].assign(**{AGE_COL: at_risk[AGE_COL]})
    failure = failures_in_window(records, cut, end).reindex(at_risk.index)
    label = failure.notna().to_numpy()
    days = ((failure - cut) / pd.Timedelta(days=1)).to_numpy(dtype=np.float64)
    days_to_event = np.where(label, days, float(horizon_days))

    risks = pd.DataFrame(
        {AGE_COL: at_risk[AGE_COL], "label": label, "days_to_failure": days}, index=at_risk.index
    )
    runs: list[tuple[str, ModelFactory, pd.DataFrame, pd.DataFrame]] = [
        ("model", model_factory, X_train, X_now)
    ]
    if baselines:
        loc = list(LOCATION_COLUMNS)
        runs.append(("age_only", _age_only, X_train.iloc[:, :0], X_now[[AGE_COL]]))
        runs.append(("location_only", _location_only, frame[loc], at_risk[loc]))
    metrics: dict[str, Metrics] = {}
    for name, factory, X_fit, X_pred in runs:
        model = factory().fit(X_fit, y_train)
        risk = model.predict_risk(X_pred, horizon_days)
        risks[name] = risk
        metrics[name] = score_risks(risk, label, days_to_event, k)
    return BacktestResult(
        cutoff=cut,
        horizon_days=float(horizon_days),
        n_train=len(frame),
        n_train_failures=int(frame["event"].sum()),
        risks=risks,
        metrics=metrics,
    )
