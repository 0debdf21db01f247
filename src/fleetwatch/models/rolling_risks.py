"""Weekly risks over a forward split of inventory records, for :mod:`.drain_budget`.

A forward split is a cutoff :math:`c` and a span :math:`S`: the model is fitted on what was known
before :math:`c` (:func:`~fleetwatch.models.features.survival_frame`, as
:func:`~fleetwatch.models.backtest.backtest` does), then at each decision time
:math:`t_i = c + i\\,\\delta` with :math:`t_i < c + S` (:math:`\\delta` = 7 days) the units in
service at :math:`t_i` are scored with covariates recomputed as of :math:`t_i`: age, location
and the history covariates from the records known before :math:`t_i` (nothing after
:math:`t_i` reaches a score at :math:`t_i`). The risk is :math:`P(\\text{failure within } H)`
for each horizon :math:`H` asked for, and each unit's failure time is its first failure after
:math:`c` (a unit in service at :math:`t_i` has not failed before it).

By default the model is fitted **once, at the cutoff**, and only the scoring moves weekly: a
weekly refit of today's AFT is 2-3 s a week on Titan, about 25 weeks a split. ``refit="weekly"``
refits at every decision time on what was known then.

Rankings, each a sequence of :class:`~fleetwatch.models.drain_budget.WeekRisks`:

``model``
    the ``model_factory`` model (any :class:`~fleetwatch.models.base.SurvivalModel`);
``age_only``
    a pooled :class:`~fleetwatch.models.weibull.WeibullRisk` on age (ranks by age alone);
``random``
    uniform draws from ``numpy.random.default_rng(seed)``, one per unit and week.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd

from fleetwatch.models.base import AGE_COL, DURATION_COL, EVENT_COL, SurvivalModel
from fleetwatch.models.drain_budget import WeekRisks
from fleetwatch.models.features import (
    HISTORY_COLUMNS,
    MODEL_COLUMNS,
    failures_in_window,
    survival_frame,
)
from fleetwatch.models.weibull import WeibullRisk

__all__ = ["RANKINGS", "RollingRisks", "weekly_risks"]

RANKINGS = ("model", "age_only", "random")
_DAY = pd.Timedelta(days=1)

ModelFactory = Callable[[], SurvivalModel]
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class RollingRisks:
    """Outcome of :func:`weekly_risks`.

    ``weeks[(ranking, H)]`` is the ranking's sequence of weeks for horizon ``H`` (days; times
    in days after the cutoff). ``fleet_size`` is the number of units in service at the cutoff.
    """

    cutoff: pd.Timestamp
    span_days: float
    step_days: float
    refit: str
    fleet_size: int
    n_train: int
    n_train_failures: int
    weeks: dict[tuple[str, float], list[WeekRisks]] = field(default_factory=dict)
    wall_s: float = 0.0


def _fit(
    factory: ModelFactory, frame: pd.DataFrame, used: list[str]
) -> tuple[SurvivalModel, SurvivalModel]:
    y = frame[[DURATION_COL, EVENT_COL]]
    model = factory().fit(frame[used], y)
    age_only = WeibullRisk().fit(frame[used].iloc[:, :0], y)
    return model, age_only


def weekly_risks(
    records: pd.DataFrame,
    cutoff: pd.Timestamp | str,
    span_days: float,
    horizons_days: Sequence[float],
    model_factory: ModelFactory,
    *,
    features: Sequence[str] = MODEL_COLUMNS,
    step_days: float = 7.0,
    refit: Literal["cutoff", "weekly"] = "cutoff",
    seed: int = 0,
    progress: Progress | None = None,
) -> RollingRisks:
    """Score the units in service at every decision time of a forward split (module doc).

    Parameters
    ----------
    records : pandas.DataFrame
        Inventory records (:data:`~fleetwatch.models.features.RECORD_COLUMNS`).
    cutoff : Timestamp or str
        :math:`c`: the first decision time; the model sees nothing after it (``refit="cutoff"``).
    span_days : float
        :math:`S`: decisions at :math:`c, c + \\delta, \\dots` before :math:`c + S`.
    horizons_days : sequence of float
        Risk horizons :math:`H` (days), one sequence of weeks per ranking and horizon.
    model_factory : callable
        Returns an unfitted :class:`~fleetwatch.models.base.SurvivalModel`.
    features : sequence of str
        Covariate columns of the survival frame (a column constant at the cutoff is left out).
    step_days : float
        :math:`\\delta`, days between decisions.
    refit : {"cutoff", "weekly"}
        Fit once at the cutoff, or at every decision time.
    seed : int
        Seed of the ``random`` ranking.
    progress : callable, optional
        Called with (decisions done, decisions) after each decision time.

    Raises
    ------
    ValueError
        If a span, step or horizon is not positive, or the last decision plus the longest
        horizon is past the end of the records (its outcomes would not be known).
    """
    hs = [float(h) for h in horizons_days]
    if not (span_days > 0 and step_days > 0 and hs and min(hs) > 0):
        raise ValueError("span_days, step_days and every horizon must be > 0")
    if refit not in ("cutoff", "weekly"):
        raise ValueError(f"refit must be 'cutoff' or 'weekly', got {refit!r}")
    started = time.perf_counter()
    cut = pd.Timestamp(cutoff)
    n = math.ceil(span_days / step_days)
    times = [cut + i * pd.Timedelta(days=step_days) for i in range(n)]
    end = times[-1] + pd.Timedelta(days=max(hs))
    data_end = records["removed"].max()
    if end > data_end:
        raise ValueError(
            f"the last decision ({times[-1]}) plus the longest horizon ({max(hs):g} days) is "
            f"past the end of the records ({data_end}); choose an earlier cutoff or a shorter span"
        )
    wanted = list(features)
    history = any(c in HISTORY_COLUMNS for c in wanted)
    failure = failures_in_window(records, cut, end)
    rng = np.random.default_rng(seed)

    frame = survival_frame(records, cut, history=history)
    used = [c for c in wanted if frame[c].nunique() > 1] or wanted
    model, age_only = _fit(model_factory, frame, used)
    n_train, n_train_failures = len(frame), int(frame[EVENT_COL].sum())
    fleet_size = int(frame["in_service"].sum())
    weeks: dict[tuple[str, float], list[WeekRisks]] = {(r, h): [] for r in RANKINGS for h in hs}
    for i, t in enumerate(times):
        if i:
            frame = survival_frame(records, t, history=history)
            if refit == "weekly":
                model, age_only = _fit(model_factory, frame, used)
        at_risk = frame[frame["in_service"]]
        X = at_risk[used].assign(**{AGE_COL: at_risk[AGE_COL]})
        units = list(at_risk.index)
        fails = failure.reindex(at_risk.index)
        fail_days = ((fails - cut) / _DAY).to_numpy(dtype=np.float64)
        at = float((t - cut) / _DAY)
        coin = rng.random(len(units))
        for h in hs:
            scores = {
                "model": model.predict_risk(X, h),
                "age_only": age_only.predict_risk(X[[AGE_COL]], h),
                "random": coin,
            }
            for name, risk in scores.items():
                weeks[(name, h)].append(
                    WeekRisks(at, units, np.asarray(risk, dtype=np.float64), fail_days)
                )
        if progress is not None:
            progress(i + 1, n)
    return RollingRisks(
        cutoff=cut,
        span_days=float(span_days),
        step_days=float(step_days),
        refit=refit,
        fleet_size=fleet_size,
        n_train=n_train,
        n_train_failures=n_train_failures,
        weeks=weeks,
        wall_s=time.perf_counter() - started,
    )
