"""Evictions over a real `fleetwatch server` process (SQLite and PostgreSQL).

Concurrent acks from eight schedulers leave exactly one claimer; and with the background jobs on
short timers, a fatal Xid pushed over HTTP becomes a pending eviction without anything driven by
hand.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from fleetwatch.config import ServerSettings
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.repo.evictions import create_eviction
from tests.factories import make_batch, make_validation
from tests.integration.live import create_token, fleetwatch, live_server


@pytest.fixture
def server_db(database_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    if database_url.startswith("sqlite"):
        fleetwatch("db", "upgrade", "--database-url", database_url)
    for name, value in {"ASSESS_INTERVAL_S": "0.5", "PLANNER_INTERVAL_S": "0.5",
                        "REFIT_INTERVAL_S": "0"}.items():  # fmt: skip
        monkeypatch.setenv(f"FLEETWATCH_SERVER_{name}", value)
    return database_url


def _seed_pending(database_url: str, count: int) -> list[int]:
    db = Database(make_engine(ServerSettings(database_url=database_url)))
    try:
        with db.write() as conn:
            return [
                create_eviction(
                    conn,
                    node=f"node-{i}",
                    state="pending",
                    reason_kind="rule",
                    reason="seeded",
                    evidence={},
                    expected_saving_usd=None,
                    dry_run=False,
                    now=datetime.now(UTC),
                )  # fmt: skip
                for i in range(count)
            ]
    finally:
        db.dispose()


def _race(clients: list[httpx.Client], eviction: int) -> dict[int, int]:
    """Every client acks ``eviction`` at the same moment; client index to HTTP status."""
    barrier = threading.Barrier(len(clients))
    statuses: dict[int, int] = {}

    def ack(i: int) -> None:
        barrier.wait()
        response = clients[i].post(f"/v1/evictions/{eviction}/ack", json={"lease_s": 60})
        statuses[i] = response.status_code

    threads = [threading.Thread(target=ack, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return statuses


def test_live_concurrent_acks_leave_exactly_one_claimer(server_db: str, tmp_path: Path) -> None:
    schedulers = [create_token(server_db, "scheduler", f"sched-{i}") for i in range(8)]
    with live_server(server_db, tmp_path) as server:
        for round_ in range(3):
            [eviction] = _seed_pending(server_db, 1)
            clients = [server.client(token) for token in schedulers]
            statuses = _race(clients, eviction)
            assert Counter(statuses.values()) == {200: 1, 409: 7}, (round_, statuses)
            winner = next(i for i, s in statuses.items() if s == 200)
            detail = clients[0].get(f"/v1/evictions/{eviction}").json()
            assert detail["claimed_by"] == f"sched-{winner}"
            acks = [a for a in detail["audit"] if a["to_state"] == "acked"]
            assert len(acks) == 1 and acks[0]["actor"] == f"sched-{winner}"
            for c in clients:
                c.close()


def test_live_fatal_xid_becomes_a_pending_eviction(server_db: str, tmp_path: Path) -> None:
    agent, scheduler = create_token(server_db, "agent"), create_token(server_db, "scheduler")
    with live_server(server_db, tmp_path) as server, server.client(agent) as push:
        batch = make_batch("node-live", gpus=2, ticks=3)
        failing = batch["gpus"][1]
        batch["events"] = [{
            "kind": "xid", "ts": (datetime.now(UTC) - timedelta(seconds=1)).isoformat(),
            "xid": 79, "pci_bus_id": failing["pci_bus_id"],
            "message": f"NVRM: Xid (PCI:{failing['pci_bus_id']}): 79, GPU has fallen off the bus.",
        }]  # fmt: skip
        started = time.monotonic()
        assert push.post("/v1/ingest", json=batch).is_success
        with server.client(scheduler) as sched:
            found: list[dict] = []
            while time.monotonic() - started < 90 and not found:
                found = sched.get("/v1/evictions", params={"state": "pending"}).json()["data"]
                time.sleep(0.1)
            assert found, server.log.read_text()[-3000:]
            assert found[0]["node"] == "node-live" and found[0]["reason_kind"] == "rule"
            assert found[0]["evidence"]["gpus"][0]["uuid"] == failing["uuid"]
            eviction = found[0]["id"]
            assert sched.post(f"/v1/evictions/{eviction}/ack").status_code == 200
            assert sched.post(f"/v1/evictions/{eviction}/complete").status_code == 200
            # A hardware eviction: the node returns only after a passing validation.
            refused = sched.post("/v1/nodes/node-live/return", json={"note": "reseated"})
            assert refused.status_code == 409, refused.text
            validated = push.post(
                "/v1/nodes/node-live/validations", json=make_validation("node-live")
            )
            assert validated.status_code == 201, validated.text
            returned = sched.post("/v1/nodes/node-live/return", json={"note": "reseated"})
            assert returned.status_code == 200 and returned.json()["returned_at"]
