"""The scheduler API on evictions: shape, ack leases, complete, reject, return, audit trail.

Evictions are seeded directly (the planner has its own tests); both databases.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from tests.conftest import bearer

from fleetwatch.server.auth import create_token
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.repo.evictions import create_eviction

EVICTION_KEYS = {
    "id", "node", "state", "reason_kind", "reason", "evidence", "expected_saving_usd", "dry_run",
    "created_at", "updated_at", "claimed_by", "lease_expires_at", "completed_at", "returned_at",
    "detail", "repeat_of",
}  # fmt: skip


def _seed(db: Database, node: str = "node-a", state: str = "pending", **overrides: object) -> int:
    values: dict = {
        "reason_kind": "rule", "reason": "xid_79 on GPU 1", "evidence": {"gpus": [{"index": 1}]},
        "expected_saving_usd": 940.0, "dry_run": False,
    }  # fmt: skip
    values.update(overrides)
    with db.write() as conn:
        return create_eviction(conn, node=node, state=state, now=utcnow(), **values)


@pytest.fixture
def sched(tokens: dict[str, str]) -> dict[str, str]:
    return bearer(tokens["scheduler"])


@pytest.fixture
def other(db: Database) -> dict[str, str]:
    """A second scheduler, named sched-b."""
    with db.write() as conn:
        token, _ = create_token(conn, name="sched-b", scope="scheduler")
    return bearer(token)


def _audit(client: TestClient, eviction_id: int, headers: dict[str, str]) -> list[tuple]:
    detail = client.get(f"/v1/evictions/{eviction_id}", headers=headers).json()
    return [(a["from_state"], a["to_state"], a["actor"]) for a in detail["audit"]]


def test_evictions_list_has_the_contract_shape_and_filters(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    pending = _seed(db, "node-a")
    _seed(db, "node-b", state="paged")
    response = client.get("/v1/evictions", params={"state": "pending"},
                          headers=bearer(tokens["read"]))  # fmt: skip
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"count", "data", "cursor"}
    assert body["count"] == 1
    row = body["data"][0]
    assert set(row) == EVICTION_KEYS
    assert row["id"] == pending and row["node"] == "node-a" and row["state"] == "pending"
    assert row["evidence"] == {"gpus": [{"index": 1}]} and row["expected_saving_usd"] == 940.0
    assert row["claimed_by"] is None and row["dry_run"] is False
    everything = client.get("/v1/evictions", headers=bearer(tokens["read"])).json()
    assert everything["count"] == 2
    assert [e["node"] for e in everything["data"]] == ["node-b", "node-a"]  # newest first
    by_node = client.get("/v1/evictions", params={"node": "node-b"},
                         headers=bearer(tokens["read"])).json()  # fmt: skip
    assert [e["state"] for e in by_node["data"]] == ["paged"]


def test_evictions_list_refuses_an_unknown_state(
    client: TestClient, tokens: dict[str, str]
) -> None:
    response = client.get("/v1/evictions", params={"state": "drained"},
                          headers=bearer(tokens["read"]))  # fmt: skip
    assert response.status_code == 422
    # state may be repeated: the error names the parameter and which of its values is wrong.
    assert response.json()["detail"][0]["loc"] == ["query", "state", 0]


def test_eviction_unknown_id_is_404(client: TestClient, sched: dict[str, str]) -> None:
    assert client.get("/v1/evictions/999", headers=sched).status_code == 404
    response = client.post("/v1/evictions/999/ack", headers=sched)
    assert response.status_code == 404
    assert "999" in response.json()["error"]


def test_eviction_ack_claims_with_a_lease_for_the_token_name(
    client: TestClient, db: Database, sched: dict[str, str], other: dict[str, str]
) -> None:
    eviction = _seed(db)
    before = utcnow()
    response = client.post(f"/v1/evictions/{eviction}/ack", json={"lease_s": 120}, headers=sched)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["state"] == "acked" and body["claimed_by"] == "test-scheduler"
    lease = datetime.fromisoformat(body["lease_expires_at"])
    assert before + timedelta(seconds=119) <= lease <= utcnow() + timedelta(seconds=121)

    taken = client.post(f"/v1/evictions/{eviction}/ack", headers=other)
    assert taken.status_code == 409, taken.text
    assert "acked" in taken.json()["error"] and "test-scheduler" in taken.json()["error"]

    again = client.post(f"/v1/evictions/{eviction}/ack", json={"lease_s": 600}, headers=sched)
    assert again.status_code == 200, again.text
    assert datetime.fromisoformat(again.json()["lease_expires_at"]) > lease  # renewed
    # One ack in the trail: renewing is not a state change.
    assert _audit(client, eviction, sched) == [
        (None, "pending", "planner"), ("pending", "acked", "test-scheduler"),
    ]  # fmt: skip


def test_eviction_ack_without_body_uses_the_default_lease(
    client: TestClient, db: Database, sched: dict[str, str]
) -> None:
    eviction = _seed(db)
    asked = utcnow()
    body = client.post(f"/v1/evictions/{eviction}/ack", headers=sched).json()
    answered = utcnow()
    lease = datetime.fromisoformat(body["lease_expires_at"])
    # 300 s from the moment the server took the ack, which lies between the two stamps.
    assert asked + timedelta(seconds=300) <= lease <= answered + timedelta(seconds=300)


def test_eviction_expired_lease_can_be_taken_over(
    client: TestClient, db: Database, sched: dict[str, str], other: dict[str, str]
) -> None:
    eviction = _seed(db)
    ack = client.post(f"/v1/evictions/{eviction}/ack", json={"lease_s": 0.2}, headers=sched)
    assert ack.status_code == 200
    assert client.post(f"/v1/evictions/{eviction}/ack", headers=other).status_code == 409
    time.sleep(0.3)
    taken = client.post(f"/v1/evictions/{eviction}/ack", headers=other)
    assert taken.status_code == 200, taken.text
    assert taken.json()["claimed_by"] == "sched-b"
    # The first claimer lost it: it can no longer complete.
    late = client.post(f"/v1/evictions/{eviction}/complete", headers=sched)
    assert late.status_code == 409, late.text
    detail = client.get(f"/v1/evictions/{eviction}", headers=sched).json()
    assert detail["audit"][-1]["actor"] == "sched-b"
    assert detail["audit"][-1]["detail"]["took_over_from"] == "test-scheduler"


@pytest.mark.parametrize("lease_s", [0, -5, 100_000])
def test_eviction_ack_refuses_a_bad_lease(
    client: TestClient, db: Database, sched: dict[str, str], lease_s: float
) -> None:
    eviction = _seed(db)
    response = client.post(
        f"/v1/evictions/{eviction}/ack", json={"lease_s": lease_s}, headers=sched
    )
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "lease_s"]


def test_eviction_complete_needs_an_ack_by_the_caller(
    client: TestClient, db: Database, sched: dict[str, str], other: dict[str, str]
) -> None:
    eviction = _seed(db)
    early = client.post(f"/v1/evictions/{eviction}/complete", headers=sched)
    assert early.status_code == 409
    assert "pending" in early.json()["error"]
    assert client.post(f"/v1/evictions/{eviction}/ack", headers=sched).status_code == 200
    assert client.post(f"/v1/evictions/{eviction}/complete", headers=other).status_code == 409
    done = client.post(f"/v1/evictions/{eviction}/complete", headers=sched)
    assert done.status_code == 200, done.text
    assert done.json()["state"] == "completed" and done.json()["completed_at"] is not None
    assert done.json()["lease_expires_at"] is None
    # Idempotent for the claimer.
    again = client.post(f"/v1/evictions/{eviction}/complete", headers=sched)
    assert again.status_code == 200 and again.json()["completed_at"] == done.json()["completed_at"]


def test_eviction_reject_needs_a_reason_and_records_it(
    client: TestClient, db: Database, sched: dict[str, str]
) -> None:
    eviction = _seed(db)
    missing = client.post(f"/v1/evictions/{eviction}/reject", json={}, headers=sched)
    assert missing.status_code == 422
    assert missing.json()["detail"][0]["loc"] == ["body", "reason"]
    empty = client.post(f"/v1/evictions/{eviction}/reject", json={"reason": ""}, headers=sched)
    assert empty.status_code == 422
    response = client.post(
        f"/v1/evictions/{eviction}/reject", json={"reason": "job finishing in 1 h"}, headers=sched
    )
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "rejected"
    assert response.json()["detail"] == "job finishing in 1 h"
    twice = client.post(f"/v1/evictions/{eviction}/reject", json={"reason": "x"}, headers=sched)
    assert twice.status_code == 409
    assert "rejected" in twice.json()["error"]
    detail = client.get(f"/v1/evictions/{eviction}", headers=sched).json()
    assert detail["audit"][-1]["detail"] == {"reason": "job finishing in 1 h"}


@pytest.mark.parametrize("state", ["cancelled", "returned", "recommended", "paged"])
def test_eviction_illegal_ack_names_the_state(
    client: TestClient, db: Database, sched: dict[str, str], state: str
) -> None:
    eviction = _seed(db, state=state)
    response = client.post(f"/v1/evictions/{eviction}/ack", headers=sched)
    assert response.status_code == 409, response.text
    assert state in response.json()["error"]


def test_node_return_records_returned_at_and_the_full_trail(
    client: TestClient, db: Database, sched: dict[str, str]
) -> None:
    # A straggler drain: not a hardware reason, so no validation gates its return
    # (tests/unit/server/routers/test_return_gate.py has the gated ones).
    eviction = _seed(db, reason_kind="straggler", reason="straggler: 1.4x the job median")
    nothing = client.post("/v1/nodes/node-a/return", json={"note": "x"}, headers=sched)
    assert nothing.status_code == 404, nothing.text
    assert client.post(f"/v1/evictions/{eviction}/ack", headers=sched).status_code == 200
    completed = client.post(f"/v1/evictions/{eviction}/complete", headers=sched).json()
    response = client.post(
        "/v1/nodes/node-a/return", json={"note": "GPU 1 replaced"}, headers=sched
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"] == eviction and body["state"] == "returned"
    assert body["detail"] == "GPU 1 replaced"
    returned = datetime.fromisoformat(body["returned_at"])
    assert returned >= datetime.fromisoformat(completed["completed_at"])  # MTTR >= 0
    assert _audit(client, eviction, sched) == [
        (None, "pending", "planner"),
        ("pending", "acked", "test-scheduler"),
        ("acked", "completed", "test-scheduler"),
        ("completed", "returned", "test-scheduler"),
    ]
    # Returned once; a second return has nothing to return.
    assert client.post("/v1/nodes/node-a/return", headers=sched).status_code == 404


def test_read_token_may_list_but_not_ack(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    eviction = _seed(db)
    reader = bearer(tokens["read"])
    assert client.get(f"/v1/evictions/{eviction}", headers=reader).status_code == 200
    assert client.post(f"/v1/evictions/{eviction}/ack", headers=reader).status_code == 403


def test_on_call_approves_a_paged_eviction_over_the_budget(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    """Past the drain budget an eviction is paged; on-call approving it makes it pending for
    the schedulers, with who and why in the audit log; a pending one cannot be approved."""
    with db.write() as conn:
        paged = create_eviction(conn, node="node-p", state="paged", reason_kind="rule",
                                reason="xid 79", evidence={}, expected_saving_usd=None,
                                dry_run=False, now=utcnow())  # fmt: skip
    admin = bearer(tokens["admin"])
    body = {"note": "confirmed with the vendor"}
    answer = client.post(f"/v1/evictions/{paged}/approve", json=body, headers=admin)
    assert answer.status_code == 200, answer.text
    assert answer.json()["state"] == "pending"
    again = client.post(f"/v1/evictions/{paged}/approve", json=body, headers=admin)
    assert again.status_code == 409 and "pending" in again.text
    detail = client.get(f"/v1/evictions/{paged}", headers=bearer(tokens["read"])).json()
    last = detail["audit"][-1]
    assert (last["from_state"], last["to_state"]) == ("paged", "pending")
    assert last["detail"]["approved"] == "confirmed with the vendor"
    empty = client.post(f"/v1/evictions/{paged}/approve", json={"note": ""}, headers=admin)
    assert empty.status_code == 422 and "note" in empty.text
