"""The served landmark model's training rows, read from stored lifetimes and hourly telemetry.

:mod:`fleetwatch.models.telemetry_landmarks` says what a row is. Here, at a refit's ``now``, the
lifetimes are those stored with ``installed_at`` before ``now``, each removal and its kind read
as known at ``now`` (a removal after ``now`` is not yet known), and the telemetry of a row is
its GPU's ``gpu_hourly`` rollups in the ``window_days`` before its landmark. So the frame at a
past ``now`` is what a refit then would have seen, and the held-out evaluation fits on it
(:mod:`fleetwatch.server.upkeep.promotion`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
from sqlalchemy import Connection, select

from fleetwatch.models.landmarks import MIN_FAILURES
from fleetwatch.models.telemetry_features import window_features
from fleetwatch.models.telemetry_landmarks import (
    daily_landmarks,
    landmark_units,
    telemetry_landmark_rows,
)
from fleetwatch.server.db.tables import gpu_lifetimes
from fleetwatch.server.upkeep.training_frame import hourly_by_gpu

__all__ = ["landmark_frame"]


def _lifetimes(conn: Connection, now: datetime) -> pd.DataFrame:
    lt = gpu_lifetimes.c
    query = (
        select(lt.id, lt.gpu_uuid, lt.installed_at, lt.removed_at, lt.end_kind)
        .where(lt.installed_at < now)
        .order_by(lt.id)
    )
    rows = conn.execute(query).all()
    known = [r.removed_at is not None and r.removed_at <= now for r in rows]
    return pd.DataFrame(
        {
            "gpu_uuid": np.array([r.gpu_uuid for r in rows], dtype=object),
            "installed_at": pd.to_datetime([r.installed_at for r in rows], utc=True),
            "removed_at": pd.to_datetime(
                [r.removed_at if k else None for r, k in zip(rows, known, strict=True)], utc=True
            ),
            "failed": [k and r.end_kind == "failure" for r, k in zip(rows, known, strict=True)],
        },
        index=pd.Index([r.id for r in rows], name="lifetime_id"),
    )


def landmark_frame(
    conn: Connection,
    *,
    now: datetime,
    span_days: float,
    window_days: float,
    horizons_days: Sequence[float],
    max_rows: int,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(X, y)`` of the landmarks in the ``span_days`` before ``now`` that have the longest
    horizon of follow-up (empty when there are none). When the shortest horizon has fewer than
    :data:`~fleetwatch.models.landmarks.MIN_FAILURES` failures among them no telemetry is
    read (every covariate but age is NaN): the model could not be fitted on them anyway."""
    if window_days <= 0 or span_days <= 0:
        raise ValueError(f"window_days and span_days must be > 0, got {window_days}, {span_days}")
    longest = max(horizons_days)
    landmarks = daily_landmarks(now, span_days=span_days, follow_up_days=longest)
    units = landmark_units(
        _lifetimes(conn, now),
        landmarks,
        now,
        longest_horizon_days=longest,
        max_rows=max_rows,
    )
    window = timedelta(days=window_days)
    shortest = min(horizons_days)
    soon = units["event"].astype(bool) & (units["duration"] <= shortest)
    if int(soon.sum()) < MIN_FAILURES:
        # The landmark model cannot be fitted on these rows (its fit says so, naming the count):
        # reading a week of telemetry for each of them would be wasted.
        return telemetry_landmark_rows(units, lambda uuids, _at: [{} for _ in uuids])

    def telemetry_at(uuids: Sequence[str | None], landmark: datetime) -> list[dict[str, float]]:
        spans = {u: [(landmark - window, landmark)] for u in uuids if u is not None}
        hourly = hourly_by_gpu(conn, spans, now)
        return [
            window_features(
                [r for r in hourly.get(u, []) if landmark - window <= r.hour < landmark]
            )
            if u is not None
            else {}
            for u in uuids
        ]

    return telemetry_landmark_rows(units, telemetry_at)
