"""Backtest a risk model on inventory records: fit before a cutoff, score what came after.

At cutoff :math:`c` with horizon :math:`H`:

1. fit only on what was known before :math:`c`;
2. score every unit in service at :math:`c` that had not failed; its label is
   :math:`y_i = 1` iff its first failure falls in :math:`(c, c + H]`;
3. compare its risk (P(failure within :math:`H`)) with :math:`y_i`: ROC AUC, average
   precision, expected calibration error (:func:`expected_calibration_error`), precision@k
   (share of failures among the k riskiest) and Harrell's concordance against the time to
   failure after :math:`c` (censored at :math:`H`).

Two kinds of model are fitted differently:

* a survival model (:class:`~fleetwatch.models.base.SurvivalModel`, e.g. the Weibull AFT) is
  fitted on :func:`~fleetwatch.models.features.survival_frame` at :math:`c` with the covariates
  ``features`` (default :data:`~fleetwatch.models.features.MODEL_COLUMNS`), and its risk is
  conditional on the unit's age, :math:`1 - S_i(a_i + H)/S_i(a_i)`;
* a landmark model (:class:`LandmarkModel`, e.g.
  :class:`~fleetwatch.models.landmark_risk.LandmarkRisk`, the default) is fitted on
  :func:`~fleetwatch.models.landmarks.landmark_training_frame` (the fleet at month starts
  before :math:`c`, outcomes as known at :math:`c`) and scores the covariates of
  :func:`~fleetwatch.models.landmark_features.landmark_features` at :math:`c`.

Baselines run the same way: ``aft`` (today's Weibull AFT on location and history covariates,
:data:`~fleetwatch.models.features.MODEL_COLUMNS`), ``age_only`` (pooled :class:`WeibullRisk`,
ranks by age) and ``location_only`` (:class:`WeibullAFTRisk` on location covariates, scored at
age 0, so the ranking ignores age).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, Self, runtime_checkable

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
from fleetwatch.models.landmark_features import feature_columns
from fleetwatch.models.landmarks import (
    FeatureCache,
    cached_landmark_features,
    landmark_training_frame,
)
from fleetwatch.models.snapshot import prepare_records
from fleetwatch.models.weibull import WeibullRisk

__all__ = [
    "ECE_BINS",
    "BacktestResult",
    "LandmarkModel",
    "Metrics",
    "backtest",
    "default_model",
    "expected_calibration_error",
    "score_risks",
]

ECE_BINS = 10
AFT_PENALIZER = 0.01


@runtime_checkable
class LandmarkModel(Protocol):
    """A model fitted on landmark rows (:mod:`fleetwatch.models.landmarks`), not lifetimes.

    ``groups`` names its covariates (:data:`~fleetwatch.models.landmark_features.FEATURE_GROUPS`),
    ``landmark_freq`` the grid of its training landmarks and ``horizons`` the horizons it fits;
    ``training_rows`` is ``"landmarks"``.
    """

    training_rows: ClassVar[str]
    groups: Sequence[str]
    horizons: Sequence[float]
    landmark_freq: str

    def fit(self, X: pd.DataFrame, y: pd.DataFrame) -> Self: ...

    def predict_risk(self, X: pd.DataFrame, horizon_days: float) -> NDArray[np.float64]: ...

    def set_params(self, **params: object) -> Self: ...

    def get_params(self, deep: bool = True) -> dict[str, object]: ...


ModelFactory = Callable[[], SurvivalModel | LandmarkModel]


@dataclass(frozen=True)
class Metrics:
    """Ranking quality and calibration of one model's risks; NaN where only one class is present
    (``ece`` is defined whenever there are risks)."""

    auc: float
    average_precision: float
    precision_at_k: float
    concordance: float
    k: int
    n: int
    n_failures: int
    ece: float = math.nan


@dataclass(frozen=True)
class BacktestResult:
    """Outcome of :func:`backtest`.

    ``risks`` is indexed by serial with ``age_days``, ``label`` (failed in the window),
    ``days_to_failure`` (NaN if none) and one risk column per model (``model``, and with the
    baselines ``aft``, ``age_only``, ``location_only``); ``metrics`` maps the same names to
    :class:`Metrics`. ``n_train`` and ``n_train_failures`` count the model's training rows and
    their failures (for a landmark model: unit-landmark rows, and failures within the horizon
    among those whose window was complete).
    """

    cutoff: pd.Timestamp
    horizon_days: float
    n_train: int
    n_train_failures: int
    risks: pd.DataFrame
    metrics: dict[str, Metrics] = field(default_factory=dict)


def expected_calibration_error(
    risk: NDArray[np.float64], label: NDArray[np.bool_], bins: int = ECE_BINS
) -> float:
    """Expected calibration error over ``bins`` equal-count bins of the risks.

    Units are sorted by risk (stable on ties) and cut into ``bins`` groups of as equal a size as
    possible (``numpy.array_split``); with :math:`n_b` units, mean risk :math:`\\bar p_b` and
    failure share :math:`\\bar y_b` in bin :math:`b`,

    .. math:: \\mathrm{ECE} = \\sum_b \\frac{n_b}{n}\\,\\left|\\bar p_b - \\bar y_b\\right|

    Equal-count bins, not equal-width: failures are rare, so nearly every risk falls in the
    first tenth of [0, 1] and equal-width bins would compare little more than the overall
    mean. NaN for no units.

    Examples
    --------
    >>> expected_calibration_error(np.array([0.1, 0.1, 0.9, 0.9]), np.array([0, 0, 1, 0]), 2)
    0.25
    """
    p = np.asarray(risk, dtype=np.float64)
    y = np.asarray(label, dtype=np.float64)
    if len(p) != len(y):
        raise ValueError(f"risk has {len(p)} values but label {len(y)}")
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    if len(p) == 0:
        return math.nan
    order = np.argsort(p, kind="stable")
    total = 0.0
    for part in np.array_split(order, min(bins, len(p))):
        total += len(part) * abs(float(p[part].mean()) - float(y[part].mean()))
    return total / len(p)


def score_risks(
    risk: NDArray[np.float64],
    label: NDArray[np.bool_],
    days_to_event: NDArray[np.float64],
    k: int,
) -> Metrics:
    """AUC, average precision, precision@k, concordance and ECE of ``risk`` against outcomes.

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
    ece = expected_calibration_error(risk, label)
    return Metrics(auc, ap, p_at_k, cindex, k_eff, n, n_pos, ece)


def _age_only() -> SurvivalModel:
    return WeibullRisk()


def _location_only() -> SurvivalModel:
    return WeibullAFTRisk(penalizer=AFT_PENALIZER)


def default_model() -> LandmarkModel:
    """The backtest's model: :class:`~fleetwatch.models.landmark_risk.LandmarkRisk` as chosen
    on the earlier Titan splits (BENCHMARKS.md, "Titan forward splits (issue 40)")."""
    from fleetwatch.models.landmark_risk import LandmarkRisk

    return LandmarkRisk()


def backtest(
    records: pd.DataFrame,
    cutoff: pd.Timestamp | str,
    horizon_days: float,
    model_factory: ModelFactory = default_model,
    *,
    features: Sequence[str] = MODEL_COLUMNS,
    k: int = 100,
    baselines: bool = True,
    landmark_start: pd.Timestamp | str | None = None,
    cache: FeatureCache | None = None,
    aft_penalizer: float = AFT_PENALIZER,
    fitted: dict[tuple[object, ...], LandmarkModel] | None = None,
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
        Returns an unfitted :class:`~fleetwatch.models.base.SurvivalModel` or
        :class:`LandmarkModel` (default :func:`default_model`). A landmark model whose
        ``horizons`` include ``horizon_days`` fits them all (so that its risks at several
        horizons come from one model and never fall as the horizon grows); otherwise it is set
        to fit ``horizon_days`` alone.
    features : sequence of str
        For a survival model: covariate columns of the survival frame handed to it (plus
        ``age_days`` when predicting); by default location and the history covariates of
        :data:`~fleetwatch.models.features.MODEL_COLUMNS`, all known before ``cutoff``. A
        covariate that is constant in training at this cutoff is left out of the fit. A
        landmark model takes its own ``groups`` instead.
    k : int
        For precision@k.
    baselines : bool
        Also run the ``aft``, ``age_only`` and ``location_only`` baselines.
    landmark_start : Timestamp or str, optional
        First landmark of a landmark model's training rows (default: the first insertion).
    cache : dict, optional
        Landmark covariates by date, reused across calls on the same ``records``
        (:func:`~fleetwatch.models.landmarks.landmark_training_frame`).
    aft_penalizer : float
        Elastic-net strength of the ``aft`` baseline.
    fitted : dict, optional
        Landmark models fitted by earlier calls, by cutoff, first landmark and parameters;
        filled and reused, so that calls for each horizon of one model fit it once.

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
    model = model_factory()
    landmark = isinstance(model, LandmarkModel) and model.training_rows == "landmarks"
    history = baselines or any(c in HISTORY_COLUMNS for c in wanted)
    frame = survival_frame(records, cut, history=history)
    y_train = frame[["duration", "event"]]

    at_risk = frame[frame["in_service"]]
    failure = failures_in_window(records, cut, end).reindex(at_risk.index)
    label = failure.notna().to_numpy()
    days = ((failure - cut) / pd.Timedelta(days=1)).to_numpy(dtype=np.float64)
    days_to_event = np.where(label, days, float(horizon_days))

    risks = pd.DataFrame(
        {AGE_COL: at_risk[AGE_COL], "label": label, "days_to_failure": days}, index=at_risk.index
    )
    metrics: dict[str, Metrics] = {}

    def record(name: str, risk: NDArray[np.float64]) -> None:
        risks[name] = risk
        metrics[name] = score_risks(risk, label, days_to_event, k)

    if landmark:
        assert isinstance(model, LandmarkModel)
        if float(horizon_days) not in {float(h) for h in model.horizons}:
            model.set_params(horizons=(float(horizon_days),))
        prepared = prepare_records(records)
        X_fit, y_fit = landmark_training_frame(
            prepared,
            cut,
            start=landmark_start,
            min_horizon_days=min(model.horizons),
            freq=model.landmark_freq,
            groups=model.groups,
            cache=cache,
        )
        key = (cut, landmark_start, repr(sorted(model.get_params().items())))
        if fitted is not None and key in fitted:
            model = fitted[key]
        else:
            model.fit(X_fit, y_fit)
            if fitted is not None:
                fitted[key] = model
        X_now = _landmark_rows(prepared, cut, model.groups, at_risk.index, cache)
        record("model", model.predict_risk(X_now, horizon_days))
        complete = y_fit["follow_up"] >= horizon_days
        n_train = int(complete.sum())
        n_train_failures = int(
            (complete & y_fit["event"] & (y_fit["duration"] <= horizon_days)).sum()
        )
    else:
        used = [c for c in wanted if frame[c].nunique() > 1] or wanted
        X_now = at_risk[used].assign(**{AGE_COL: at_risk[AGE_COL]})
        record("model", model.fit(frame[used], y_train).predict_risk(X_now, horizon_days))
        n_train, n_train_failures = len(frame), int(frame["event"].sum())
    if baselines:
        aft_cols = [c for c in MODEL_COLUMNS if frame[c].nunique() > 1]
        X_aft = at_risk[aft_cols].assign(**{AGE_COL: at_risk[AGE_COL]})
        # a covariate constant in training (e.g. one row of cabinets) says nothing: left out
        loc = [c for c in LOCATION_COLUMNS if frame[c].nunique() > 1] or list(LOCATION_COLUMNS)
        runs: list[tuple[str, ModelFactory, pd.DataFrame, pd.DataFrame]] = [
            ("aft", lambda: WeibullAFTRisk(penalizer=aft_penalizer), frame[aft_cols], X_aft),
            ("age_only", _age_only, frame.iloc[:, :0], at_risk[[AGE_COL]]),
            ("location_only", _location_only, frame[loc], at_risk[loc]),
        ]
        for name, factory, X_fit_b, X_pred in runs:
            record(name, factory().fit(X_fit_b, y_train).predict_risk(X_pred, horizon_days))
    return BacktestResult(
        cutoff=cut,
        horizon_days=float(horizon_days),
        n_train=n_train,
        n_train_failures=n_train_failures,
        risks=risks,
        metrics=metrics,
    )


def _landmark_rows(
    prepared: pd.DataFrame,
    cut: pd.Timestamp,
    groups: Sequence[str],
    index: pd.Index,
    cache: FeatureCache | None,
) -> pd.DataFrame:
    """Landmark covariates at the cutoff for the units in ``index`` (the survival frame's units
    in service: the same set, checked)."""
    full = cached_landmark_features(prepared, cut, cache)
    rows = full[list(feature_columns(groups))]
    missing = index.difference(rows.index)
    if len(missing):
        raise ValueError(
            f"{len(missing)} units in service at {cut} have no landmark covariates "
            f"(first: {missing[0]!r}); the inventory records are inconsistent"
        )
    return rows.loc[index]
