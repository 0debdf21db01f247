"""Details the rules cannot read never blind the server to a node (issue 35, defect 1).

On SQLite and PostgreSQL: ingest refuses an event whose details the rules cannot read, naming the
field, and stores nothing of its batch; events stored before that check (written straight into
the events table, as old data is) are skipped by the rules and named in an alert while a later
Xid 79 on the same node still gives its verdict, its eviction and its alert; and a rule family
that raises on a node is isolated alone, on the whole-fleet pass and the urgent lane alike.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert, select
from tests.conftest import bearer
from tests.factories import make_batch
from tests.unit.server.conftest import Push, row_counts

from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import alerts, events, evictions, nodes
from fleetwatch.server.judge import judging

INT64_MAX = 2**63 - 1


def _state(client: TestClient) -> Any:
    return client.app.state  # type: ignore[attr-defined]


def _xid79(node: str) -> dict[str, Any]:
    batch = make_batch(node, gpus=2)
    pci = batch["gpus"][0]["pci_bus_id"]
    batch["events"] = [{"kind": "xid", "ts": datetime.now(UTC).isoformat(), "xid": 79,
                        "pci_bus_id": pci, "message": "GPU has fallen off the bus."}]  # fmt: skip
    return batch


def _store_old_events(db: Database, node: str, *found: tuple[str, dict[str, Any]]) -> None:
    """Events as a server before the check stored them: straight into the table, a second
    apart in the order given."""
    start = datetime.now(UTC) - timedelta(minutes=5)
    with db.write() as conn:
        node_id = conn.execute(select(nodes.c.id).where(nodes.c.name == node)).scalar_one()
        conn.execute(
            insert(events),
            [
                {"node_id": node_id, "kind": kind, "ts": start + timedelta(seconds=i),
                 "received_at": start, "message": "stored before ingest checked details",
                 "details": details}
                for i, (kind, details) in enumerate(found)
            ],
        )  # fmt: skip


def _passes(client: TestClient) -> None:
    state = _state(client)
    now = datetime.now(UTC)
    state.assessor.run_once(now)
    state.planner.run_once(now)
    state.alerter.run_once(now)


def _verdicts(client: TestClient, tokens: dict[str, str], node: str) -> set[str]:
    answer = client.get("/v1/risk", params={"node": node}, headers=bearer(tokens["read"]))
    assert answer.status_code == 200, answer.text
    return {v["rule"] for g in answer.json()["gpus"] for v in g["verdicts"]}


def _firing(db: Database) -> dict[str, Any]:
    with db.read() as conn:
        rows = conn.execute(select(alerts).where(alerts.c.state == "firing"))
        return {row.dedup_key: row for row in rows}


def _evicted(db: Database) -> set[str]:
    with db.read() as conn:
        return set(conn.execute(select(evictions.c.node)).scalars())


@pytest.mark.parametrize(
    ("event", "field"),
    [
        ({"kind": "mce", "details": {"severity": "deferred", "bank": [1]}}, "details.bank"),
        ({"kind": "sxid", "details": {"severity": "fatal", "sxid": [12028]}}, "details.sxid"),
        ({"kind": "pcie_aer", "details": {"severity": "fatal", "errors": 7}}, "details.errors"),
        ({"kind": "edac", "details": {"severity": "corrected", "count": INT64_MAX}},
         "details.count"),
    ],
)  # fmt: skip
def test_ingest_refuses_details_the_rules_cannot_read_and_stores_nothing(
    push: Push, db: Database, event: dict[str, Any], field: str
) -> None:
    batch = make_batch("node-a", gpus=2)
    batch["events"] = [{"kind": "xid", "xid": 13, "ts": datetime.now(UTC).isoformat()},
                       {**event, "ts": datetime.now(UTC).isoformat()}]  # fmt: skip
    before = row_counts(db)
    answer = push(batch)
    assert answer.status_code == 422, answer.text
    assert f"body.events.1.{field}: must be " in answer.json()["error"]
    assert row_counts(db) == before


def test_stored_unreadable_details_leave_a_later_xid79_judged_drained_and_paged(
    client: TestClient, push: Push, db: Database, tokens: dict[str, str]
) -> None:
    assert push(make_batch("node-a", gpus=2)).status_code == 200
    assert push(make_batch("node-b", gpus=2)).status_code == 200
    _store_old_events(
        db,
        "node-a",
        ("mce", {"severity": "deferred", "bank": [1]}),
        ("pcie_aer", {"severity": "non_fatal", "errors": 7}),
        *[("edac", {"severity": "corrected", "count": INT64_MAX})] * 3,
    )
    assert push(_xid79("node-a")).status_code == 200
    _passes(client)

    assert {"xid79_off_bus", "unreadable_host_events"} <= _verdicts(client, tokens, "node-a")
    assert "node-a" in _evicted(db)
    firing = _firing(db)
    named = firing["node:node-a:unreadable_host_events"]
    assert (named.kind, named.severity) == ("unreadable_evidence", "warning")
    assert "details.bank must be an integer" in named.summary
    assert [s["field"] for s in named.evidence["skipped"]] == [
        "details.bank", "details.errors", "details.count", "details.count", "details.count",
    ]  # fmt: skip
    assert any(a.kind == "xid" and a.node == "node-a" for a in firing.values())
    assert _state(client).assessor.judge.guard.errors == 0  # skipped, not failed


def test_a_rule_family_that_raises_leaves_the_nodes_other_rules_judged(
    client: TestClient,
    push: Push,
    db: Database,
    tokens: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> list[Any]:
        raise TypeError("'int' object is not iterable")

    monkeypatch.setattr(judging, "judge_host_errors", broken)
    batch = _xid79("node-a")
    batch["events"].append({"kind": "mce", "ts": datetime.now(UTC).isoformat(),
                            "details": {"severity": "corrected", "bank": 1}})  # fmt: skip
    assert push(batch).status_code == 200
    _passes(client)

    assert _verdicts(client, tokens, "node-a") == {"xid79_off_bus", "unjudged_evidence"}
    assert "node-a" in _evicted(db)
    named = _firing(db)["node:node-a:unjudged_evidence"]
    assert named.kind == "unreadable_evidence"
    assert named.evidence["failed"] == {
        "host error rules": "TypeError: 'int' object is not iterable"
    }

    # The urgent lane's targeted pass isolates the same way.
    snapshot = _state(client).assessor.run_nodes({"node-a"}, now=datetime.now(UTC))
    assert snapshot is not None
    rules = {v.rule for g in snapshot.gpus if g.node == "node-a" for v in g.verdicts}
    assert rules == {"xid79_off_bus", "unjudged_evidence"}
