"""The return-to-service gate: ``POST /v1/nodes/{name}/validations`` and the 409 on a return.

A node evicted for a hardware reason returns only after a passing validation received after
its eviction; an admin may force the return with a reason (audited); any other token may not.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from tests.conftest import bearer
from tests.factories import make_validation

from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import evictions, node_validations
from fleetwatch.server.repo.evictions import create_eviction


def _completed(
    db: Database, node: str = "node-a", kind: str = "rule", reason: str = "xid_79 on GPU 1"
) -> int:
    """An eviction of ``node``, drained (completed) by a scheduler."""
    with db.write() as conn:
        eviction_id = create_eviction(
            conn, node=node, state="pending", reason_kind=kind, reason=reason, evidence={},
            expected_saving_usd=None, dry_run=False, now=utcnow(),
        )  # fmt: skip
        conn.execute(
            evictions.update()
            .where(evictions.c.id == eviction_id)
            .values(state="completed", completed_at=utcnow(), claimed_by="test-scheduler")
        )
    return eviction_id


def _push(client: TestClient, tokens: dict[str, str], report: dict[str, Any]) -> Any:
    node = report["node"]
    return client.post(
        f"/v1/nodes/{node}/validations", json=report, headers=bearer(tokens["agent"])
    )


def _return(client: TestClient, token: str, **body: Any) -> Any:
    return client.post("/v1/nodes/node-a/return", json=body or None, headers=bearer(token))


def _state(db: Database, eviction_id: int) -> str:
    with db.read() as conn:
        return str(
            conn.execute(select(evictions.c.state).where(evictions.c.id == eviction_id)).scalar()
        )


def _audit(client: TestClient, tokens: dict[str, str], eviction_id: int) -> list[dict[str, Any]]:
    detail = client.get(f"/v1/evictions/{eviction_id}", headers=bearer(tokens["read"])).json()
    audit: list[dict[str, Any]] = detail["audit"]
    return audit


def test_hardware_eviction_without_a_validation_is_refused(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    eviction = _completed(db)
    refused = _return(client, tokens["scheduler"], note="GPU reseated")
    assert refused.status_code == 409, refused.text
    message = refused.json()["error"]
    assert "no validation newer than the eviction" in message
    assert "fleetwatch validate" in message and '"force": true' in message
    assert _state(db, eviction) == "completed"


def test_failed_validation_is_refused_naming_the_failed_checks(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    eviction = _completed(db)
    report = make_validation(failing=("nvml.ecc_volatile", "nvml.pcie_link"))
    pushed = _push(client, tokens, report)
    assert pushed.status_code == 201, pushed.text
    assert pushed.json()["passed"] is False
    assert pushed.json()["failed"] == ["nvml.ecc_volatile on GPU 0", "nvml.pcie_link on GPU 0"]
    refused = _return(client, tokens["scheduler"])
    assert refused.status_code == 409, refused.text
    assert "failed: nvml.ecc_volatile on GPU 0, nvml.pcie_link on GPU 0" in refused.json()["error"]
    assert _state(db, eviction) == "completed"


def test_passing_validation_after_the_eviction_lets_it_return(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    eviction = _completed(db)
    pushed = _push(client, tokens, make_validation())
    assert pushed.status_code == 201 and pushed.json()["passed"] is True
    back = _return(client, tokens["scheduler"], note="GPU reseated")
    assert back.status_code == 200, back.text
    assert back.json()["state"] == "returned" and back.json()["detail"] == "GPU reseated"
    assert _audit(client, tokens, eviction)[-1]["detail"] == {"note": "GPU reseated"}


def test_validation_older_than_the_eviction_does_not_count(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    assert _push(client, tokens, make_validation()).status_code == 201  # before the failure
    eviction = _completed(db)
    refused = _return(client, tokens["scheduler"])
    assert refused.status_code == 409
    assert "no validation newer than the eviction" in refused.json()["error"]
    assert _state(db, eviction) == "completed"


def test_a_newer_failing_validation_closes_the_gate_again(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    _completed(db)
    assert _push(client, tokens, make_validation()).status_code == 201
    assert _push(client, tokens, make_validation(failing=("nvml.clocks_idle",))).status_code == 201
    refused = _return(client, tokens["scheduler"])
    assert refused.status_code == 409
    assert "nvml.clocks_idle on GPU 0" in refused.json()["error"]


def test_admin_may_force_a_return_with_a_reason_and_it_is_audited(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    eviction = _completed(db)
    assert (
        _push(client, tokens, make_validation(failing=("nvml.remapped_rows",))).status_code == 201
    )
    reason = "vendor replaced the board; DCGM r3 passed on the bench, ticket 4711"
    back = _return(client, tokens["admin"], force=True, reason=reason, note="board swap")
    assert back.status_code == 200, back.text
    assert back.json()["state"] == "returned"
    assert back.json()["detail"] == f"forced: {reason}"
    last = _audit(client, tokens, eviction)[-1]
    assert (last["from_state"], last["to_state"], last["actor"]) == (
        "completed",
        "returned",
        "test-admin",
    )
    assert last["detail"]["forced"] == reason and last["detail"]["note"] == "board swap"
    assert "nvml.remapped_rows on GPU 0" in last["detail"]["blocked_by"]


def test_a_scheduler_token_may_not_force(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    eviction = _completed(db)
    refused = _return(client, tokens["scheduler"], force=True, reason="trust me")
    assert refused.status_code == 403, refused.text
    assert "admin" in refused.json()["error"]
    assert _state(db, eviction) == "completed"


def test_force_without_a_reason_is_a_422_naming_it(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    eviction = _completed(db)
    refused = _return(client, tokens["admin"], force=True)
    assert refused.status_code == 422, refused.text
    assert "reason is required with force" in refused.json()["error"]
    assert _state(db, eviction) == "completed"


@pytest.mark.parametrize(
    ("kind", "reason", "gated"),
    [
        ("rule", "xid_79 on GPU 1 (GPU fell off the bus)", True),
        ("rule", "host_pcie_aer on GPU 3: critical, drain_inspect", True),
        ("risk", "P(failure within 24 h) = 0.412 above break-even 0.050", True),
        ("rule", "node_unreachable: no report for 900 s (3 intervals of 300 s)", False),
        ("straggler", "straggler in job 7: 1.42x the job median", False),
    ],
)
def test_which_evictions_are_gated(
    client: TestClient, db: Database, tokens: dict[str, str], kind: str, reason: str, gated: bool
) -> None:
    _completed(db, kind=kind, reason=reason)
    answer = _return(client, tokens["scheduler"])
    assert answer.status_code == (409 if gated else 200), answer.text


def test_push_for_another_node_is_refused_and_nothing_stored(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    report = make_validation("node-b")
    refused = client.post(
        "/v1/nodes/node-a/validations", json=report, headers=bearer(tokens["agent"])
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["loc"] == ["body", "node"]
    with db.read() as conn:
        assert conn.execute(select(func.count()).select_from(node_validations)).scalar() == 0


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"status": "great"}, "status"),
        ({"name": "NVML Remapped"}, "name"),
        ({"evidence": {"x": [1, 2]}}, "evidence"),
        ({"message": "a\x00b"}, "message"),
    ],
)
def test_a_malformed_check_is_a_422_naming_it(
    client: TestClient, db: Database, tokens: dict[str, str], change: dict[str, Any], where: str
) -> None:
    report = make_validation()
    report["checks"][1].update(change)
    refused = _push(client, tokens, report)
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"][0]["loc"][:4] == ["body", "checks", 1, where]
    with db.read() as conn:
        assert conn.execute(select(func.count()).select_from(node_validations)).scalar() == 0


def test_only_absent_checks_do_not_pass(client: TestClient, tokens: dict[str, str]) -> None:
    report = make_validation()
    for check in report["checks"]:
        check["status"] = "absent"
    pushed = _push(client, tokens, report)
    assert pushed.status_code == 201 and pushed.json()["passed"] is False
    assert pushed.json()["failed"] == []


def test_a_read_or_scheduler_token_may_not_push(client: TestClient, tokens: dict[str, str]) -> None:
    for scope in ("read", "scheduler"):
        answer = client.post(
            "/v1/nodes/node-a/validations", json=make_validation(), headers=bearer(tokens[scope])
        )
        assert answer.status_code == 403, (scope, answer.text)


def test_validations_read_newest_first_with_who_pushed(
    client: TestClient, tokens: dict[str, str]
) -> None:
    assert _push(client, tokens, make_validation(failing=("nvml.pcie_link",))).status_code == 201
    assert _push(client, tokens, make_validation()).status_code == 201
    listed = client.get("/v1/nodes/node-a/validations", headers=bearer(tokens["read"]))
    assert listed.status_code == 200, listed.text
    body = listed.json()
    assert [v["passed"] for v in body["data"]] == [True, False]
    assert {v["pushed_by"] for v in body["data"]} == {"test-agent"}
    assert body["data"][0]["tools"] == {"fleetwatch": "test"}
    unknown = client.get("/v1/nodes/nobody/validations", headers=bearer(tokens["read"]))
    assert unknown.status_code == 404
