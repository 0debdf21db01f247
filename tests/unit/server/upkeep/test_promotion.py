"""The promotion rule of refits, on both databases: a refit serves only if its recipe, fitted on
what was known at the held-out window's start, ranks that window's failures at least as well as
the version in service.

The stored data make the answer plain. The history before the window is wear-out (every earlier
GPU failed of age, Weibull shape 2.5), so the refit's recipe ranks older GPUs riskier. The 40 GPUs
in service at the window's start are 10 to 400 days old; the window's failures are either the
oldest (the recipe ranks them perfectly: AUC 1) or the youngest (AUC 0). The champions are
hand-built Weibulls: shape 0.5 ranks younger GPUs riskier (the opposite AUC), shape 2 ranks as
the recipe does.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import numpy as np
import pytest
from sqlalchemy import insert, select

from fleetwatch.config import ServerSettings
from fleetwatch.models.base import ModelFitError
from fleetwatch.models.registry import RiskBundle
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import events, gpu_lifetimes, risk_models
from fleetwatch.server.repo.models import get_model, latest_ok_model, store_model
from fleetwatch.server.upkeep.refit import run_refit

NOW = datetime(2025, 6, 1, tzinfo=UTC)
START = NOW - timedelta(days=30)  # the held-out window is (START, NOW]
IN_SERVICE = 40


def _lifetime(serial: str, installed: datetime, removed: datetime | None) -> dict[str, Any]:
    return {
        "serial": serial,
        "sku": "H100",
        "installed_at": installed,
        "removed_at": removed,
        "end_kind": None if removed is None else "failure",
        "source": "observed",
    }


def insert_history(db: Database, *, n: int = 200, seed: int = 11) -> None:
    """``n`` GPUs that failed of wear-out (Weibull shape 2.5, scale 300 days) before START."""
    rng = np.random.default_rng(seed)
    life = 300.0 * rng.weibull(2.5, size=n)
    gap = rng.uniform(1.0, 500.0, size=n)  # days from the failure to START
    rows = []
    for i, (t, g) in enumerate(zip(life, gap, strict=True)):
        removed = START - timedelta(days=float(g))
        rows.append(_lifetime(f"H{i}", removed - timedelta(days=float(t)), removed))
    with db.write() as conn:
        conn.execute(insert(gpu_lifetimes), rows)


def insert_in_service(
    db: Database, *, failing: Literal["oldest", "youngest"], failures: int = 12
) -> None:
    """40 GPUs in service at START, 10, 20, ..., 400 days old; ``failures`` of them, the oldest
    or the youngest, fail 10 days into the window, the rest are still in service at NOW."""
    ages = [10.0 * (i + 1) for i in range(IN_SERVICE)]
    fail = set(ages[-failures:] if failing == "oldest" else ages[:failures])
    rows = [
        _lifetime(
            f"S{i}",
            START - timedelta(days=age),
            START + timedelta(days=10) if age in fail else None,
        )
        for i, age in enumerate(ages)
    ]
    with db.write() as conn:
        conn.execute(insert(gpu_lifetimes), rows)


def store_champion(db: Database, *, rho: float, trained_at: datetime) -> int:
    fit = {"lambda": 400.0, "rho": rho, "rho_ci": [rho * 0.9, rho * 1.1]}
    bundle = RiskBundle.from_params({"format": 1, "fleet": fit, "groups": {}, "aft": None})
    with db.write() as conn:
        return store_model(conn, bundle, trigger="schedule", trained_at=trained_at)


def _settings(settings: ServerSettings) -> ServerSettings:
    # No landmark span with a week of follow-up: these refits are Weibull fits alone, so the
    # rule is tested on one part (tests/unit/server/upkeep/test_landmark_refit.py tests the
    # choice among parts).
    return settings.model_copy(
        update={
            "model_holdout_days": 30.0,
            "model_holdout_min_failures": 10,
            "model_landmark_span_days": 1.0,
        }
    )


def _evaluation(db: Database, version: int) -> tuple[str, dict[str, Any]]:
    with db.read() as conn:
        row = get_model(conn, version)
    assert row.evaluation is not None
    return row.status, row.evaluation


def test_a_first_refit_is_promoted_and_scored(db: Database, settings: ServerSettings) -> None:
    insert_history(db)
    insert_in_service(db, failing="oldest")
    version = run_refit(db, _settings(settings), trigger="schedule", now=NOW)
    assert version is not None
    status, evaluation = _evaluation(db, version)
    assert status == "ok" and evaluation["promoted"] is True
    assert evaluation["reason"] == "no model in service"
    assert evaluation["window_start"] == START.isoformat()
    assert evaluation["window_end"] == NOW.isoformat()
    challenger = evaluation["challenger"]
    assert (challenger["n"], challenger["failures"]) == (IN_SERVICE, 12)
    assert challenger["auc"] == 1.0 and challenger["ap"] == 1.0
    assert 0.0 <= challenger["ece"] <= 1.0
    assert evaluation["champion"] is None


def test_a_refit_that_ranks_worse_is_rejected_and_the_champion_serves(
    db: Database, settings: ServerSettings
) -> None:
    champion = store_champion(db, rho=0.5, trained_at=START - timedelta(days=1))
    insert_history(db)
    insert_in_service(db, failing="youngest")  # against the history: the champion is right
    version = run_refit(db, _settings(settings), trigger="schedule", now=NOW)
    assert version == champion + 1
    status, evaluation = _evaluation(db, version)
    assert status == "rejected" and evaluation["promoted"] is False
    assert evaluation["reason"] == "kept the champion: AUC 0.000 < 1.000"
    assert evaluation["challenger"]["auc"] == 0.0
    assert evaluation["champion"] == {
        "version": champion,
        "auc": 1.0,
        "ap": 1.0,
        "ece": evaluation["champion"]["ece"],
        "in_sample": False,  # trained before the window
    }
    with db.read() as conn:
        serving = latest_ok_model(conn)
        params = conn.execute(
            select(risk_models.c.params).where(risk_models.c.version == version)
        ).scalar()
        onsets = conn.execute(select(events).where(events.c.kind == "wear_out_onset")).all()
    assert serving is not None and serving.version == champion
    assert params is not None and params["fleet"]["rho"] > 1  # kept, to inspect
    # The refit's wear-out (shape 0.5 -> about 2.5) is not news while it does not serve.
    assert onsets == []


def test_a_refit_that_ranks_better_is_promoted(db: Database, settings: ServerSettings) -> None:
    champion = store_champion(db, rho=0.5, trained_at=START - timedelta(days=1))
    insert_history(db)
    insert_in_service(db, failing="oldest")
    version = run_refit(db, _settings(settings), trigger="schedule", now=NOW)
    assert version is not None
    status, evaluation = _evaluation(db, version)
    assert status == "ok" and evaluation["reason"] == "promoted: AUC 1.000 > 0.000"
    assert evaluation["champion"]["version"] == champion and evaluation["champion"]["auc"] == 0.0
    with db.read() as conn:
        serving = latest_ok_model(conn)
        onsets = conn.execute(select(events).where(events.c.kind == "wear_out_onset")).all()
    assert serving is not None and serving.version == version
    assert [e.details["model_version"] for e in onsets] == [version]


def test_a_tie_goes_to_the_refit(db: Database, settings: ServerSettings) -> None:
    store_champion(db, rho=2.0, trained_at=START - timedelta(days=1))  # ranks by age, too
    insert_history(db)
    insert_in_service(db, failing="oldest")
    version = run_refit(db, _settings(settings), trigger="schedule", now=NOW)
    assert version is not None
    status, evaluation = _evaluation(db, version)
    assert status == "ok"
    assert evaluation["reason"] == "promoted: AUC tied at 1.000, AP 1.000 >= 1.000"


def test_too_few_failures_in_the_window_promote_without_comparing(
    db: Database, settings: ServerSettings
) -> None:
    # The champion, trained inside the window, would win: 3 failures are too few to say so.
    champion = store_champion(db, rho=0.5, trained_at=START + timedelta(days=20))
    insert_history(db)
    insert_in_service(db, failing="youngest", failures=3)
    version = run_refit(db, _settings(settings), trigger="schedule", now=NOW)
    assert version is not None
    status, evaluation = _evaluation(db, version)
    assert status == "ok"
    assert evaluation["reason"] == "not compared: 3 failures in the window (fewer than 10)"
    assert evaluation["challenger"]["failures"] == 3 and evaluation["challenger"]["auc"] == 0.0
    assert evaluation["champion"]["version"] == champion
    assert evaluation["champion"]["in_sample"] is True and evaluation["champion"]["auc"] == 1.0


def test_a_recipe_that_could_not_fit_at_the_window_start_is_not_compared(
    db: Database, settings: ServerSettings
) -> None:
    store_champion(db, rho=0.5, trained_at=START - timedelta(days=1))
    insert_in_service(db, failing="youngest")  # no failure at all before START
    version = run_refit(db, _settings(settings), trigger="schedule", now=NOW)
    assert version is not None
    status, evaluation = _evaluation(db, version)
    assert status == "ok"
    assert evaluation["reason"].startswith(
        "not compared: the refit's recipe could not be fitted on what was known at the window "
        "start (fleet Weibull: no failures"
    )
    assert evaluation["challenger"] == {
        "auc": None,
        "ap": None,
        "ece": None,
        "n": 40,
        "failures": 12,
    }


@pytest.mark.parametrize("with_champion", [False, True])
def test_a_refit_that_does_not_fit_says_what_judges_instead(
    db: Database, settings: ServerSettings, with_champion: bool
) -> None:
    champion = store_champion(db, rho=1.2, trained_at=START) if with_champion else None
    with pytest.raises(ModelFitError, match="empty"):
        run_refit(db, _settings(settings), trigger="schedule", now=NOW)
    with db.read() as conn:
        serving = latest_ok_model(conn)
        version = conn.execute(
            select(risk_models.c.version).order_by(risk_models.c.version.desc())
        ).scalar()
    assert version is not None
    status, evaluation = _evaluation(db, version)
    assert status == "failed" and evaluation["promoted"] is False
    assert evaluation["challenger"] is None and evaluation["champion"] is None
    assert evaluation["reason"].startswith("not fitted (ModelFitError: ")
    if champion is None:
        assert serving is None
        assert evaluation["reason"].endswith("no model in service: the rules alone judge the fleet")
    else:
        assert serving is not None and serving.version == champion
        assert evaluation["reason"].endswith(f"version {champion} stays in service")


def test_a_champion_this_version_cannot_read_is_replaced(
    db: Database, settings: ServerSettings
) -> None:
    """A version stored in a format this release cannot score (its error says to refit) is not
    compared: the refit serves."""
    with db.write() as conn:
        conn.execute(
            insert(risk_models).values(
                trained_at=START - timedelta(days=1),
                trigger="schedule",
                status="ok",
                params={"format": 99},
            )
        )
    insert_history(db)
    insert_in_service(db, failing="youngest")
    version = run_refit(db, _settings(settings), trigger="schedule", now=NOW)
    assert version == 2
    status, evaluation = _evaluation(db, version)
    assert status == "ok"
    assert evaluation["reason"].startswith("not compared: the champion cannot be scored (")
    assert "refit the model" in evaluation["reason"]
    assert evaluation["champion"]["version"] == 1 and evaluation["champion"]["auc"] is None
