"""The weekly report's drain curve: the ranking at the week's start, worked out by hand."""

from __future__ import annotations

import base64
import io
from collections import namedtuple
from datetime import timedelta
from typing import Any

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import insert
from tests.unit.reports.conftest import NOW, START, WEEK, WEIBULL, t

from fleetwatch.config import ServerSettings
from fleetwatch.models.registry import PARAMS_FORMAT, RiskBundle
from fleetwatch.reports.drain_curve import drain_curve
from fleetwatch.reports.plots import budget_png
from fleetwatch.reports.render import render_html
from fleetwatch.reports.weeks import parse_week
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import gpu_hourly
from fleetwatch.server.repo.hourly_features import window_features_before
from fleetwatch.server.repo.report_rows import compute_weekly

Lifetime = namedtuple(
    "Lifetime", ["gpu_uuid", "sku", "installed_at", "removed_at", "end_kind"], defaults=[None]
)
Model = namedtuple("Model", ["version", "params"])
WEIBULL_ONLY = Model(
    3,
    {"format": PARAMS_FORMAT, "groups": {}, "aft": None, "fleet": {**WEIBULL, "rho_ci": [1, 2]}},
)


def _aged(i: int, fails_after_days: float | None = None) -> Lifetime:
    """GPU ``i``, installed ``10 + i`` days before the week (a larger i is older: with shape
    1.3 its risk is higher)."""
    removed = None if fails_after_days is None else START + timedelta(days=fails_after_days)
    return Lifetime(
        f"GPU-{i}", "H100", START - timedelta(days=10 + i), removed, removed and "failure"
    )


def test_drain_curve_by_hand_on_a_hundred_gpus() -> None:
    lifetimes = [_aged(i) for i in range(100)]
    lifetimes[99] = _aged(99, 2.0)  # the oldest fails 48 h into the week
    lifetimes[97] = _aged(97, 3.0)  # the third oldest 72 h in
    lifetimes[0] = _aged(0, 1.0)  # the youngest after 24 h: never drained at k <= 5
    lifetimes[50] = _aged(50, 10.0)  # after the week: not the week's failure
    gone = Lifetime("GPU-x", "H100", START - timedelta(days=300), START - timedelta(days=1))
    out = drain_curve(WEIBULL_ONLY, [*lifetimes, gone], START)
    assert out["model_version"] == 3 and out["gpus"] == 100 and out["failures"] == 3
    curve = {p["k"]: p for p in out["curve"]}
    assert sorted(curve) == [1, 2, 3, 4, 5]  # 1 to 5 % of 100 GPUs
    assert (curve[1]["hits"], curve[1]["precision"], curve[1]["median_lead_h"]) == (1, 1.0, 48.0)
    assert curve[2]["precision"] == 0.5 and curve[2]["recall"] == pytest.approx(1 / 3)
    assert curve[3]["hits"] == 2 and curve[3]["recall"] == pytest.approx(2 / 3)
    assert curve[3]["median_lead_h"] == pytest.approx(60.0)
    assert curve[5]["precision"] == pytest.approx(2 / 5)
    # 0.1 %, 0.5 % and 1 % of 100 GPUs are all one drain
    assert [(b["fraction"], b["k"], b["hits"]) for b in out["budgets"]] == [
        (0.001, 1, 1), (0.005, 1, 1), (0.01, 1, 1),
    ]  # fmt: skip


def test_drain_curve_scores_with_telemetry_before_the_start() -> None:
    """An AFT where a high SBE rate shortens life: the GPU whose window shows SBEs goes first."""
    rng = np.random.default_rng(7)
    sbe = rng.exponential(5.0, 600)
    life = 400.0 * np.exp(-0.15 * sbe) * rng.weibull(1.4, 600)
    censor = rng.uniform(50, 600, 600)
    frame = pd.DataFrame({
        "duration_days": np.minimum(life, censor), "event": (life <= censor).astype(int),
        "group": "H100", "sbe_per_day": sbe,
    })  # fmt: skip
    model = Model(1, RiskBundle.fit(frame).to_params())
    lifetimes = [_aged(0, 2.0), _aged(0)._replace(gpu_uuid="GPU-quiet")]
    loud = {"GPU-0": {"sbe_per_day": 40.0}, "GPU-quiet": {"sbe_per_day": 0.0}}
    out = drain_curve(model, lifetimes, START, loud)
    assert out["with_telemetry"] == 2 and out["curve"][0]["precision"] == 1.0
    swapped = {"GPU-0": {"sbe_per_day": 0.0}, "GPU-quiet": {"sbe_per_day": 40.0}}
    assert drain_curve(model, lifetimes, START, swapped)["curve"][0]["precision"] == 0.0


def test_drain_curve_without_a_model_or_gpus_is_empty() -> None:
    assert drain_curve(None, [_aged(1)], START)["curve"] == []
    empty = drain_curve(WEIBULL_ONLY, [], START)
    assert empty["gpus"] == 0 and empty["failures"] is None and empty["budgets"] == []


def _png_pixels(uri: str) -> Any:
    from PIL import Image

    assert uri.startswith("data:image/png;base64,")
    raw = base64.b64decode(uri.split(",", 1)[1])
    return np.asarray(Image.open(io.BytesIO(raw)).convert("L"), dtype=np.float64)


def test_budget_png_draws_the_curve_and_none_without_one() -> None:
    lifetimes = [_aged(i, 2.0 if i % 10 == 9 else None) for i in range(400)]
    out = drain_curve(WEIBULL_ONLY, lifetimes, START)
    pixels = _png_pixels(budget_png(out) or "")
    assert pixels.std() > 5.0  # not a blank image
    assert budget_png(drain_curve(None, lifetimes, START)) is None
    assert budget_png(None) is None


def test_window_features_before_reads_only_whole_hours_before_the_end(db: Database) -> None:
    base = {"node_id": 1, "samples": 360, "span_s": 3590.0, "throttle_reported": 0,
            "throttled": 0, "xid_hardware": 0, "xid_memory": 0, "xid_interconnect": 0,
            "xid_power_thermal": 0, "xid_driver_firmware": 0}  # fmt: skip
    rows = [
        {**base, "gpu_uuid": "GPU-a", "hour": t(22, 21), "temp_p95_c": 99.0},  # before window
        {**base, "gpu_uuid": "GPU-a", "hour": t(22, 22), "temp_p95_c": 70.0},
        {**base, "gpu_uuid": "GPU-a", "hour": t(22, 23), "temp_p95_c": 80.0},
        {**base, "gpu_uuid": "GPU-a", "hour": t(23, 0), "temp_p95_c": 95.0},  # at the end
        {**base, "gpu_uuid": "GPU-b", "hour": t(23, 1), "temp_p95_c": 60.0},  # after it
    ]
    with db.write() as conn:
        conn.execute(insert(gpu_hourly), rows)
    with db.read() as conn:
        got = window_features_before(conn, end=t(23), window=timedelta(hours=2))
    assert set(got) == {"GPU-a"} and got["GPU-a"]["temp_p95_c"] == 80.0


def test_weekly_report_has_the_drain_curve_and_its_plot(
    db: Database, settings: ServerSettings, fleet_rows: Any
) -> None:
    with db.read() as conn:
        report = compute_weekly(conn, parse_week(WEEK), settings=settings, now=NOW)
    budget = report.drain_budget
    assert budget is not None
    # Six GPUs in service at the start (SN-new came later, SN-prev left before); the model is
    # age-only, SN-n2-0 the youngest, the other five tie and go in the order they are stored:
    # SN-n1-0 first, which failed 30 h into the week, one of the week's two failures.
    assert (budget["gpus"], budget["failures"], budget["with_telemetry"]) == (6, 2, 0)
    [point] = budget["curve"]
    assert (point["k"], point["hits"], point["precision"], point["recall"]) == (1, 1, 1.0, 0.5)
    assert point["median_lead_h"] == pytest.approx(30.0)
    html = render_html(report)
    assert 'alt="Precision and recall of draining the k riskiest GPUs' in html
    assert "What the ranking was worth" in html and "version 1" in html


def test_weekly_report_features_come_from_the_window_before_the_start(
    db: Database, settings: ServerSettings, fleet_rows: Any
) -> None:
    # The fixture's rollups are all inside the week: none may reach the start's scores.
    with db.read() as conn:
        report = compute_weekly(conn, parse_week(WEEK), settings=settings, now=NOW)
    assert report.drain_budget is not None and report.drain_budget["with_telemetry"] == 0
    before = START - timedelta(hours=3)
    with db.write() as conn:
        conn.execute(
            insert(gpu_hourly),
            [{"gpu_uuid": "GPU-n3-0", "hour": before, "node_id": 3, "samples": 360,
              "span_s": 3590.0, "throttle_reported": 0, "throttled": 0, "xid_hardware": 1,
              "xid_memory": 0, "xid_interconnect": 0, "xid_power_thermal": 0,
              "xid_driver_firmware": 0}],
        )  # fmt: skip
    with db.read() as conn:
        report = compute_weekly(conn, parse_week(WEEK), settings=settings, now=NOW)
    assert report.drain_budget is not None and report.drain_budget["with_telemetry"] == 1
