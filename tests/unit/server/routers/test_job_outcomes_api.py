"""POST /v1/jobs/{id}/start | end | checkpoints | restarts, and what GET /v1/jobs/{id} shows of
them: idempotent, validated (422 naming the field, nothing stored), agent scope, and a failed
job attributed to a failure of one of its nodes within the window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, insert, select
from tests.conftest import bearer

from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import evictions, gpu_lifetimes, job_checkpoints, job_restarts
from fleetwatch.server.db.tables import jobs as jobs_table
from fleetwatch.server.db.tables import nodes as nodes_table

T0 = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)


def iso(t: datetime) -> str:
    return t.isoformat()


def counts(db: Database) -> tuple[int, int, int]:
    with db.read() as conn:
        return tuple(  # type: ignore[return-value]
            conn.execute(select(func.count()).select_from(t)).scalar_one()
            for t in (jobs_table, job_checkpoints, job_restarts)
        )


@pytest.fixture
def agent(tokens: dict[str, str]) -> dict[str, str]:
    return bearer(tokens["agent"])


@pytest.fixture
def reader(tokens: dict[str, str]) -> dict[str, str]:
    return bearer(tokens["read"])


def test_job_lifecycle_is_stored_idempotently_and_shown(
    client: TestClient, db: Database, agent: dict[str, str], reader: dict[str, str]
) -> None:
    start = {"started_at": iso(T0), "nodes": ["gpu-1", "gpu-2"], "ranks": 16}
    for _ in range(2):  # a retry changes nothing
        assert client.post("/v1/jobs/j1/start", json=start, headers=agent).status_code == 200
    ckpt = {"started_at": iso(T0 + 10 * MIN), "duration_s": 42.5, "step": 1000}
    first = client.post("/v1/jobs/j1/checkpoints", json=ckpt, headers=agent).json()
    again = client.post("/v1/jobs/j1/checkpoints", json=ckpt, headers=agent).json()
    assert (first["stored"], again["stored"]) == (True, False)
    client.post("/v1/jobs/j1/checkpoints", json={**ckpt, "started_at": iso(T0 + 20 * MIN),
                "duration_s": 57.5, "step": 2000}, headers=agent)  # fmt: skip
    restart = {"resumed_at": iso(T0 + 40 * MIN), "interrupted_at": iso(T0 + 30 * MIN),
               "from_step": 2000, "lost_steps": 150}  # fmt: skip
    assert client.post("/v1/jobs/j1/restarts", json=restart, headers=agent).json()["stored"]
    assert not client.post("/v1/jobs/j1/restarts", json=restart, headers=agent).json()["stored"]
    end = {"outcome": "completed", "ended_at": iso(T0 + 90 * MIN), "reason": "done"}
    assert client.post("/v1/jobs/j1/end", json=end, headers=agent).status_code == 200
    assert counts(db) == (1, 2, 1)
    job = client.get("/v1/jobs/j1", headers=reader).json()
    assert job["started_at"].startswith("2026-11-20T12:00:00")
    assert job["ended_at"].startswith("2026-11-20T13:30:00")
    assert (job["outcome"], job["end_reason"], job["ranks"]) == ("completed", "done", 16)
    assert job["nodes"] == ["gpu-1", "gpu-2"]
    assert job["checkpoints"] == {"count": 2, "total_s": 100.0, "mean_s": 50.0, "last_step": 2000}
    assert job["restarts"] == {"count": 1, "lost_steps": 150, "lost_s": None,
                               "mean_recover_s": 600.0}  # fmt: skip
    assert job["hardware_failure"] is None
    listed = client.get("/v1/jobs", headers=reader).json()["data"]
    assert listed[0]["outcome"] == "completed"


BAD: dict[str, tuple[str, dict[str, Any], list[Any]]] = {
    "start without nodes": ("start", {"started_at": iso(T0), "nodes": []}, ["body", "nodes"]),
    "start naive time": (
        "start", {"started_at": "2026-11-20T12:00:00", "nodes": ["n"]}, ["body", "started_at"]
    ),
    "start bad node": ("start", {"started_at": iso(T0), "nodes": ["a b"]}, ["body", "nodes", 0]),
    "start future": (
        "start",
        {"started_at": iso(datetime.now(UTC) + timedelta(days=2)), "nodes": ["n"]},
        ["body", "started_at"],
    ),
    "start zero ranks": (
        "start", {"started_at": iso(T0), "nodes": ["n"], "ranks": 0}, ["body", "ranks"]
    ),
    "end unknown outcome": (
        "end", {"outcome": "crashed", "ended_at": iso(T0)}, ["body", "outcome"]
    ),
    "end long reason": (
        "end", {"outcome": "failed", "ended_at": iso(T0), "reason": "x" * 1001}, ["body", "reason"]
    ),
    "checkpoint negative duration": (
        "checkpoints", {"started_at": iso(T0), "duration_s": -1}, ["body", "duration_s"]
    ),
    "checkpoint unknown field": (
        "checkpoints", {"started_at": iso(T0), "duration_s": 1, "bytes": 9}, ["body", "bytes"]
    ),
    "restart interrupted after resumed": (
        "restarts",
        {"resumed_at": iso(T0), "interrupted_at": iso(T0 + MIN)},
        ["body", "interrupted_at"],
    ),
    "restart negative lost steps": (
        "restarts", {"resumed_at": iso(T0), "lost_steps": -5}, ["body", "lost_steps"]
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD))
def test_job_report_invalid_names_the_field_and_stores_nothing(
    client: TestClient, db: Database, agent: dict[str, str], case: str
) -> None:
    what, body, loc = BAD[case]
    response = client.post(f"/v1/jobs/j-bad/{what}", json=body, headers=agent)
    assert response.status_code == 422, response.text
    assert loc in [d["loc"] for d in response.json()["detail"]], response.json()
    assert counts(db) == (0, 0, 0)


def test_job_end_before_its_start_is_refused_and_the_start_kept(
    client: TestClient, db: Database, agent: dict[str, str], reader: dict[str, str]
) -> None:
    client.post("/v1/jobs/j2/start", json={"started_at": iso(T0), "nodes": ["n"]}, headers=agent)
    end = {"outcome": "failed", "ended_at": iso(T0 - MIN)}
    response = client.post("/v1/jobs/j2/end", json=end, headers=agent)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "ended_at"]
    assert client.get("/v1/jobs/j2", headers=reader).json()["outcome"] is None


@pytest.mark.parametrize("what", ["start", "end", "checkpoints", "restarts"])
def test_job_reports_need_an_agent_token(
    client: TestClient, reader: dict[str, str], what: str
) -> None:
    assert client.post(f"/v1/jobs/j/{what}", json={}, headers=reader).status_code == 403


def _node(db: Database, name: str) -> int:
    with db.write() as conn:
        return int(
            conn.execute(
                insert(nodes_table)
                .values(
                    name=name,
                    labels={},
                    interval_s=10.0,
                    first_seen=T0 - timedelta(days=9),
                    last_seen=T0,
                )  # fmt: skip
                .returning(nodes_table.c.id)
            ).scalar_one()
        )


def _gpu_failure(db: Database, node_id: int, at: datetime) -> None:
    with db.write() as conn:
        conn.execute(
            insert(gpu_lifetimes).values(
                serial="S1",
                node_id=node_id,
                installed_at=T0 - timedelta(days=90),
                removed_at=at,
                end_kind="failure",
                cause="hbm",
                source="observed",
            )  # fmt: skip
        )


def _eviction(db: Database, node: str, at: datetime, kind: str) -> None:
    with db.write() as conn:
        conn.execute(
            insert(evictions).values(
                node=node,
                state="completed",
                reason_kind=kind,
                reason=f"{kind}: Xid 79",
                dry_run=False,
                created_at=at,
                updated_at=at,
                completed_at=at,
            )  # fmt: skip
        )


def _failed_job(client: TestClient, agent: dict[str, str], job: str, ended: datetime) -> None:
    body = {"started_at": iso(T0 - timedelta(hours=5)), "nodes": ["gpu-7", "gpu-8"]}
    client.post(f"/v1/jobs/{job}/start", json=body, headers=agent)
    end = {"outcome": "failed", "ended_at": iso(ended), "reason": "NCCL timeout"}
    assert client.post(f"/v1/jobs/{job}/end", json=end, headers=agent).status_code == 200


def test_failed_job_is_attributed_to_a_node_failure_within_the_window(
    client: TestClient, db: Database, agent: dict[str, str], reader: dict[str, str]
) -> None:
    node_id = _node(db, "gpu-8")
    _node(db, "gpu-99")
    # Default window: 30 min before the job's end to 5 min after.
    _gpu_failure(db, node_id, T0 - 29 * MIN)  # inside
    _eviction(db, "gpu-8", T0 - 2 * MIN, "risk")  # a prediction, not a failure
    _eviction(db, "gpu-99", T0, "rule")  # not one of the job's nodes
    _failed_job(client, agent, "hit", T0)
    found = client.get("/v1/jobs/hit", headers=reader).json()["hardware_failure"]
    assert found["node"] == "gpu-8" and found["kind"] == "gpu_failure"
    assert found["at"].startswith("2026-11-20T11:31:00")
    # A rule drain 4 minutes after the end is nearer: it is the one named.
    _eviction(db, "gpu-7", T0 + 4 * MIN, "rule")
    found = client.get("/v1/jobs/hit", headers=reader).json()["hardware_failure"]
    assert (found["node"], found["kind"]) == ("gpu-7", "drain")


@pytest.mark.parametrize("offset", [-31 * MIN, 6 * MIN])
def test_failed_job_is_not_attributed_outside_the_window(
    client: TestClient,
    db: Database,
    agent: dict[str, str],
    reader: dict[str, str],
    offset: timedelta,
) -> None:
    _gpu_failure(db, _node(db, "gpu-7"), T0 + offset)
    _eviction(db, "gpu-8", T0 + offset, "rule")
    _failed_job(client, agent, "miss", T0)
    assert client.get("/v1/jobs/miss", headers=reader).json()["hardware_failure"] is None


def test_completed_job_is_never_attributed(
    client: TestClient, db: Database, agent: dict[str, str], reader: dict[str, str]
) -> None:
    _eviction(db, "gpu-1", T0, "rule")
    client.post("/v1/jobs/ok/start", json={"started_at": iso(T0 - MIN), "nodes": ["gpu-1"]},
                headers=agent)  # fmt: skip
    client.post("/v1/jobs/ok/end", json={"outcome": "completed", "ended_at": iso(T0)},
                headers=agent)  # fmt: skip
    assert client.get("/v1/jobs/ok", headers=reader).json()["hardware_failure"] is None
