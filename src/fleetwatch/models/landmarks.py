"""Training rows for a landmark model: the fleet at many past moments, and what came next.

At a cutoff :math:`c` a landmark model learns "P(failure within :math:`H`)" from the fleet as it
stood at earlier landmarks :math:`\\ell_1 < \\ell_2 < \\dots < c` (month starts by default). Each
unit in service at :math:`\\ell` gives one row: its covariates at :math:`\\ell`
(:func:`~fleetwatch.models.landmark_features.landmark_features`, from the snapshot at
:math:`\\ell`) and its outcome after :math:`\\ell` as known at :math:`c`:

* ``duration``: days from :math:`\\ell` to the unit's first failure in :math:`(\\ell, c]`, or
  :math:`c - \\ell` (the follow-up) when none was seen;
* ``event``: whether a failure was seen;
* ``follow_up``: :math:`c - \\ell`, days the outcome was watched for;
* ``landmark``: :math:`\\ell`.

A unit pulled healthy and never failing is *not* censored at its removal: the backtest's label
is "a failure was recorded within :math:`H`", and a pulled unit has none. A landmark model then
takes the rows with ``follow_up >= H`` for horizon :math:`H` (the window is complete), with
label ``event and duration <= H``; keeping a failure from an incomplete window while dropping
its survivors would inflate the failure rate.

Nothing after :math:`c` is read: covariates come from snapshots at :math:`\\ell < c` and
outcomes from :func:`~fleetwatch.models.history_features.known_before` at :math:`c`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from fleetwatch.models.features import failures_in_window
from fleetwatch.models.history_features import known_before
from fleetwatch.models.landmark_features import (
    FEATURE_GROUPS,
    feature_columns,
    landmark_features,
)
from fleetwatch.models.snapshot import prepare_records

__all__ = [
    "FOLLOW_UP_COL",
    "LANDMARK_COL",
    "MIN_FAILURES",
    "WEIGHT_COL",
    "failures_within",
    "FeatureCache",
    "landmark_dates",
    "landmark_training_frame",
    "too_few_failures",
]

LANDMARK_COL = "landmark"
FOLLOW_UP_COL = "follow_up"
MIN_FAILURES = 20
"""Failures within a horizon that a landmark model's classifier needs among its training rows."""
WEIGHT_COL = "weight"
"""Optional: a row's inverse sampling probability, when rows were sampled as they were built."""


def failures_within(rows: pd.DataFrame, horizon_days: float) -> int:
    """Rows (``duration``, ``event``) whose failure came within ``horizon_days``."""
    return int((rows["event"].astype(bool) & (rows["duration"] <= horizon_days)).sum())


def too_few_failures(n: int, horizon_days: float) -> str:
    """Why a landmark model with ``n`` failures within a horizon is not fitted."""
    return (
        f"only {n} failures within {horizon_days:g} days among the training rows (need "
        f"{MIN_FAILURES}); widen the training window or shorten the horizon"
    )


DEFAULT_FREQ = "MS"
_DAY = pd.Timedelta(days=1)

FeatureCache = dict[pd.Timestamp, pd.DataFrame]
"""Covariates per landmark, reused across cutoffs and horizons (they depend only on the
landmark, never on the cutoff)."""


def landmark_dates(
    start: pd.Timestamp | str, cutoff: pd.Timestamp | str, freq: str = DEFAULT_FREQ
) -> list[pd.Timestamp]:
    """Landmarks from ``start`` up to (not including) ``cutoff``, on the ``freq`` calendar grid.

    A calendar grid (month starts by default) gives every cutoff the same landmarks, so their
    covariates can be cached across cutoffs.
    """
    lo, hi = pd.Timestamp(start), pd.Timestamp(cutoff)
    return [d for d in pd.date_range(lo, hi, freq=freq) if d < hi]


def cached_landmark_features(
    prepared: pd.DataFrame, at: pd.Timestamp, cache: FeatureCache | None
) -> pd.DataFrame:
    """:func:`~fleetwatch.models.landmark_features.landmark_features` at ``at``, read from and
    kept in ``cache`` when one is given."""
    if cache is not None and at in cache:
        return cache[at]
    frame = landmark_features(prepared, at)
    if cache is not None:
        cache[at] = frame
    return frame


def landmark_training_frame(
    records: pd.DataFrame,
    cutoff: pd.Timestamp | str,
    *,
    start: pd.Timestamp | str | None = None,
    min_horizon_days: float = 0.0,
    freq: str = DEFAULT_FREQ,
    groups: Sequence[str] = tuple(FEATURE_GROUPS),
    cache: FeatureCache | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Covariates ``X`` and outcomes ``y`` of every unit at every landmark before ``cutoff``.

    Parameters
    ----------
    records : pandas.DataFrame
        Inventory records.
    cutoff : Timestamp or str
        Outcomes are read as known before it; landmarks lie before it.
    start : Timestamp or str, optional
        First landmark (default: the first insertion in ``records``).
    min_horizon_days : float
        Keep only landmarks with at least this much follow-up before ``cutoff`` (a model for
        horizon :math:`H` needs :math:`\\ell + H \\le c`; 0 keeps every landmark).
    freq : str
        Pandas frequency of the landmark grid.
    groups : sequence of str
        Feature groups (:data:`~fleetwatch.models.landmark_features.FEATURE_GROUPS`).
    cache : dict, optional
        Landmark -> covariate frame with every group, filled and reused; only valid for the
        same ``records``.

    Returns
    -------
    (X, y) : tuple of pandas.DataFrame
        ``X`` has the columns of ``groups``; ``y`` has ``duration`` (days, > 0), ``event``
        (bool), ``follow_up`` (days) and ``landmark``; both have a fresh integer index and one
        row per unit and landmark.

    Raises
    ------
    ValueError
        If no landmark has enough follow-up.
    """
    cut = pd.Timestamp(cutoff)
    prepared = prepare_records(records)
    first = prepared["inserted"].min() if start is None else pd.Timestamp(start)
    dates = [
        d
        for d in landmark_dates(first, cut, freq)
        if (cut - d) / _DAY >= max(min_horizon_days, 0.0) and (cut - d) / _DAY > 0
    ]
    if not dates:
        raise ValueError(
            f"no landmark between {first} and {cut} has {min_horizon_days:g} days of follow-up; "
            "choose a later cutoff or a shorter horizon"
        )
    known = known_before(prepared, cut)
    columns = list(feature_columns(groups))
    xs: list[pd.DataFrame] = []
    ys: list[pd.DataFrame] = []
    for d in dates:
        frame = cached_landmark_features(prepared, d, cache)
        failure = failures_in_window(known, d, cut).reindex(frame.index)
        follow_up = (cut - d) / _DAY
        days = ((failure - d) / _DAY).to_numpy(dtype=np.float64)
        event = failure.notna().to_numpy()
        xs.append(frame[columns])
        ys.append(
            pd.DataFrame(
                {
                    "duration": np.where(event, days, follow_up),
                    "event": event,
                    FOLLOW_UP_COL: follow_up,
                    LANDMARK_COL: d,
                },
                index=frame.index,
            )
        )
    X = pd.concat(xs, ignore_index=True)
    y = pd.concat(ys, ignore_index=True)
    return X, y
