"""The return-to-service gate end to end: `fleetwatch validate` as a process (on the fake NVML,
a recorded 8 x H100 node) pushing to a real `fleetwatch server` process, on SQLite and PostgreSQL.

A completed hardware eviction is refused its return; a failing validation keeps it refused,
naming the failed check; a passing one lets it return. A server that cannot be reached leaves
the result printed and the exit status 4.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fleetwatch.config import ServerSettings
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.repo.evictions import create_eviction
from tests.integration.live import FLEETWATCH, create_token, free_port, live_server

pytestmark = pytest.mark.slow

NVML_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvml"


@pytest.fixture
def server_db(database_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("FLEETWATCH_SERVER_BACKGROUND_JOBS", "false")
    return database_url


def _node_snapshot(tmp_path: Path, name: str, **changes: Any) -> Path:
    """The recorded H100 node, idle, with its PCIe maxima; ``changes`` on GPU 0 by dotted path."""
    node = json.loads((NVML_FIXTURES / "h100_8x.json").read_text())
    for gpu in node["gpus"]:
        gpu["pcie"].update(max_gen=5, max_width=16)
        gpu["utilization_pct"]["gpu"] = 0
    for path, value in changes.items():
        *parents, key = path.split(".")
        target = node["gpus"][0]
        for part in parents:
            target = target[part]
        target[key] = value
    out = tmp_path / name
    out.write_text(json.dumps(node))
    return out


def _completed_eviction(database_url: str, node: str) -> int:
    db = Database(make_engine(ServerSettings(database_url=database_url)))
    try:
        with db.write() as conn:
            eviction_id = create_eviction(
                conn, node=node, state="pending", reason_kind="rule",
                reason="xid_79 on GPU 0 (GPU has fallen off the bus)", evidence={},
                expected_saving_usd=None, dry_run=False, now=datetime.now(UTC),
            )  # fmt: skip
        return eviction_id
    finally:
        db.dispose()


def _validate(
    url: str, token_file: Path, snapshot: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    args = [
        "validate", "--server", url, "--token-file", str(token_file), "--node-name", "node-v",
        "--fake-nvml", str(snapshot), "--duration", "0", "--no-dcgm", *extra,
    ]  # fmt: skip
    return subprocess.run([*FLEETWATCH, *args], capture_output=True, text=True, timeout=120)


def test_validate_process_opens_the_return_gate_of_a_real_server(
    server_db: str, tmp_path: Path
) -> None:
    agent_file = tmp_path / "agent.token"
    agent_file.write_text(create_token(server_db, "agent", "node-v-agent") + "\n")
    scheduler = create_token(server_db, "scheduler", "slurm")
    eviction = _completed_eviction(server_db, "node-v")
    with live_server(server_db, tmp_path) as server, server.client(scheduler) as sched:
        for step in ("ack", "complete"):
            assert sched.post(f"/v1/evictions/{eviction}/{step}").status_code == 200
        refused = sched.post("/v1/nodes/node-v/return", json={"note": "reseated"})
        assert refused.status_code == 409
        assert "no validation newer than the eviction" in refused.json()["error"]

        failing = _node_snapshot(tmp_path, "width.json", **{"pcie.width": 8})
        done = _validate(server.url, agent_file, failing)
        assert done.returncode == 1, done.stderr
        assert "FAIL nvml.pcie_link on GPU 0: link trained at x8 of x16" in done.stdout
        assert "pushed to" in done.stderr
        refused = sched.post("/v1/nodes/node-v/return", json={"note": "reseated"})
        assert refused.status_code == 409
        assert "failed: nvml.pcie_link on GPU 0" in refused.json()["error"]

        healthy = _node_snapshot(tmp_path, "healthy.json")
        done = _validate(server.url, agent_file, healthy, "--json")
        assert done.returncode == 0, done.stderr
        printed = json.loads(done.stdout)
        assert printed["passed"] is True and printed["node"] == "node-v"
        returned = sched.post("/v1/nodes/node-v/return", json={"note": "reseated"})
        assert returned.status_code == 200, returned.text
        assert returned.json()["state"] == "returned"
        listed = sched.get("/v1/nodes/node-v/validations").json()
        assert [v["passed"] for v in listed["data"]] == [True, False]
        assert {v["pushed_by"] for v in listed["data"]} == {"node-v-agent"}


def test_validate_keeps_the_result_when_the_server_cannot_be_reached(tmp_path: Path) -> None:
    token_file = tmp_path / "agent.token"
    token_file.write_text("fwt_000000000000_nobody\n")
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    done = _validate(url, token_file, _node_snapshot(tmp_path, "healthy.json"))
    assert done.returncode == 4, done.stderr
    assert "could not push the result" in done.stderr
    kept = json.loads(done.stdout.strip().splitlines()[-1])
    assert kept["passed"] is True and len(kept["checks"]) > 8


def test_a_validation_pushed_to_one_replica_opens_the_gate_on_another(
    server_db: str, tmp_path: Path
) -> None:
    """Two server processes on one PostgreSQL: the gate reads the database, not a replica's
    memory, so the node validated through one returns through the other."""
    if server_db.startswith("sqlite"):
        pytest.skip("several replicas need PostgreSQL")
    url = server_db
    agent_file = tmp_path / "agent.token"
    agent_file.write_text(create_token(url, "agent", "node-v-agent") + "\n")
    scheduler = create_token(url, "scheduler", "slurm")
    eviction = _completed_eviction(url, "node-v")
    with (
        live_server(url, tmp_path) as first,
        live_server(url, tmp_path) as second,
        second.client(scheduler) as sched,
    ):
        for step in ("ack", "complete"):
            assert sched.post(f"/v1/evictions/{eviction}/{step}").status_code == 200
        assert sched.post("/v1/nodes/node-v/return").status_code == 409
        done = _validate(first.url, agent_file, _node_snapshot(tmp_path, "healthy.json"))
        assert done.returncode == 0, done.stderr
        returned = sched.post("/v1/nodes/node-v/return")
        assert returned.status_code == 200, returned.text
