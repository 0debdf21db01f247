"""The evictions long-poll across replicas: two `fleetwatch server` processes on one PostgreSQL.

A scheduler waits on replica B (background jobs off: it never plans anything itself); a fatal
Xid is pushed to replica A (background jobs on). Only PostgreSQL's NOTIFY can tell B's waiting
request that A's planner created the eviction.
"""

from __future__ import annotations

import signal
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.conftest import _truncate
from tests.factories import make_batch
from tests.integration.live import create_token, fleetwatch, live_server

pytestmark = pytest.mark.slow


@pytest.mark.postgres
def test_long_poll_on_one_replica_is_released_by_an_eviction_made_on_another(
    migrated_postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = migrated_postgres_url
    _truncate(url)
    for name, value in {"ASSESS_INTERVAL_S": "0.5", "PLANNER_INTERVAL_S": "0.5",
                        "REFIT_INTERVAL_S": "0"}.items():  # fmt: skip
        monkeypatch.setenv(f"FLEETWATCH_SERVER_{name}", value)
    agent, scheduler = create_token(url, "agent"), create_token(url, "scheduler")
    with live_server(url, tmp_path) as replica_a:
        monkeypatch.setenv("FLEETWATCH_SERVER_BACKGROUND_JOBS", "false")
        with live_server(url, tmp_path) as replica_b:
            answer: list[httpx.Response] = []

            def poll() -> None:
                with replica_b.client(scheduler) as sched:
                    sched.timeout = httpx.Timeout(90.0)
                    params = {"state": "pending", "wait": 60}
                    answer.append(sched.get("/v1/evictions", params=params))

            waiting = threading.Thread(target=poll, daemon=True)
            waiting.start()
            waiting.join(timeout=1.0)
            assert waiting.is_alive(), f"the long-poll did not wait: {answer}"

            batch = make_batch("node-lp", gpus=2, ticks=3)
            failing = batch["gpus"][1]
            batch["events"] = [{
                "kind": "xid", "ts": (datetime.now(UTC) - timedelta(seconds=1)).isoformat(),
                "xid": 79, "pci_bus_id": failing["pci_bus_id"],
                "message": f"NVRM: Xid (PCI:{failing['pci_bus_id']}): 79, GPU has fallen off "
                           "the bus.",
            }]  # fmt: skip
            with replica_a.client(agent) as push:
                assert push.post("/v1/ingest", json=batch).is_success
            waiting.join(timeout=60)
            assert answer, "replica B's long-poll was never answered"
            response = answer[0]
            assert response.status_code == 200, response.text
            found = response.json()["data"]
            assert [e["node"] for e in found] == ["node-lp"], (
                found, replica_a.log.read_text()[-3000:], replica_b.log.read_text()[-3000:]
            )  # fmt: skip
            assert found[0]["reason_kind"] == "rule"


def test_a_waiting_long_poll_does_not_hold_up_shutdown(tmp_path: Path) -> None:
    """uvicorn lets open requests finish before it stops: SIGTERM must release the long-poll
    (answered, empty) instead of the server waiting out its 60 s."""
    url = f"sqlite:///{tmp_path / 'fleetwatch.db'}"
    fleetwatch("db", "upgrade", "--database-url", url)
    scheduler = create_token(url, "scheduler")
    with live_server(url, tmp_path) as server:
        answer: list[httpx.Response] = []

        def poll() -> None:
            with server.client(scheduler) as sched:
                sched.timeout = httpx.Timeout(90.0)
                answer.append(sched.get("/v1/evictions", params={"state": "pending", "wait": 60}))

        waiting = threading.Thread(target=poll, daemon=True)
        waiting.start()
        waiting.join(timeout=1.0)
        assert waiting.is_alive(), f"the long-poll did not wait: {answer}"
        server.process.terminate()
        waiting.join(timeout=30)
        assert answer, "the long-poll was not answered when the server was told to stop"
        assert answer[0].status_code == 200
        assert (answer[0].json()["count"], answer[0].json()["data"]) == (0, [])
        # uvicorn re-raises the SIGTERM it caught once it has shut down
        exited = server.process.wait(timeout=30)
        assert exited in (0, -signal.SIGTERM), server.log.read_text()[-2000:]
