"""Landmark rows of a telemetry fleet: who is in service at each midnight, what is known of their
future at the cutoff, and how sampling keeps every failure and reweights the rest."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from fleetwatch.models.telemetry_landmarks import (
    LANDMARK_FEATURES,
    daily_landmarks,
    landmark_units,
    telemetry_landmark_rows,
)

CUTOFF = datetime(2025, 6, 1, 6, tzinfo=UTC)
DAY = timedelta(days=1)


def _lifetimes(rows: list[tuple[str | None, datetime, datetime | None, bool]]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "gpu_uuid": np.array([r[0] for r in rows], dtype=object),
            "installed_at": pd.to_datetime([r[1] for r in rows], utc=True),
            "removed_at": pd.to_datetime([r[2] for r in rows], utc=True),
            "failed": [r[3] for r in rows],
        },
        index=pd.Index(range(10, 10 + len(rows))),
    )


def test_daily_landmarks_are_midnights_with_enough_follow_up() -> None:
    days = daily_landmarks(CUTOFF, span_days=5, follow_up_days=2)
    # 2025-05-27 06:00 .. 2025-05-30 06:00: the midnights of the 28th, 29th and 30th.
    assert days == [datetime(2025, 5, d, tzinfo=UTC) for d in (28, 29, 30)]
    assert daily_landmarks(CUTOFF, span_days=1, follow_up_days=7) == []


def test_units_in_service_with_outcomes_as_known_at_the_cutoff() -> None:
    midnight = datetime(2025, 5, 20, tzinfo=UTC)
    lifetimes = _lifetimes(
        [
            ("GPU-a", midnight - 10 * DAY, midnight + 3 * DAY, True),  # fails 3 days later
            ("GPU-b", midnight - 5 * DAY, midnight + DAY, False),  # repaired: not censored
            ("GPU-c", midnight + DAY, None, False),  # installed after the landmark
            (None, midnight - DAY, None, False),  # no UUID: a row without telemetry
            ("GPU-e", midnight - 9 * DAY, midnight - DAY, True),  # gone before the landmark
        ]
    )
    rows = landmark_units(
        lifetimes, [midnight], CUTOFF, longest_horizon_days=7, max_rows=1000
    ).set_index("lifetime")
    assert sorted(rows.index) == [10, 11, 13]
    follow_up = (CUTOFF - midnight) / DAY
    assert rows.loc[10, "duration"] == pytest.approx(3.0) and rows.loc[10, "event"]
    assert rows.loc[11, "duration"] == pytest.approx(follow_up) and not rows.loc[11, "event"]
    assert rows.loc[10, "age_days"] == pytest.approx(10.0)
    assert rows["follow_up"].tolist() == pytest.approx([follow_up] * 3)
    assert (rows["weight"] == 1.0).all()


def test_sampling_keeps_every_failure_and_weights_the_rest() -> None:
    start = CUTOFF - 60 * DAY
    rng = np.random.default_rng(5)
    rows = []
    for i in range(400):
        fails = i < 20
        removed = start + float(rng.uniform(10, 50)) * DAY if fails else None
        rows.append((f"GPU-{i}", start - 100 * DAY, removed, fails))
    lifetimes = _lifetimes(rows)
    landmarks = daily_landmarks(CUTOFF, span_days=50, follow_up_days=7)
    everything = landmark_units(
        lifetimes, landmarks, CUTOFF, longest_horizon_days=7, max_rows=10**9
    )
    sampled = landmark_units(lifetimes, landmarks, CUTOFF, longest_horizon_days=7, max_rows=2000)
    soon = everything["event"] & (everything["duration"] <= 7)
    kept_soon = sampled["event"] & (sampled["duration"] <= 7)
    assert int(kept_soon.sum()) == int(soon.sum()) > 0
    assert len(sampled) < len(everything) / 4
    assert (sampled.loc[kept_soon, "weight"] == 1.0).all()
    assert (sampled.loc[~kept_soon, "weight"] > 1.0).all()
    # The weights restore the population's size (within sampling noise).
    assert sampled["weight"].sum() == pytest.approx(len(everything), rel=0.1)
    with pytest.raises(ValueError, match="max_rows"):
        landmark_units(lifetimes, landmarks, CUTOFF, longest_horizon_days=7, max_rows=0)


def test_rows_get_the_telemetry_before_their_landmark_and_nan_when_unreported() -> None:
    midnight = datetime(2025, 5, 20, tzinfo=UTC)
    lifetimes = _lifetimes(
        [
            ("GPU-a", midnight - 10 * DAY, None, False),
            (None, midnight - 10 * DAY, None, False),
            ("GPU-quiet", midnight - 10 * DAY, None, False),
        ]
    )
    units = landmark_units(
        lifetimes, [midnight, midnight + DAY], CUTOFF, longest_horizon_days=7, max_rows=1000
    )
    asked: list[tuple[tuple[str | None, ...], datetime]] = []

    def telemetry_at(uuids: Sequence[str | None], at: datetime) -> list[dict[str, float]]:
        asked.append((tuple(uuids), at))
        return [{"temp_p95_c": float(at.day)} if u == "GPU-a" else {} for u in uuids]

    X, y = telemetry_landmark_rows(units, telemetry_at)
    assert list(X.columns) == list(LANDMARK_FEATURES)
    assert [a for _, a in asked] == [midnight, midnight + DAY]  # one call per landmark
    assert len(X) == len(y) == 6
    a = (units["gpu_uuid"] == "GPU-a").to_numpy()
    assert sorted(X.loc[a, "temp_p95_c"]) == [20.0, 21.0]
    assert X.loc[~a, "temp_p95_c"].isna().all()  # not reported: missing, never 0
    assert list(y.columns) == ["duration", "event", "follow_up", "landmark", "weight"]
