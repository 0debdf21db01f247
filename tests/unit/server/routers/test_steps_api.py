"""POST /v1/jobs/{job_id}/steps: strict validation (422 naming the field, nothing stored)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from tests.conftest import bearer

from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import job_steps, jobs

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def step(**overrides: Any) -> dict[str, Any]:
    body = {"rank": 0, "node": "gpu-001", "step": 1, "duration_ms": 812.5,
            "ts": T0.isoformat(), "stage": 0, "dp_group": 0}  # fmt: skip
    body.update(overrides)
    return {k: v for k, v in body.items() if v is not ...}


def counts(db: Database) -> tuple[int, int]:
    with db.read() as conn:
        return (
            conn.execute(select(func.count()).select_from(job_steps)).scalar_one(),
            conn.execute(select(func.count()).select_from(jobs)).scalar_one(),
        )


def test_steps_batch_is_stored_and_widens_the_job(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    agent = bearer(tokens["agent"])
    first = [step(rank=r, node=f"gpu-00{r // 2}", ts=(T0 + timedelta(seconds=r)).isoformat())
             for r in range(4)]  # fmt: skip
    response = client.post("/v1/jobs/llm-7/steps", json={"steps": first}, headers=agent)
    assert response.status_code == 200, response.text
    assert response.json() == {"accepted": 4, "job_id": "llm-7", "ranks": 4, "nodes": 2}
    later = [step(rank=9, node="gpu-009", ts=(T0 - timedelta(seconds=5)).isoformat(), stage=None)]
    response = client.post("/v1/jobs/llm-7/steps", json={"steps": later}, headers=agent)
    assert response.json()["ranks"] == 10 and response.json()["nodes"] == 3
    assert counts(db) == (5, 1)
    job = client.get("/v1/jobs/llm-7", headers=bearer(tokens["read"])).json()
    assert job["first_seen"].startswith("2024-12-31T23:59:55")
    assert job["last_seen"].startswith("2025-01-01T00:00:03")
    assert job["nodes"] == ["gpu-000", "gpu-001", "gpu-009"]


BAD: dict[str, tuple[Callable[[], list[dict[str, Any]]], list[Any]]] = {
    "negative rank": (lambda: [step(), step(rank=-1)], ["body", "steps", 1, "rank"]),
    "rank as string": (lambda: [step(rank="3")], ["body", "steps", 0, "rank"]),
    "fractional step": (lambda: [step(step=1.5)], ["body", "steps", 0, "step"]),
    "zero duration": (lambda: [step(duration_ms=0)], ["body", "steps", 0, "duration_ms"]),
    "duration as text": (lambda: [step(duration_ms="fast")], ["body", "steps", 0, "duration_ms"]),
    "missing ts": (lambda: [step(ts=...)], ["body", "steps", 0, "ts"]),
    "naive ts": (lambda: [step(), step(ts="2025-01-01T00:00:00")], ["body", "steps", 1, "ts"]),
    "future ts": (
        lambda: [step(ts=(datetime.now(UTC) + timedelta(days=1)).isoformat())],
        ["body", "steps", 0, "ts"],
    ),
    "empty node": (lambda: [step(node="")], ["body", "steps", 0, "node"]),
    "node with a space": (lambda: [step(node="gpu 1")], ["body", "steps", 0, "node"]),
    "negative stage": (lambda: [step(stage=-2)], ["body", "steps", 0, "stage"]),
    "unknown field": (lambda: [step(loss=0.1)], ["body", "steps", 0, "loss"]),
    "empty batch": (lambda: [], ["body", "steps"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_steps_invalid_batch_names_the_field_and_stores_nothing(
    client: TestClient, db: Database, tokens: dict[str, str], case: str
) -> None:
    make, loc = BAD[case]
    response = client.post(
        "/v1/jobs/j-1/steps", json={"steps": make()}, headers=bearer(tokens["agent"])
    )
    assert response.status_code == 422, response.text
    assert loc in [d["loc"] for d in response.json()["detail"]], response.json()
    assert counts(db) == (0, 0)


def test_steps_batch_over_the_limit_is_refused_whole(
    make_client: Callable[..., TestClient], tokens: dict[str, str], db: Database
) -> None:
    small = make_client(max_steps_per_batch=3)
    body = {"steps": [step(rank=r) for r in range(4)]}
    response = small.post("/v1/jobs/j-1/steps", json=body, headers=bearer(tokens["agent"]))
    assert response.status_code == 422
    assert response.json()["detail"] == [
        {"loc": ["body", "steps"], "msg": "more than 3 steps", "type": "value_error"}
    ]
    assert counts(db) == (0, 0)


def test_steps_bad_job_id_is_refused(client: TestClient, tokens: dict[str, str]) -> None:
    response = client.post(
        "/v1/jobs/bad%20job/steps", json={"steps": [step()]}, headers=bearer(tokens["agent"])
    )
    assert response.status_code == 422
    assert ["path", "job_id"] in [d["loc"] for d in response.json()["detail"]]


def test_steps_need_an_agent_token_not_read(client: TestClient, tokens: dict[str, str]) -> None:
    response = client.post(
        "/v1/jobs/j-1/steps", json={"steps": [step()]}, headers=bearer(tokens["read"])
    )
    assert response.status_code == 403


def test_jobs_unknown_job_is_404(client: TestClient, tokens: dict[str, str]) -> None:
    assert client.get("/v1/jobs/nope", headers=bearer(tokens["read"])).status_code == 404
