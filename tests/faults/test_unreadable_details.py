"""Fault: event details the rules cannot read, against a real server (issue 35), on SQLite and on
PostgreSQL.

1. A batch whose event details hold what the rules cannot read (an MCE bank as a list, an SXid
   code as a list, an EDAC count of 2**63 - 1) gets a 422 naming the field, and nothing of it is
   stored. The same details stored before that check (written straight into the events table, as
   old databases hold them) no longer make the node undrainable: before the fix the assessment
   raised on the node every pass, and a later Xid 79 on it gave no verdict, eviction or alert.
   Now the Xid 79 drains and pages, and an alert of kind ``unreadable_evidence`` names the event.
2. Three stored EDAC counts of 2**63 - 1 on another node no longer stop the fleet's snapshot (their
   sum passed 2**64 and msgpack raised on every publish, so replicas stopped adopting): on
   PostgreSQL the leader keeps publishing with no failed snapshot step.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import insert, select

from fleetwatch.config import ServerSettings
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.db.tables import events, nodes
from tests.conftest import _truncate
from tests.factories import make_batch
from tests.faults.waiting import wait_for
from tests.integration.live import LiveServer, create_token, live_server

pytestmark = pytest.mark.slow

INT64_MAX = 2**63 - 1
REFUSED = {
    "bank": {"kind": "mce", "details": {"severity": "deferred", "bank": [1]}},
    "sxid": {"kind": "sxid", "details": {"severity": "fatal", "sxid": [12028]}},
    "count": {"kind": "edac", "details": {"severity": "corrected", "count": INT64_MAX}},
}


def _say(line: str) -> None:
    """What the test checked, on stdout (pytest -s shows it; the CI log keeps it)."""
    sys.stdout.write(line + "\n")


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _xid79(node: str) -> dict[str, Any]:
    batch = make_batch(node, gpus=2, interval_s=30.0)
    pci = batch["gpus"][0]["pci_bus_id"]
    message = f"NVRM: Xid (PCI:{pci}): 79, GPU has fallen off the bus."
    batch["events"] = [
        {"kind": "xid", "ts": _now(), "xid": 79, "pci_bus_id": pci, "message": message}
    ]
    return batch


def _store_old_events(url: str, node: str, found: list[dict[str, Any]]) -> None:
    """Events as a server before the check stored them: straight into the events table."""
    db = Database(make_engine(ServerSettings(database_url=url)))
    start = datetime.now(UTC) - timedelta(minutes=5)
    try:
        with db.write() as conn:
            node_id = conn.execute(select(nodes.c.id).where(nodes.c.name == node)).scalar_one()
            conn.execute(
                insert(events),
                [
                    {"node_id": node_id, "kind": e["kind"], "ts": start + timedelta(seconds=i),
                     "received_at": start, "message": "stored before ingest checked details",
                     "details": e["details"]}
                    for i, e in enumerate(found)
                ],
            )  # fmt: skip
    finally:
        db.dispose()


def _metric(client: httpx.Client, line_start: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _rules(client: httpx.Client, node: str) -> set[str]:
    answer = client.get("/v1/risk", params={"node": node})
    assert answer.status_code == 200, answer.text
    return {v["rule"] for g in answer.json()["gpus"] for v in g["verdicts"]}


@contextmanager
def _server(url: str, log_dir: Path) -> Iterator[tuple[LiveServer, httpx.Client, httpx.Client]]:
    """A server on ``url`` judging, planning, alerting and sharing its snapshot twice a second."""
    agent, read = create_token(url, "agent"), create_token(url, "read")
    with (
        live_server(url, log_dir) as live,
        live.client(agent) as push,
        live.client(read) as reader,
    ):
        yield live, push, reader


@pytest.fixture(autouse=True)
def _short_intervals(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "ASSESS_INTERVAL_S": "0.5", "PLANNER_INTERVAL_S": "0.5", "ALERT_INTERVAL_S": "0.5",
        "REFIT_INTERVAL_S": "0", "DRAIN_BUDGET_PCT": "100", "SNAPSHOT_POLL_S": "0.5",
    }.items():  # fmt: skip
        monkeypatch.setenv(f"FLEETWATCH_SERVER_{name}", value)


def test_unreadable_details_are_refused_and_old_ones_leave_a_xid79_drained_and_paged(
    database_url: str, tmp_path: Path
) -> None:
    with _server(database_url, tmp_path) as (live, push, reader):
        _refused_then_judged(database_url, push, reader)
    log = live.log.read_text(errors="replace")
    assert "Traceback" not in log, log[-5000:]


def _refused_then_judged(database_url: str, push: httpx.Client, reader: httpx.Client) -> None:
    backend = database_url.split(":", 1)[0].split("+", 1)[0]
    for node in ("node-a", "node-b"):
        assert push.post("/v1/ingest", json=make_batch(node, gpus=2)).status_code == 200

    for key, event in REFUSED.items():
        batch = make_batch("node-a", gpus=2)
        batch["events"] = [{**event, "ts": _now()}]
        answer = push.post("/v1/ingest", json=batch)
        assert answer.status_code == 422, answer.text
        message = answer.json()["error"]
        assert f"body.events.0.details.{key}: must be " in message, message
        _say(f"[{backend}] 422: {message}")
    stored = reader.get("/v1/events", params={"node": "node-a", "limit": 1000}).json()["data"]
    assert not {e["kind"] for e in stored} & {"mce", "sxid", "edac"}, stored
    _say(f"[{backend}] GET /v1/events: nothing of the refused batches stored")

    _store_old_events(database_url, "node-a", [REFUSED["bank"], REFUSED["sxid"]])
    assert push.post("/v1/ingest", json=_xid79("node-a")).status_code == 200
    _say(f"[{backend}] stored old unreadable details on node-a (an MCE bank and an SXid code "
         "as lists), then node-a sent an Xid 79")  # fmt: skip

    rules = wait_for(
        "node-a judged with its Xid 79 and its unreadable events named",
        lambda: (
            (r := _rules(reader, "node-a")) >= {"xid79_off_bus", "unreadable_host_events"} and r
        ),
    )
    _say(f"[{backend}] GET /v1/risk: node-a {sorted(rules)}")

    def evicted() -> bool:
        return any(e["node"] == "node-a" for e in reader.get("/v1/evictions").json()["data"])

    wait_for("an eviction of node-a", evicted)

    def paged() -> dict[str, Any] | None:
        firing = reader.get("/v1/alerts", params={"state": "firing"}).json()["data"]
        by_key = {a["dedup_key"]: a for a in firing}
        named = by_key.get("node:node-a:unreadable_host_events")
        xid = [a for a in firing if a["node"] == "node-a" and a["kind"] == "xid"]
        return {"named": named, "xid": xid[0]} if named and xid else None

    found = wait_for("the Xid 79 alert and the unreadable_evidence alert", paged)
    named = found["named"]
    assert named["kind"] == "unreadable_evidence" and named["severity"] == "warning"
    assert "details.bank must be an integer" in named["summary"], named["summary"]
    assert [s["field"] for s in named["evidence"]["skipped"]] == ["details.bank", "details.sxid"]
    _say(f"[{backend}] GET /v1/evictions: node-a; GET /v1/alerts: {found['xid']['dedup_key']} "
         f"and {named['dedup_key']}: {named['summary']}")  # fmt: skip

    errors = _metric(reader, 'fleetwatch_background_item_errors_total{job="assessment"}')
    assert errors == 0.0, "the unreadable events are skipped by the rules, not failures"


@pytest.mark.postgres
def test_edac_counts_summing_past_64_bits_do_not_stop_the_fleet_snapshot(
    migrated_postgres_url: str, tmp_path: Path
) -> None:
    url = migrated_postgres_url
    _truncate(url)
    with _server(url, tmp_path) as (live, push, reader):
        for node in ("node-a", "node-b"):
            assert push.post("/v1/ingest", json=make_batch(node, gpus=2)).status_code == 200
        _store_old_events(url, "node-b", [REFUSED["count"]] * 3)
        published = 'fleetwatch_fleet_snapshots_total{outcome="published"}'
        before = _metric(reader, published)
        _say("[postgresql] stored 3 EDAC counts of 2**63 - 1 on node-b (their sum passes 2**64)")

        # Two: the second is of a pass that started after they were stored (before the fix
        # every publish from then on raised OverflowError, and the count stood still).
        wait_for("two snapshots published since", lambda: _metric(reader, published) > before + 1)
        failed = _metric(reader, 'fleetwatch_background_job_failures_total{job="snapshot"}')
        assert failed == 0.0, "a snapshot publish failed"
        assert "unreadable_host_events" in _rules(reader, "node-b")
        _say(f"[postgresql] /metrics: {_metric(reader, published) - before:.0f} snapshots "
             "published since, none failed")  # fmt: skip
    log = live.log.read_text(errors="replace")
    assert "could not publish" not in log and "Traceback" not in log, log[-5000:]
