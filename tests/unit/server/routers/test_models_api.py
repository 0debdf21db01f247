"""Risk-model versions over HTTP, on SQLite and PostgreSQL: list, inspect, refit, promotion."""

from __future__ import annotations

import time
from datetime import timedelta

from fastapi.testclient import TestClient
from tests.conftest import bearer
from tests.factories import make_batch
from tests.unit.server.conftest import Push
from tests.unit.server.upkeep.test_promotion import (
    START,
    insert_history,
    insert_in_service,
    store_champion,
)
from tests.unit.server.upkeep.test_refit import NOW, _Blocking, insert_weibull_lifetimes

from fleetwatch.config import ServerSettings
from fleetwatch.models.registry import RiskBundle
from fleetwatch.server.db.session import Database
from fleetwatch.server.repo.models import store_model
from fleetwatch.server.upkeep.refit import Refitter, run_refit

FIT = {"lambda": 400.0, "rho": 1.2, "rho_ci": [1.1, 1.3]}


def _store_two(db: Database) -> tuple[int, int]:
    bundle = RiskBundle.from_params({"format": 1, "fleet": FIT, "groups": {}, "aft": None})
    bundle.metrics.update({"n": 12, "events": 3})
    with db.write() as conn:
        ok = store_model(conn, bundle, trigger="schedule", trained_at=NOW - timedelta(hours=6))
        failed = store_model(conn, None, trigger="manual", trained_at=NOW, error="no data")
    return ok, failed


def test_models_list_newest_first(client: TestClient, db: Database, tokens: dict[str, str]) -> None:
    empty = client.get("/v1/models", headers=bearer(tokens["read"]))
    assert empty.status_code == 200
    assert empty.json() == {"data": [], "count": 0, "serving": None}
    ok, failed = _store_two(db)
    body = client.get("/v1/models", headers=bearer(tokens["read"])).json()
    assert body["count"] == 2 and body["serving"] == ok
    newest, oldest = body["data"]
    assert newest["version"] == failed and newest["status"] == "failed"
    assert newest["error"] == "no data" and newest["trigger"] == "manual"
    assert oldest["version"] == ok and oldest["status"] == "ok" and oldest["error"] is None
    assert oldest["metrics"] == {"n": 12, "events": 3}
    assert oldest["serving"] is True and newest["serving"] is False
    assert oldest["evaluation"] is None  # stored without one, as versions before issue 40
    assert oldest["trained_at"].startswith("2025-05-31T18:00:00")
    assert "params" not in oldest
    limited = client.get("/v1/models", params={"limit": 1}, headers=bearer(tokens["read"]))
    assert [m["version"] for m in limited.json()["data"]] == [failed]


def test_models_get_one_version(client: TestClient, db: Database, tokens: dict[str, str]) -> None:
    ok, _ = _store_two(db)
    found = client.get(f"/v1/models/{ok}", headers=bearer(tokens["read"]))
    assert found.status_code == 200, found.text
    assert found.json()["version"] == ok and found.json()["status"] == "ok"
    assert found.json()["serving"] is True
    missing = client.get("/v1/models/999", headers=bearer(tokens["read"]))
    assert missing.status_code == 404
    assert "999" in missing.json()["error"]


def test_models_refit_runs_in_the_background(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    insert_weibull_lifetimes(db)
    response = client.post("/v1/models/refit", headers=bearer(tokens["admin"]))
    assert response.status_code == 202, response.text
    assert response.json() == {"accepted": True}
    deadline = time.monotonic() + 60
    versions: list[dict[str, object]] = []
    while time.monotonic() < deadline and not versions:
        time.sleep(0.1)
        versions = client.get("/v1/models", headers=bearer(tokens["read"])).json()["data"]
    assert versions, "no model version appeared within 60 s of POST /v1/models/refit"
    (version,) = versions
    assert version["status"] == "ok", version["error"]
    assert version["trigger"] == "manual" and version["metrics"]["n"] == 400
    assert version["serving"] is True
    assert version["evaluation"]["promoted"] is True
    assert version["evaluation"]["reason"] == "no model in service"


def test_models_refit_conflicts_while_one_runs(
    client: TestClient, db: Database, settings: ServerSettings, tokens: dict[str, str]
) -> None:
    job = _Blocking()
    client.app.state.refitter = Refitter(db, settings, refit=job)  # type: ignore[attr-defined]
    admin = bearer(tokens["admin"])
    try:
        assert client.post("/v1/models/refit", headers=admin).status_code == 202
        assert job.started.wait(10)
        busy = client.post("/v1/models/refit", headers=admin)
        assert busy.status_code == 409, busy.text
        assert "already running" in busy.json()["error"]
        assert busy.json()["detail"] == [
            {"loc": ["refit"], "msg": "already running", "type": "value_error"}
        ]
    finally:
        job.release.set()
    assert client.app.state.refitter.wait(10)  # type: ignore[attr-defined]
    assert client.post("/v1/models/refit", headers=admin).status_code == 202
    assert client.app.state.refitter.wait(10)  # type: ignore[attr-defined]
    assert job.triggers == ["manual", "manual"]


def test_models_refit_needs_admin(client: TestClient, tokens: dict[str, str]) -> None:
    response = client.post("/v1/models/refit", headers=bearer(tokens["read"]))
    assert response.status_code == 403
    assert "'read'" in response.json()["error"]
    assert client.get("/v1/models", headers=bearer(tokens["agent"])).status_code == 403


def test_models_show_both_scores_and_risk_keeps_the_champion_after_a_rejected_refit(
    client: TestClient,
    db: Database,
    settings: ServerSettings,
    tokens: dict[str, str],
    push: Push,
) -> None:
    """A refit that ranks the window's failures worse than the version in service is listed
    with both scores, and /v1/risk goes on scoring with the version in service."""
    champion = store_champion(db, rho=0.5, trained_at=START - timedelta(days=1))
    insert_history(db)
    insert_in_service(db, failing="youngest")
    # No landmark span with a week of follow-up: the refit is Weibull fits alone (no telemetry
    # for an AFT), the part the history's wear-out makes rank the window backwards.
    holdout = settings.model_copy(
        update={"model_holdout_days": 30.0, "model_landmark_span_days": 1.0}
    )
    rejected = run_refit(db, holdout, trigger="manual", now=NOW)
    read = bearer(tokens["read"])

    body = client.get("/v1/models", headers=read).json()
    assert body["serving"] == champion
    newest = body["data"][0]
    assert newest["version"] == rejected and newest["status"] == "rejected"
    assert newest["serving"] is False and newest["error"] is None
    evaluation = newest["evaluation"]
    assert evaluation["promoted"] is False
    assert evaluation["reason"] == "kept the champion: AUC 0.000 < 1.000"
    assert evaluation["scorer"] == "weibull" and list(evaluation["scorers"]) == ["weibull"]
    assert evaluation["scorers"]["weibull"] == evaluation["challenger"]
    assert newest["metrics"]["landmark"]["error"] == "no GPU was in service at any landmark"
    assert evaluation["window_start"].startswith("2025-05-02T00:00:00")
    assert evaluation["challenger"]["auc"] == 0.0 and evaluation["challenger"]["failures"] == 12
    assert evaluation["champion"]["version"] == champion
    assert evaluation["champion"]["auc"] == 1.0 and evaluation["champion"]["in_sample"] is False
    one = client.get(f"/v1/models/{rejected}", headers=read).json()
    assert one["evaluation"] == evaluation

    assert push(make_batch("node-a", gpus=2, ticks=3)).status_code == 200
    client.app.state.assessor.run_once()  # type: ignore[attr-defined]
    page = client.get("/v1/risk", params={"horizon": "7d"}, headers=read).json()
    assert page["model_version"] == champion
    assert {g["model_version"] for g in page["gpus"]} == {champion}
