"""The served landmark model's training rows, read from stored lifetimes and hourly telemetry.

:mod:`fleetwatch.models.telemetry_landmarks` says what a row is. Here, at a refit's ``now``, the
lifetimes are those stored with ``installed_at`` before ``now``, each removal and its kind read
as known at ``now`` (a removal after ``now`` is not yet known), and the telemetry of a row is
its GPU's ``gpu_hourly`` rollups in the ``window_days`` before its landmark, and, with a
``location_pattern``, the ``loc_*`` parts of its lifetime's location (as the AFT's frame has them,
:mod:`fleetwatch.server.upkeep.training_frame`). So the frame at a
past ``now`` is what a refit then would have seen, and the held-out evaluation fits on it
(:mod:`fleetwatch.server.upkeep.promotion`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
from sqlalchemy import Connection, select

from fleetwatch.inventory import compile_location_pattern, location_columns
from fleetwatch.models.landmarks import LANDMARK_COL, MIN_FAILURES, failures_within
from fleetwatch.models.telemetry_features import HourRollup, window_features
from fleetwatch.models.telemetry_landmarks import (
    daily_landmarks,
    landmark_units,
    telemetry_landmark_rows,
)
from fleetwatch.server.db.tables import gpu_lifetimes
from fleetwatch.server.upkeep.training_frame import hourly_by_gpu

__all__ = ["LandmarkTelemetry", "landmark_frame"]


def _lifetimes(conn: Connection, now: datetime) -> pd.DataFrame:
    lt = gpu_lifetimes.c
    query = (
        select(lt.id, lt.gpu_uuid, lt.location, lt.installed_at, lt.removed_at, lt.end_kind)
        .where(lt.installed_at < now)
        .order_by(lt.id)
    )
    rows = conn.execute(query).all()
    known = [r.removed_at is not None and r.removed_at <= now for r in rows]
    return pd.DataFrame(
        {
            "gpu_uuid": np.array([r.gpu_uuid for r in rows], dtype=object),
            "location": np.array([r.location for r in rows], dtype=object),
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
    location_pattern: str | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(X, y)`` of the landmarks in the ``span_days`` before ``now`` that have the longest
    horizon of follow-up (empty when there are none). When the shortest horizon has fewer than
    :data:`~fleetwatch.models.landmarks.MIN_FAILURES` failures among them no telemetry is
    read (every covariate but age is NaN): the model could not be fitted on them anyway."""
    if window_days <= 0 or span_days <= 0:
        raise ValueError(f"window_days and span_days must be > 0, got {window_days}, {span_days}")
    longest = max(horizons_days)
    landmarks = daily_landmarks(now, span_days=span_days, follow_up_days=longest)
    lifetimes = _lifetimes(conn, now)
    units = landmark_units(
        lifetimes,
        landmarks,
        now,
        longest_horizon_days=longest,
        max_rows=max_rows,
    )
    window = timedelta(days=window_days)
    if failures_within(units, min(horizons_days)) < MIN_FAILURES:
        # The landmark model cannot be fitted on these rows (its fit says so, naming the count):
        # reading a week of telemetry for each of them would be wasted.
        X, y = telemetry_landmark_rows(units, lambda uuids, _at: [{} for _ in uuids])
    else:
        X, y = telemetry_landmark_rows(units, LandmarkTelemetry(conn, units, window, now))
    pattern = compile_location_pattern(location_pattern)
    if pattern is not None:
        of_rows = lifetimes.index.get_indexer(units["lifetime"])  # each row's lifetime
        for name, values in location_columns(lifetimes["location"], pattern).items():
            X[name] = np.asarray(values, dtype=np.float64)[of_rows]
    return X, y


class LandmarkTelemetry:
    """The window of rollups before each row's landmark, read the cheaper of two ways per GPU.

    A GPU with rows at most midnights (a small fleet, not sampled) has overlapping windows: its
    whole span is read once and sliced. A GPU with few rows (a large fleet, sampled) has its
    windows read landmark by landmark: reading its whole span would be mostly hours no row
    needs.
    """

    def __init__(
        self, conn: Connection, units: pd.DataFrame, window: timedelta, now: datetime
    ) -> None:
        self._conn, self._window, self._now = conn, window, now
        marks = pd.to_datetime(units[LANDMARK_COL], utc=True)
        first, last = marks.min().to_pydatetime(), marks.max().to_pydatetime()
        span = (last - first) + window
        counts = units["gpu_uuid"].dropna().value_counts()
        self._whole = {str(u) for u, n in counts.items() if n * window >= span}
        read = hourly_by_gpu(conn, {u: [(first - window, last)] for u in self._whole}, now)
        self._spans = {u: sorted(rs, key=lambda r: r.hour) for u, rs in read.items()}
        self._hours = {u: [r.hour for r in rs] for u, rs in self._spans.items()}

    @property
    def read_whole(self) -> frozenset[str]:
        """The GPUs whose whole span was read once."""
        return frozenset(self._whole)

    def _sliced(self, uuid: str, landmark: datetime) -> list[HourRollup]:
        hours = self._hours.get(uuid, [])
        lo = bisect_left(hours, landmark - self._window)
        hi = bisect_left(hours, landmark)
        return self._spans.get(uuid, [])[lo:hi]

    def __call__(self, uuids: Sequence[str | None], landmark: datetime) -> list[dict[str, float]]:
        start = landmark - self._window
        rest = {u: [(start, landmark)] for u in uuids if u is not None and u not in self._whole}
        hourly = hourly_by_gpu(self._conn, rest, self._now) if rest else {}
        out: list[dict[str, float]] = []
        for u in uuids:
            if u is None:
                out.append({})
            elif u in self._whole:
                out.append(window_features(self._sliced(u, landmark)))
            else:
                inside = [r for r in hourly.get(u, []) if start <= r.hour < landmark]
                out.append(window_features(inside))
        return out
