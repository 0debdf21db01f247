"""Background refits: versions stored (fitted or failed), wear-out events, the PostgreSQL lock,
one refit at a time per process, and the schedule."""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import Connection, insert, select

import fleetwatch.server.upkeep.refit as refit_module
from fleetwatch.config import ServerSettings
from fleetwatch.errors import InvalidInput
from fleetwatch.models.base import ModelFitError
from fleetwatch.models.registry import RiskBundle
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import events, gpu_lifetimes
from fleetwatch.server.repo.models import get_model, latest_ok_model, list_models, store_model
from fleetwatch.server.upkeep.refit import Refitter, run_refit

NOW = datetime(2025, 6, 1, tzinfo=UTC)


def insert_weibull_lifetimes(
    db: Database, *, n: int = 400, rho: float = 1.5, lam: float = 400.0, seed: int = 7
) -> None:
    """``n`` H100 lifetimes ending by NOW, Weibull(rho, lam) days, censored by removal/NOW."""
    rng = np.random.default_rng(seed)
    life = lam * rng.weibull(rho, size=n)
    follow = rng.uniform(0.2, 3.0, size=n) * lam
    rows = []
    for i, (t, c) in enumerate(zip(life, follow, strict=True)):
        installed = NOW - timedelta(days=float(c))
        failed = t < c
        rows.append(
            {
                "serial": f"W{seed}-{i}",
                "sku": "H100",
                "installed_at": installed,
                "removed_at": installed + timedelta(days=float(t)) if failed else None,
                "end_kind": "failure" if failed else None,
                "source": "observed",
            }
        )
    with db.write() as conn:
        conn.execute(insert(gpu_lifetimes), rows)


def _settings(db_settings: ServerSettings) -> ServerSettings:
    return db_settings.model_copy(update={"model_min_events": 10})


def _wear_out_events(conn: Connection) -> list[dict[str, Any]]:
    query = select(events).where(events.c.kind == "wear_out_onset")
    return [dict(row._mapping) for row in conn.execute(query)]


def test_refit_stores_a_fitted_version(db: Database, settings: ServerSettings) -> None:
    insert_weibull_lifetimes(db)
    version = run_refit(db, _settings(settings), trigger="manual", now=NOW)
    assert version is not None
    with db.read() as conn:
        stored = get_model(conn, version)
        latest = latest_ok_model(conn)
        onsets = _wear_out_events(conn)
    assert stored.status == "ok" and stored.trigger == "manual" and stored.error is None
    assert stored.trained_at == NOW
    assert stored.metrics is not None and stored.metrics["n"] == 400
    assert stored.metrics["groups"]["H100"]["rho"] == pytest.approx(1.5, rel=0.2)
    assert latest is not None and latest.version == version
    bundle = latest.bundle()
    scores = bundle.score(pd.DataFrame({"age_days": [100.0], "group": ["H100"]}), 30)
    assert scores.model == ["weibull:H100"] and 0 < scores.probability[0] < 1
    assert onsets == []  # no previous version: nothing to compare with


def test_refit_failure_is_stored_as_failed_and_raised(
    db: Database, settings: ServerSettings
) -> None:
    with pytest.raises(ModelFitError, match="empty"):
        run_refit(db, settings, trigger="startup", now=NOW)
    with db.read() as conn:
        (stored,) = list_models(conn, 10)
        latest = latest_ok_model(conn)
    assert stored.status == "failed" and stored.trigger == "startup"
    assert stored.error is not None and "ModelFitError" in stored.error and "empty" in stored.error
    assert latest is None  # a failed version is never served


def test_refit_records_a_wear_out_onset_event(db: Database, settings: ServerSettings) -> None:
    infant = {"lambda": 400.0, "rho": 0.8, "rho_ci": [0.7, 0.9]}
    previous = RiskBundle.from_params(
        {"format": 1, "fleet": infant, "groups": {"H100": infant}, "aft": None}
    )
    with db.write() as conn:
        before = store_model(conn, previous, trigger="schedule", trained_at=NOW - timedelta(1))
    insert_weibull_lifetimes(db, rho=2.5, n=600)
    version = run_refit(db, _settings(settings), trigger="schedule", now=NOW)
    with db.read() as conn:
        found = _wear_out_events(conn)
    assert sorted(e["details"]["group"] for e in found) == ["H100", "fleet"]
    for event in found:
        assert event["node_id"] is None and event["ts"] == NOW and event["received_at"] == NOW
        details = event["details"]
        assert details["model_version"] == version and details["previous_version"] == before
        assert details["previous_rho"] == 0.8 and details["rho_ci"][0] > 1
        assert "wear-out onset" in event["message"]


def test_refit_skips_when_a_version_is_recent(db: Database, settings: ServerSettings) -> None:
    insert_weibull_lifetimes(db)
    first = run_refit(db, settings, trigger="schedule", now=NOW)
    assert first is not None
    later = NOW + timedelta(minutes=10)
    assert run_refit(db, settings, trigger="schedule", now=later, min_interval_s=3600) is None
    again = run_refit(db, settings, trigger="schedule", now=later, min_interval_s=60)
    assert again == first + 1


def test_refit_advisory_lock_keeps_replicas_apart(
    db: Database, settings: ServerSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    if db.is_sqlite:
        pytest.skip("the advisory lock is PostgreSQL's; SQLite serves one process")
    insert_weibull_lifetimes(db)
    inside, release = threading.Event(), threading.Event()
    real_frame = refit_module.training_frame

    def slow_frame(*args: Any, **kwargs: Any) -> pd.DataFrame:
        inside.set()
        assert release.wait(30)
        return real_frame(*args, **kwargs)

    monkeypatch.setattr(refit_module, "training_frame", slow_frame)
    results: list[int | None] = []
    first = threading.Thread(
        target=lambda: results.append(run_refit(db, settings, trigger="manual", now=NOW))
    )
    first.start()
    try:
        assert inside.wait(30)
        # The second replica finds the lock held: it returns at once, storing nothing.
        assert run_refit(db, settings, trigger="manual", now=NOW) is None
    finally:
        release.set()
        first.join(60)
    assert results == [1]
    with db.read() as conn:
        assert [m.version for m in list_models(conn, 10)] == [1]
    # The lock was released: the next refit runs.
    monkeypatch.setattr(refit_module, "training_frame", real_frame)
    assert run_refit(db, settings, trigger="manual", now=NOW) == 2


# -- Refitter: one at a time, in the background ------------------------------------------------


class _Blocking:
    """A refit job that waits until released, recording its triggers."""

    def __init__(self, fail: bool = False) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.triggers: list[str] = []
        self.fail = fail

    def __call__(self, db: Database, settings: ServerSettings, **kwargs: Any) -> int | None:
        self.triggers.append(kwargs["trigger"])
        self.started.set()
        assert self.release.wait(30)
        if self.fail:
            raise RuntimeError("boom: an unexpected failure, not a known cannot-fit")
        return 1


def test_refitter_runs_one_refit_at_a_time(db: Database, settings: ServerSettings) -> None:
    job = _Blocking()
    refitter = Refitter(db, settings, refit=job)
    assert refitter.request() is True
    assert job.started.wait(10) and refitter.running
    assert refitter.request() is False  # refused while the first runs
    job.release.set()
    assert refitter.wait(10) and not refitter.running
    assert refitter.request("manual") is True
    assert refitter.wait(10)
    assert job.triggers == ["manual", "manual"]


def test_refitter_logs_a_failed_refit_and_recovers(
    db: Database, settings: ServerSettings, caplog: pytest.LogCaptureFixture
) -> None:
    job = _Blocking(fail=True)
    job.release.set()
    refitter = Refitter(db, settings, refit=job)
    with caplog.at_level(logging.ERROR, logger="fleetwatch.server.upkeep.refit"):
        assert refitter.request() is True
        assert refitter.wait(10)
    assert any("background refit (manual) failed" in r.message for r in caplog.records)
    assert refitter.request() is True and refitter.wait(10)  # not stuck "running"


def test_refitter_schedule_starts_with_startup_then_schedule(
    db: Database, settings: ServerSettings
) -> None:
    job = _Blocking()
    job.release.set()
    refitter = Refitter(db, settings, refit=job)

    async def drive() -> None:
        task = asyncio.create_task(refitter.run_schedule(0.05, first_delay_s=0.0))
        for _ in range(200):
            await asyncio.sleep(0.02)
            if len(job.triggers) >= 3:
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(drive())
    assert job.triggers[:3] == ["startup", "schedule", "schedule"]


def test_refit_stores_a_bad_setting_as_a_failed_version(
    db: Database, settings: ServerSettings
) -> None:
    insert_weibull_lifetimes(db)
    broken = settings.model_copy(update={"location_pattern": "c(?P<col>"})
    with pytest.raises(InvalidInput, match="not a regular expression"):
        run_refit(db, broken, trigger="schedule", now=NOW)
    with db.read() as conn:
        (stored,) = list_models(conn, 10)
    assert stored.status == "failed" and stored.metrics is None
    assert stored.error is not None and stored.error.startswith("InvalidInput")
