"""Landmark rows of a fleet with telemetry: every GPU in service at each past midnight, its age
and telemetry then, and whether it failed soon after.

This is the served landmark model's training set (:mod:`fleetwatch.models.landmark_risk`), for a
fleet the server watches rather than an inventory: at a cutoff :math:`c` (a refit's "now"),
landmarks :math:`\\ell` are the UTC midnights of the ``span_days`` before :math:`c` that leave at
least the longest horizon of follow-up. A lifetime in service at :math:`\\ell` (installed before,
not removed by it) gives one row:

* covariates: ``age_days`` at :math:`\\ell` and the telemetry features of the ``window`` before
  :math:`\\ell` (:func:`~fleetwatch.models.telemetry_features.window_features`; whole hours ended
  by :math:`\\ell`), exactly what scoring at :math:`\\ell` would have seen;
* ``duration``: days from :math:`\\ell` to the lifetime's failure when it failed by :math:`c`,
  else the follow-up :math:`c - \\ell`; ``event``: it failed by :math:`c`; ``follow_up``;
  ``landmark``; ``weight``.

A lifetime ended by a repair or a retirement is not censored at its end: the label is "failed
within :math:`H`", as in the held-out evaluation (:func:`~fleetwatch.server.upkeep.training_frame
.window_outcomes`) and the inventory backtest.

A 10,000-GPU fleet over 90 days is 900,000 rows, each needing a week of hourly telemetry, and
failures are rare; so every row that fails within the longest horizon is kept and the others
are sampled with the probability that brings the total to about ``max_rows``, each kept one
weighted by the inverse of that probability (so probabilities keep their scale). Sampling comes
before the telemetry is read: only sampled rows cost a read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

import numpy as np
import pandas as pd

from fleetwatch.models.base import AGE_COL
from fleetwatch.models.landmarks import FOLLOW_UP_COL, LANDMARK_COL, WEIGHT_COL
from fleetwatch.models.telemetry_features import FEATURE_NAMES

__all__ = [
    "LANDMARK_FEATURES",
    "MIN_NEGATIVE_FRACTION",
    "TelemetryAt",
    "daily_landmarks",
    "landmark_units",
    "telemetry_landmark_rows",
]

LANDMARK_FEATURES: tuple[str, ...] = (AGE_COL, *FEATURE_NAMES)
"""The served landmark model's covariates: what the server has for every GPU it scores."""
MIN_NEGATIVE_FRACTION = 0.01
"""Never keep fewer than this share of the non-failing rows, however many failures there are."""
_DAY = timedelta(days=1)

TelemetryAt = Callable[[Sequence[str | None], datetime], list[dict[str, float]]]
"""GPU UUIDs (None: a lifetime without one) and a landmark to each GPU's window features before
it; a GPU that reported nothing gets ``{}``, never zeros."""


def daily_landmarks(cutoff: datetime, *, span_days: float, follow_up_days: float) -> list[datetime]:
    """UTC midnights in ``[cutoff - span_days, cutoff - follow_up_days]``, oldest first."""
    first = cutoff - timedelta(days=span_days)
    last = cutoff - timedelta(days=follow_up_days)
    day = first.replace(hour=0, minute=0, second=0, microsecond=0)
    if day < first:
        day += _DAY
    out = []
    while day <= last:
        out.append(day)
        day += _DAY
    return out


def landmark_units(
    lifetimes: pd.DataFrame,
    landmarks: Sequence[datetime],
    cutoff: datetime,
    *,
    longest_horizon_days: float,
    max_rows: int,
    seed: int = 0,
) -> pd.DataFrame:
    """The (lifetime, landmark) rows to learn from, sampled, with outcomes and weights.

    ``lifetimes`` has ``gpu_uuid`` (or None), ``installed_at``, ``removed_at`` (NaT while in
    service) and ``failed`` (the lifetime ended in a failure), as known at ``cutoff``: a removal
    after ``cutoff`` must already read as NaT. Returns one row per kept pair: ``lifetime`` (the
    index of ``lifetimes``), ``gpu_uuid``, ``landmark``, ``age_days``, ``duration``, ``event``,
    ``follow_up`` and ``weight``.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    installed = pd.to_datetime(lifetimes["installed_at"], utc=True)
    removed = pd.to_datetime(lifetimes["removed_at"], utc=True)
    failed = lifetimes["failed"].astype(bool).to_numpy() & removed.notna().to_numpy()
    parts = []
    for landmark in landmarks:
        at = pd.Timestamp(landmark)
        live = ((installed < at) & (removed.isna() | (removed > at))).to_numpy()
        if not live.any():
            continue
        follow_up = (cutoff - landmark) / _DAY
        days = ((removed[live] - at) / pd.Timedelta(days=1)).to_numpy(dtype=np.float64)
        event = failed[live]
        parts.append(
            pd.DataFrame(
                {
                    "lifetime": lifetimes.index[live],
                    "gpu_uuid": lifetimes["gpu_uuid"].to_numpy(dtype=object)[live],
                    LANDMARK_COL: landmark,
                    AGE_COL: ((at - installed[live]) / pd.Timedelta(days=1)).to_numpy(np.float64),
                    "duration": np.where(event, days, follow_up),
                    "event": event,
                    FOLLOW_UP_COL: follow_up,
                }
            )
        )
    if not parts:
        return pd.DataFrame(
            columns=[
                "lifetime",
                "gpu_uuid",
                LANDMARK_COL,
                AGE_COL,
                "duration",
                "event",
                FOLLOW_UP_COL,
                WEIGHT_COL,
            ]
        )
    rows = pd.concat(parts, ignore_index=True)
    soon = rows["event"].to_numpy() & (rows["duration"].to_numpy() <= longest_horizon_days)
    negatives = int((~soon).sum())
    fraction = 1.0
    if len(rows) > max_rows and negatives:
        fraction = max((max_rows - int(soon.sum())) / negatives, MIN_NEGATIVE_FRACTION)
        fraction = min(fraction, 1.0)
    keep = soon | (np.random.default_rng(seed).random(len(rows)) < fraction)
    rows = rows[keep].reset_index(drop=True)
    rows[WEIGHT_COL] = np.where(soon[keep], 1.0, 1.0 / fraction)
    return rows


def telemetry_landmark_rows(
    units: pd.DataFrame, telemetry_at: TelemetryAt
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Covariates ``X`` (:data:`LANDMARK_FEATURES`, NaN where a GPU did not report) and outcomes
    ``y`` (``duration``, ``event``, ``follow_up``, ``landmark``, ``weight``) of the rows of
    :func:`landmark_units`; ``telemetry_at`` is called once per landmark."""
    features: list[dict[str, float]] = [{}] * len(units)
    for landmark, idx in units.groupby(LANDMARK_COL, sort=True).indices.items():
        uuids = units["gpu_uuid"].to_numpy(dtype=object)[idx].tolist()
        found = telemetry_at(uuids, pd.Timestamp(landmark).to_pydatetime())
        for i, f in zip(idx, found, strict=True):
            features[i] = f
    X = pd.DataFrame({AGE_COL: units[AGE_COL].to_numpy(dtype=np.float64)})
    for name in FEATURE_NAMES:
        X[name] = np.asarray([f.get(name, np.nan) for f in features], dtype=np.float64)
    y = units[["duration", "event", FOLLOW_UP_COL, LANDMARK_COL, WEIGHT_COL]].reset_index(drop=True)
    return X, y
