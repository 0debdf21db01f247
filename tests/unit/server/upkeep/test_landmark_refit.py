"""A refit fits the landmark model from stored lifetimes and telemetry, scores each part on the
held-out window, and serves the one that ranks it best, with factors a person can check.

The fleet is made so that the parts differ: a GPU fails within days of running in a narrow
band of temperature (a p95 of 76-79 degC) while healthy GPUs run either cooler (62-68) or hotter
(86-92). Risk is then not monotone in temperature: the AFT, log-linear in its covariates, cannot
rank it, trees can. Both databases.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import insert

from fleetwatch.config import ServerSettings
from fleetwatch.models.telemetry_features import HourRollup, window_features
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import gpu_hourly, gpu_lifetimes
from fleetwatch.server.repo.models import get_model, latest_ok_model
from fleetwatch.server.upkeep.landmark_frame import LandmarkTelemetry, landmark_frame
from fleetwatch.server.upkeep.refit import run_refit
from fleetwatch.server.upkeep.training_frame import hourly_by_gpu

NOW = datetime(2025, 6, 1, tzinfo=UTC)
HOLDOUT_DAYS = 10.0
SPAN_DAYS = 20.0  # landmarks: the midnights of the 20 days before a fit, with 7 days to follow
HISTORY_DAYS = 32  # telemetry from the first landmark's window to NOW
GPUS = 160
FAILURES_PER_DAY = 2
BAND_DAYS = 12  # a failing GPU runs in the band this long before it fails: the whole window
EVERY_H = 6  # one rollup every few hours is enough for a window's highest p95


def _fleet(seed: int = 3) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rng = np.random.default_rng(seed)
    first = NOW - timedelta(days=HISTORY_DAYS)
    failing = rng.permutation(GPUS)[: FAILURES_PER_DAY * (HISTORY_DAYS - 1)]
    failure_at = {
        int(g): first + timedelta(days=1 + k / FAILURES_PER_DAY, hours=float(rng.uniform(0, 11)))
        for k, g in enumerate(failing)
    }
    lifetimes, hours = [], []
    for g in range(GPUS):
        uuid = f"GPU-{g}"
        fails = failure_at.get(g)
        lifetimes.append(
            {
                "serial": f"S{g}",
                "gpu_uuid": uuid,
                "sku": "H100",
                "installed_at": first - timedelta(days=float(rng.uniform(30, 400))),
                "removed_at": fails,
                "end_kind": "failure" if fails else None,
                "source": "observed",
            }
        )
        base = 65.0 if g % 2 else 89.0
        hour = first
        while hour < (fails or NOW):
            in_band = fails is not None and fails - hour <= timedelta(days=BAND_DAYS)
            temp = float(rng.uniform(76, 79)) if in_band else base + float(rng.uniform(-3, 3))
            rollup = HourRollup(
                gpu_uuid=uuid, hour=hour, samples=60, span_s=3540.0, temp_p95_c=temp, sbe_errors=0.0
            )
            hours.append({**rollup.as_row(), "node_id": 1})
            hour += timedelta(hours=EVERY_H)
    return lifetimes, hours


def _settings(settings: ServerSettings) -> ServerSettings:
    return settings.model_copy(
        update={
            "model_holdout_days": HOLDOUT_DAYS,
            "model_holdout_min_failures": 10,
            "model_landmark_span_days": SPAN_DAYS,
            "model_window_days": 1.0,
            "risk_horizons_h": [24.0, 168.0],
            "notice_horizon_h": 24.0,
        }
    )


@pytest.fixture
def stored(db: Database) -> Database:
    lifetimes, hours = _fleet()
    with db.write() as conn:
        conn.execute(insert(gpu_lifetimes), lifetimes)
        conn.execute(insert(gpu_hourly), hours)
    return db


def test_the_refit_serves_the_landmark_model_when_it_ranks_the_window_best(
    stored: Database, settings: ServerSettings
) -> None:
    version = run_refit(stored, _settings(settings), trigger="manual", now=NOW)
    assert version is not None
    with stored.read() as conn:
        row = get_model(conn, version)
        serving = latest_ok_model(conn)
    assert row.status == "ok" and serving is not None and serving.version == version
    evaluation = row.evaluation
    assert evaluation is not None
    scores = evaluation["scorers"]
    assert set(scores) == {"landmark", "aft", "weibull"}
    assert evaluation["scorer"] == "landmark"
    assert scores["landmark"]["auc"] > scores["aft"]["auc"] + 0.1
    assert scores["landmark"]["auc"] > 0.9
    assert evaluation["scorer_reason"].startswith("the best AUC on the window")
    assert evaluation["challenger"] == scores["landmark"]
    metrics = row.metrics
    assert metrics is not None
    landmark = metrics["landmark"]
    assert landmark["landmarks"] == 14  # midnights NOW-20d .. NOW-7d
    assert landmark["failures_within"]["1"] >= 20
    assert "temp_p95_c" in landmark["covariates"] and "sbe_per_day" in landmark["covariates"]
    assert "remapped_rows" in landmark["unreported"]

    bundle = serving.bundle()
    assert bundle.scorer == "landmark"
    units = pd.DataFrame({"age_days": [100.0, 100.0, 100.0], "temp_p95_c": [78.5, 65.0, 89.0]})
    scores_now = bundle.score(units, 1.0)
    in_band, cool, hot = scores_now.probability
    assert in_band > 5 * max(cool, hot)
    assert scores_now.model == ["landmark"] * 3
    top = scores_now.factors[0][0]
    # The band GPU's strongest driver is its temperature, pushing its risk up, and the factor
    # carries its reading; an unreported covariate is never named with a value.
    assert top.name == "temp_p95_c" and top.value == 78.5
    assert top.contribution is not None and top.contribution > 0 and top.hazard_ratio is None
    assert all(f.value is None for f in scores_now.factors[0] if f.name == "remapped_rows")


def test_without_enough_failures_the_landmark_part_is_absent_and_says_why(
    db: Database, settings: ServerSettings
) -> None:
    lifetimes, hours = _fleet()
    few = [lt for lt in lifetimes if lt["end_kind"] is None or lt["serial"] in {"S1", "S2"}]
    keep = {lt["gpu_uuid"] for lt in few}
    with db.write() as conn:
        conn.execute(insert(gpu_lifetimes), few)
        conn.execute(insert(gpu_hourly), [h for h in hours if h["gpu_uuid"] in keep])
    version = run_refit(db, _settings(settings), trigger="manual", now=NOW)
    assert version is not None
    with db.read() as conn:
        row = get_model(conn, version)
    assert row.metrics is not None and row.evaluation is not None
    assert "failures within 1 days" in row.metrics["landmark"]["error"]
    assert "landmark" not in row.evaluation["scorers"]
    assert row.evaluation["scorer"] != "landmark"
    # Too few failures to fit: the rows' telemetry is not even read.
    with db.read() as conn:
        X, y = landmark_frame(
            conn, now=NOW, span_days=SPAN_DAYS, window_days=1.0, horizons_days=[1.0, 7.0],
            max_rows=20_000,
        )  # fmt: skip
    assert len(X) > 1000 and X["temp_p95_c"].isna().all() and X["age_days"].notna().all()


def test_telemetry_read_whole_or_by_landmark_gives_each_row_its_window(stored: Database) -> None:
    """A GPU with a row at every midnight is read once over its span and sliced; one with a
    single row is read for that window alone. Either way a row gets what window_features makes
    of the rollups in the week before its midnight, straight from the table."""
    marks = [NOW - timedelta(days=d) for d in range(20, 6, -1)]
    busy, quiet = "GPU-1", "GPU-2"
    units = pd.DataFrame(
        {
            "gpu_uuid": [busy] * len(marks) + [quiet, None],
            "landmark": marks + [marks[3], marks[3]],
        }
    )
    window = timedelta(days=7)
    with stored.read() as conn:
        reader = LandmarkTelemetry(conn, units, window, NOW)
        assert busy in reader.read_whole and quiet not in reader.read_whole
        everything = hourly_by_gpu(
            conn, {busy: [(marks[0] - window, NOW)], quiet: [(marks[0] - window, NOW)]}, NOW
        )
        for landmark in marks:
            uuids = list(units.loc[units["landmark"] == landmark, "gpu_uuid"])
            got = reader(uuids, landmark)
            for uuid, features in zip(uuids, got, strict=True):
                if uuid is None:
                    assert features == {}
                    continue
                inside = [r for r in everything[uuid] if landmark - window <= r.hour < landmark]
                assert inside and features == window_features(inside)


def test_with_a_location_pattern_each_row_has_its_lifetimes_location_parts(db: Database) -> None:
    """As the AFT's frame: the ``loc_*`` parts of the location of the row's own lifetime, NaN
    for a lifetime without one. Failing GPUs sit in rack 1 here, healthy ones in rack 2 or
    nowhere known, so a row's outcome says which rack it must show."""
    lifetimes, _ = _fleet()
    for g, lt in enumerate(lifetimes):
        rack = 1 if lt["end_kind"] == "failure" else (2 if g % 2 == 0 else None)
        lt["location"] = None if rack is None else f"r{rack}-u{g}"
    with db.write() as conn:
        conn.execute(insert(gpu_lifetimes), lifetimes)
    kwargs: dict[str, Any] = {
        "now": NOW, "span_days": SPAN_DAYS, "window_days": 1.0, "horizons_days": [1.0, 7.0],
        "max_rows": 20_000,
    }  # fmt: skip
    with db.read() as conn:
        X, y = landmark_frame(conn, location_pattern=r"r(?P<rack>\d+)-u\d+", **kwargs)
        plain, _ = landmark_frame(conn, **kwargs)
    failing = y["event"].to_numpy(dtype=bool)
    assert failing.any() and (X.loc[failing, "loc_rack"] == 1.0).all()
    healthy = X.loc[~failing, "loc_rack"]
    assert set(healthy.dropna()) == {2.0} and healthy.isna().any()
    assert [c for c in plain.columns if c.startswith("loc_")] == []
