"""Job notices (issue 15): derived from evictions, rule verdicts and risk for running jobs,
cleared with their causes, read by cursor (a reconnecting rank sees what it missed), long-polled,
and readable with the job's agent token. Both databases; passes driven by hand."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from tests.conftest import bearer
from tests.factories import gpu_uuid, make_batch
from tests.unit.server.conftest import Push
from tests.unit.server.routers.test_risk_api import _store_model, _xid_batch

from fleetwatch.server.act.notices import JobNotices
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import job_notices
from fleetwatch.server.db.tables import jobs as jobs_table


def _start(
    client: TestClient, agent: dict[str, str], job: str, nodes: list[str], **kw: Any
) -> None:
    body = {"started_at": datetime.now(UTC).isoformat(), "nodes": nodes, **kw}
    response = client.post(f"/v1/jobs/{job}/start", json=body, headers=agent)
    assert response.status_code == 200, response.text


def _notices(client: TestClient) -> JobNotices:
    found: JobNotices = client.app.state.notices  # type: ignore[attr-defined]
    return found


def _assess_plan_notify(client: TestClient) -> None:
    state = client.app.state  # type: ignore[attr-defined]
    state.assessor.run_once()
    state.planner.run_once()
    _notices(client).run_once()


def _read(client: TestClient, headers: dict[str, str], job: str, **params: Any) -> dict[str, Any]:
    response = client.get(f"/v1/jobs/{job}/notices", params=params, headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


@pytest.fixture
def agent(tokens: dict[str, str]) -> dict[str, str]:
    return bearer(tokens["agent"])


def test_fatal_xid_opens_drain_and_gpu_out_notices_and_a_reject_clears_the_drain(
    client: TestClient, push: Push, db: Database, agent: dict[str, str], tokens: dict[str, str]
) -> None:
    _start(client, agent, "llm-1", ["node-a", "node-b"])
    _start(client, agent, "other", ["node-b"])
    assert push(_xid_batch("node-a", 79)).status_code == 200
    assert push(make_batch("node-b", gpus=2, ticks=3)).status_code == 200
    _assess_plan_notify(client)

    first = _read(client, agent, "llm-1")
    kinds = {(n["kind"], n["node"], n["gpu"], n["action"]) for n in first["data"]}
    assert kinds == {
        ("drain_pending", "node-a", None, "checkpoint_and_exit"),
        ("gpu_out", "node-a", gpu_uuid("node-a", 1), "checkpoint_and_exit"),
    }
    drain = next(n for n in first["data"] if n["kind"] == "drain_pending")
    assert drain["evidence"]["state"] == "pending" and drain["cleared_at"] is None
    gpu_out = next(n for n in first["data"] if n["kind"] == "gpu_out")
    assert any(79 in v["xids"] for v in gpu_out["evidence"]["verdicts"])
    assert first["open"] == 2 and first["cursor"] == max(n["id"] for n in first["data"])
    assert _read(client, agent, "other")["data"] == []  # node-b is healthy

    # Another pass changes nothing: a notice is opened once.
    _notices(client).run_once()
    assert _read(client, agent, "llm-1", after=first["cursor"])["data"] == []

    sched = bearer(tokens["scheduler"])
    eviction = drain["evidence"]["eviction_id"]
    rejected = client.post(
        f"/v1/evictions/{eviction}/reject", json={"reason": "job must finish"}, headers=sched
    )
    assert rejected.status_code == 200
    _notices(client).run_once()
    # A rank that reconnects with its cursor sees only what it missed: the clearing.
    missed = _read(client, bearer(tokens["read"]), "llm-1", after=first["cursor"])
    [cleared] = missed["data"]
    assert cleared["kind"] == "cleared" and cleared["clears"] == drain["id"]
    assert cleared["action"] == "continue" and cleared["node"] == "node-a"
    assert missed["open"] == 1  # the GPU is still out
    again = _read(client, agent, "llm-1")
    assert next(n for n in again["data"] if n["id"] == drain["id"])["cleared_at"] is not None


def test_an_ended_job_gets_no_notices_and_its_open_ones_clear(
    client: TestClient, push: Push, agent: dict[str, str]
) -> None:
    _start(client, agent, "done", ["node-a"])
    assert push(_xid_batch("node-a", 79)).status_code == 200
    _assess_plan_notify(client)
    assert _read(client, agent, "done")["open"] == 2
    end = {"outcome": "completed", "ended_at": datetime.now(UTC).isoformat()}
    assert client.post("/v1/jobs/done/end", json=end, headers=agent).status_code == 200
    _notices(client).run_once()
    body = _read(client, agent, "done")
    assert body["open"] == 0 and sum(n["kind"] == "cleared" for n in body["data"]) == 2


def test_risk_notice_uses_the_threshold_the_job_chose(
    client: TestClient, push: Push, db: Database, agent: dict[str, str]
) -> None:
    _store_model(db)
    assert push(make_batch("node-r", gpus=2, ticks=3)).status_code == 200
    _start(client, agent, "careful", ["node-r"], notice_risk_threshold=1e-9, horizon_h=48)
    _start(client, agent, "relaxed", ["node-r"], notice_risk_threshold=1.0)
    _assess_plan_notify(client)
    [risk] = _read(client, agent, "careful")["data"]
    assert risk["kind"] == "risk" and risk["action"] == "checkpoint_now"
    assert risk["evidence"]["horizon_h"] == 48 and risk["evidence"]["threshold"] == 1e-9
    assert 0 < risk["evidence"]["probability"] < 1
    assert _read(client, agent, "relaxed")["data"] == []


def test_start_refuses_a_bad_threshold_and_stores_nothing(
    client: TestClient, db: Database, agent: dict[str, str]
) -> None:
    body = {"started_at": datetime.now(UTC).isoformat(), "nodes": ["n"]}
    for bad in ({"notice_risk_threshold": 0}, {"notice_risk_threshold": 1.5}, {"horizon_h": -1}):
        response = client.post("/v1/jobs/j/start", json={**body, **bad}, headers=agent)
        assert response.status_code == 422
        assert next(iter(bad)) in response.text
    with db.read() as conn:
        assert conn.execute(select(func.count()).select_from(jobs_table)).scalar_one() == 0


def test_targeted_pass_reconciles_only_its_nodes(
    client: TestClient, push: Push, db: Database, agent: dict[str, str]
) -> None:
    _start(client, agent, "j", ["node-a", "node-b"])
    assert push(_xid_batch("node-a", 79)).status_code == 200
    assert push(_xid_batch("node-b", 79)).status_code == 200
    state = client.app.state  # type: ignore[attr-defined]
    state.assessor.run_once()
    changes = _notices(client).run_once(nodes=["node-b"])
    assert changes.opened == 1  # node-b's GPU only: no eviction planned yet
    with db.read() as conn:
        rows = conn.execute(select(job_notices.c.node, job_notices.c.kind)).all()
    assert [tuple(r) for r in rows] == [("node-b", "gpu_out")]


def test_long_poll_answers_when_a_notice_is_stored(
    client: TestClient, push: Push, agent: dict[str, str]
) -> None:
    _start(client, agent, "waiter", ["node-a"])
    answers: list[httpx.Response] = []
    asked = threading.Event()

    def wait() -> None:
        asked.set()
        answers.append(client.get("/v1/jobs/waiter/notices", params={"wait": 60}, headers=agent))

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    assert asked.wait(30)
    assert push(_xid_batch("node-a", 79)).status_code == 200
    _assess_plan_notify(client)
    thread.join(60)
    assert not thread.is_alive()
    [answer] = answers
    assert answer.status_code == 200 and answer.json()["count"] == 2


def test_notices_need_a_token_and_accept_agent_and_read_scopes(
    client: TestClient, tokens: dict[str, str]
) -> None:
    assert client.get("/v1/jobs/j/notices").status_code == 401
    for scope in ("agent", "read", "scheduler", "admin"):
        assert client.get("/v1/jobs/j/notices", headers=bearer(tokens[scope])).status_code == 200
    bad = client.get("/v1/jobs/j/notices", params={"after": -1}, headers=bearer(tokens["agent"]))
    assert bad.status_code == 422 and "after" in bad.text


def test_not_running_when_silent_longer_than_the_idle_limit(
    client: TestClient, push: Push, agent: dict[str, str]
) -> None:
    old = datetime.now(UTC) - timedelta(hours=5)
    body = {"started_at": old.isoformat(), "nodes": ["node-a"]}
    assert client.post("/v1/jobs/stale/start", json=body, headers=agent).status_code == 200
    assert push(_xid_batch("node-a", 79)).status_code == 200
    _assess_plan_notify(client)
    assert _read(client, agent, "stale")["data"] == []
