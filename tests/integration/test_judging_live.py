"""The judging layer running on its own in the real server process (SQLite and PostgreSQL).

Nothing is triggered by hand: the background jobs (rollups, lifetimes, assessment) run on short
timers, and the test only pushes telemetry over HTTP and reads the API.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.factories import make_batch
from tests.integration.live import create_token, live_server


@pytest.fixture
def server_db(database_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    for name, value in {"ASSESS_INTERVAL_S": "0.5", "ROLLUP_INTERVAL_S": "0.5",
                        "LIFECYCLE_INTERVAL_S": "0.5", "GPU_LEAVE_AFTER_S": "2",
                        "REFIT_INTERVAL_S": "0"}.items():  # fmt: skip
        monkeypatch.setenv(f"FLEETWATCH_SERVER_{name}", value)
    return database_url


def _until(read: Callable[[], Any], ok: Callable[[Any], bool], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    value = read()
    while not ok(value) and time.monotonic() < deadline:
        time.sleep(0.2)
        value = read()
    return value


def test_a_dbe_xid_is_judged_and_the_gpu_leaving_is_recorded_as_a_failure(
    server_db: str, tmp_path: Path
) -> None:
    agent, reader = create_token(server_db, "agent"), create_token(server_db, "read")
    with live_server(server_db, tmp_path) as server, server.client(agent) as push:
        # Built once the server is up: the GPU is last seen when this batch arrives, which must
        # be within the 2 s leave-after of the Xid for the failure to be put on that Xid.
        batch = make_batch("node-live", gpus=2, ticks=3)
        failing = batch["gpus"][1]
        batch["events"] = [{
            "kind": "xid", "ts": (datetime.now(UTC) - timedelta(seconds=1)).isoformat(),
            "xid": 48, "pci_bus_id": failing["pci_bus_id"],
            "message": f"NVRM: Xid (PCI:{failing['pci_bus_id']}): 48, pid=4242, DBE (0x0)",
        }]  # fmt: skip
        assert push.post("/v1/ingest", json=batch).is_success
        with server.client(reader) as read:
            risk = _until(
                lambda: read.get(f"/v1/gpus/{failing['uuid']}/risk"),
                lambda r: r.status_code == 200 and r.json()["basis"] == "rule",
            )
            assert risk.status_code == 200 and risk.json()["basis"] == "rule", risk.text
            verdict = risk.json()["verdicts"][0]
            assert verdict["xids"][0] == 48 and verdict["takes_gpu_out"]
            # The covariates come from the hourly rollups, also built in the background.
            covariates = _until(
                lambda: read.get(f"/v1/gpus/{failing['uuid']}/risk").json()["covariates"],
                lambda c: c.get("xid_memory") == 1.0,
            )
            assert covariates["xid_memory"] == 1.0
            # The GPU goes away; its neighbour keeps reporting past the leave-after time.
            for _ in range(4):
                healthy = make_batch("node-live", gpus=1, ticks=1)
                assert push.post("/v1/ingest", json=healthy).is_success
                time.sleep(0.8)

            def failures() -> list[dict[str, Any]]:
                answer: httpx.Response = read.get("/v1/lifetimes", params={"end_kind": "failure"})
                data: list[dict[str, Any]] = answer.json()["data"]
                return data

            ended = _until(failures, lambda rows: len(rows) == 1)
            assert [row["serial"] for row in ended] == [failing["serial"]]
            assert "48" in ended[0]["cause"] and ended[0]["source"] == "observed"
            metrics = read.get("/metrics").text
            assert f'uuid="{failing["uuid"]}",kind="xid"' in metrics


def test_a_fatal_xid_wakes_the_judge_instead_of_waiting_for_the_tick(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Assessment and planner timers at 10 minutes: only the wake-up on ingest can turn the Xid
    into an eviction within the test's 30 s."""
    for name, value in {"ASSESS_INTERVAL_S": "600", "PLANNER_INTERVAL_S": "600",
                        "REFIT_INTERVAL_S": "0"}.items():  # fmt: skip
        monkeypatch.setenv(f"FLEETWATCH_SERVER_{name}", value)
    agent, reader = create_token(database_url, "agent"), create_token(database_url, "read")
    with live_server(database_url, tmp_path) as server, server.client(agent) as push:
        with server.client(
            reader
        ) as read:  # the startup assessment has run: the next is 10 min off
            _until(lambda: read.get("/metrics").text,
                   lambda text: "fleetwatch_assessment_timestamp_seconds " in text)  # fmt: skip
        batch = make_batch("node-wake", gpus=2, ticks=2)
        pci = batch["gpus"][0]["pci_bus_id"]
        batch["events"] = [{
            "kind": "xid", "ts": datetime.now(UTC).isoformat(), "xid": 79, "pci_bus_id": pci,
            "message": f"NVRM: Xid (PCI:{pci}): 79, GPU has fallen off the bus.",
        }]  # fmt: skip
        assert push.post("/v1/ingest", json=batch).is_success
        with server.client(reader) as read:
            found = _until(
                lambda: read.get("/v1/evictions", params={"node": "node-wake"}).json()["data"],
                lambda rows: len(rows) == 1,
                timeout=30.0,
            )
    assert [(e["node"], e["reason_kind"]) for e in found] == [("node-wake", "rule")]
