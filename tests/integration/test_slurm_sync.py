"""``fleetwatch slurm-sync`` against a real slurmctld and a real ``fleetwatch server``.

slurmctld: the Debian 12 packages (``scripts/ensure-slurm.sh`` installs them and starts munged;
``make test`` runs it). The fixture writes a ``slurm.conf`` in a temporary directory (nodes
gpu[01-05] at 127.0.0.1 in State=IDLE, free ports, state, pid and log files in the directory,
``SlurmUser=root``, munge auth) and runs ``slurmctld -D -f <conf>`` for this module. No slurmd
runs: the controller accepts DRAIN and RESUME for nodes it has never heard from, which is all the
adapter does. ``scontrol`` (the test's and the adapter's) finds it through ``SLURM_CONF``. gpu05
is the running loop's (``--interval 60``), on a server of its own.

Where Slurm is not installed the tests skip, unless ``FLEETWATCH_REQUIRE_SLURM=1`` (as `make test`
sets), where they fail; a slurmctld that is installed but does not start always fails, with its
log. The FleetWatch side is a real server process on SQLite, with evictions seeded in its
database as the planner would, and background jobs off so that nothing else moves them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fleetwatch.config import ServerSettings
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.repo.evictions import create_eviction
from tests.factories import make_validation
from tests.faults.waiting import wait_for
from tests.integration.live import (
    FLEETWATCH,
    LiveServer,
    create_token,
    fleetwatch,
    live_server,
    stop_process,
)
from tests.integration.slurm import SlurmctldFailed, running_slurmctld

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
NODES = ("gpu01", "gpu02", "gpu03", "gpu04")


def _unavailable(reason: str) -> None:
    if os.environ.get("FLEETWATCH_REQUIRE_SLURM") == "1":
        pytest.fail(f"Slurm is required for this run: {reason}")
    pytest.skip(f"{reason}; run scripts/ensure-slurm.sh (Debian, root)")


@pytest.fixture(scope="module")
def slurm_conf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A running slurmctld; yields its slurm.conf."""
    missing = [tool for tool in ("slurmctld", "scontrol", "munge") if not shutil.which(tool)]
    if missing:
        _unavailable(f"not installed: {', '.join(missing)}")
    ensure = subprocess.run(
        [str(REPO / "scripts/ensure-slurm.sh")], capture_output=True, text=True, timeout=300
    )
    if ensure.returncode != 0:
        pytest.fail(f"scripts/ensure-slurm.sh failed: {ensure.stderr.strip()}")
    root = tmp_path_factory.mktemp("slurm")
    try:
        with running_slurmctld(root, cluster="fwtest", node_groups=("gpu[01-02]", "gpu[03-05]"),
                               partition="gpu[01-05]") as conf:  # fmt: skip
            yield conf
    except SlurmctldFailed as exc:
        pytest.fail(str(exc))


@pytest.fixture
def slurm_env(slurm_conf: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SLURM_CONF", str(slurm_conf))
    return slurm_conf


def scontrol(*args: str) -> str:
    done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"scontrol {' '.join(args)}: {done.stderr}"
    return done.stdout


def show(node: str) -> dict[str, str]:
    """State and Reason of a node, as `scontrol --oneliner show node` prints them."""
    line = scontrol("--oneliner", "show", "node", node)
    state = line.split(" State=", 1)[1].split()[0]
    reason = line.split(" Reason=", 1)[1].rsplit(" [", 1)[0] if " Reason=" in line else ""
    return {"state": state, "reason": reason}


@dataclass
class Server:
    live: LiveServer
    database_url: str
    token: str
    agent_token: str

    def validate(self, node: str, *, failing: tuple[str, ...] = ()) -> None:
        """What `fleetwatch validate` on the node pushes (tests/integration/test_validate_live.py
        runs the command itself)."""
        with self.live.client(self.agent_token) as http:
            pushed = http.post(
                f"/v1/nodes/{node}/validations", json=make_validation(node, failing=failing)
            )
        assert pushed.status_code == 201, pushed.text


@contextmanager
def _server(root: Path) -> Iterator[Server]:
    """A real FleetWatch server on SQLite, nothing in the background, and a scheduler token."""
    url = f"sqlite:///{root / 'fleetwatch.db'}"
    fleetwatch("db", "upgrade", "--database-url", url)
    token = create_token(url, "scheduler", "slurm-adapter")
    agent_token = create_token(url, "agent", "node-agents")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FLEETWATCH_SERVER_BACKGROUND_JOBS", "false")
        with live_server(url, root) as live:
            yield Server(live, url, token, agent_token)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for this module. Each test works on its own node."""
    with _server(tmp_path_factory.mktemp("server")) as made:
        yield made


def seed(server: Server, node: str, reason: str = "xid 79: GPU fell off the bus") -> int:
    db = Database(make_engine(ServerSettings(database_url=server.database_url)))
    try:
        with db.write() as conn:
            return create_eviction(
                conn, node=node, state="pending", reason_kind="rule", reason=reason,
                evidence={"xid": 79}, expected_saving_usd=None, dry_run=False,
                now=datetime.now(UTC),
            )  # fmt: skip
    finally:
        db.dispose()


def eviction(server: Server, eviction_id: int) -> dict[str, Any]:
    with server.live.client(server.token) as http:
        answer = http.get(f"/v1/evictions/{eviction_id}")
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


def sync_once(server: Server, *extra: str) -> subprocess.CompletedProcess[str]:
    """One `fleetwatch slurm-sync --once` pass, as a separate process."""
    args = ["slurm-sync", "--server", server.live.url, "--token", server.token, "--once", *extra]
    done = subprocess.run(
        [sys.executable, "-m", "fleetwatch", *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done


def test_slurm_sync_drains_in_slurmctld_completes_and_resumes_on_return(
    slurm_env: Path, server: Server
) -> None:
    assert "DRAIN" not in show("gpu02")["state"]
    eviction_id = seed(server, "gpu02", reason='xid 79 "GPU fell off the bus"\nsecond line')
    done = sync_once(server)
    node = show("gpu02")
    assert "DRAIN" in node["state"].split("+")
    assert node["reason"] == "fleetwatch: xid 79 'GPU fell off the bus' second line"
    assert eviction(server, eviction_id)["state"] == "completed"
    assert "slurm sync pass: held 1, completed 1" in done.stderr
    # An operator says the node is repaired, but it was drained for an Xid and has not passed
    # `fleetwatch validate`: the return is refused and the node stays drained.
    with server.live.client(server.token) as http:
        refused = http.post("/v1/nodes/gpu02/return", json={"note": "GPU reseated"})
    assert refused.status_code == 409 and "no validation" in refused.json()["error"]
    done = sync_once(server)
    assert "DRAIN" in show("gpu02")["state"].split("+") and "released 0" in done.stderr
    # A failing validation keeps it out; a passing one lets the return through, and the next
    # pass resumes it in Slurm.
    server.validate("gpu02", failing=("nvml.remapped_rows",))
    with server.live.client(server.token) as http:
        refused = http.post("/v1/nodes/gpu02/return", json={"note": "GPU reseated"})
        assert refused.status_code == 409 and "nvml.remapped_rows" in refused.json()["error"]
        sync_once(server)
        assert "DRAIN" in show("gpu02")["state"].split("+")
        server.validate("gpu02")
        assert http.post("/v1/nodes/gpu02/return", json={"note": "GPU reseated"}).status_code == 200
    done = sync_once(server)
    assert "DRAIN" not in show("gpu02")["state"] and show("gpu02")["reason"] == ""
    assert "released 1" in done.stderr


def test_slurm_sync_loop_drains_and_resumes_at_once_with_a_60_s_interval(
    slurm_env: Path, tmp_path: Path
) -> None:
    """`slurm-sync --interval 60` as a process: a new eviction is drained and a return resumed
    while it waits between passes. Each is waited for at most 30 s, so an adapter that slept out
    its interval fails here instead of passing slowly."""
    assert "DRAIN" not in show("gpu05")["state"]
    adapter: subprocess.Popen[bytes] | None = None
    log = tmp_path / "slurm-sync.log"
    try:
        with _server(tmp_path) as server, log.open("wb") as sink:
            args = ["slurm-sync", "--server", server.live.url, "--interval", "60"]
            adapter = subprocess.Popen(
                [*FLEETWATCH, *args],
                env={**os.environ, "FLEETWATCH_SCHEDULER_TOKEN": server.token},
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
            wait_for("the first pass", lambda: "slurm sync pass:" in log.read_text(), 60)
            eviction_id = seed(server, "gpu05")
            wait_for("gpu05 drained", lambda: "DRAIN" in show("gpu05")["state"], 30)
            wait_for(
                "the eviction completed",
                lambda: eviction(server, eviction_id)["state"] == "completed",
                30,
            )
            server.validate("gpu05")
            with server.live.client(server.token) as http:
                back = http.post("/v1/nodes/gpu05/return", json={"note": "GPU reseated"})
            assert back.status_code == 200, back.text
            wait_for("gpu05 resumed", lambda: "DRAIN" not in show("gpu05")["state"], 30)
            assert show("gpu05")["reason"] == ""
            assert adapter.poll() is None, log.read_text()
            adapter.terminate()  # the server stopping next releases its long-poll
    finally:
        if adapter is not None:
            stop_process(adapter)
        resume = ["scontrol", "update", "NodeName=gpu05", "State=RESUME"]
        subprocess.run(resume, capture_output=True, timeout=30)  # fails when already resumed
    assert "released node gpu05" in log.read_text()


def test_slurm_sync_leaves_a_node_drained_by_someone_else(slurm_env: Path, server: Server) -> None:
    scontrol("update", "NodeName=gpu03", "State=DRAIN", "Reason=ops: bad fan, ticket 4711")
    try:
        eviction_id = seed(server, "gpu03")
        sync_once(server)
        assert show("gpu03")["reason"] == "ops: bad fan, ticket 4711"
        assert "DRAIN" in show("gpu03")["state"]
        rejected = eviction(server, eviction_id)
        assert rejected["state"] == "rejected"
        assert rejected["detail"].startswith(
            "already drained by someone else: ops: bad fan, ticket 4711"
        )
        # Returned or not, FleetWatch never resumes a drain that is not its own.
        sync_once(server)
        assert show("gpu03")["reason"] == "ops: bad fan, ticket 4711"
    finally:
        scontrol("update", "NodeName=gpu03", "State=RESUME")


def test_slurm_sync_reports_a_node_an_operator_resumed_as_returned(
    slurm_env: Path, server: Server
) -> None:
    eviction_id = seed(server, "gpu04")
    sync_once(server)
    assert show("gpu04")["reason"].startswith("fleetwatch:")
    # The operator resumes it before it passed validation: FleetWatch refuses the return and
    # the adapter drains it again; only validated nodes go back into service.
    scontrol("update", "NodeName=gpu04", "State=RESUME")
    done = sync_once(server)
    assert "held again 1" in done.stderr and "returned 0" in done.stderr
    assert "DRAIN" in show("gpu04")["state"].split("+")
    assert show("gpu04")["reason"].startswith("fleetwatch:")
    assert eviction(server, eviction_id)["state"] == "completed"
    server.validate("gpu04")
    scontrol("update", "NodeName=gpu04", "State=RESUME")  # the operator, after the repair
    done = sync_once(server)
    returned = eviction(server, eviction_id)
    assert returned["state"] == "returned" and returned["returned_at"] is not None
    assert "returned 1" in done.stderr
    assert "DRAIN" not in show("gpu04")["state"]


def test_slurm_sync_dry_run_changes_nothing_in_slurmctld(slurm_env: Path, server: Server) -> None:
    eviction_id = seed(server, "gpu01")
    done = sync_once(server, "--dry-run")
    assert "would hold it and complete" in done.stderr
    assert "DRAIN" not in show("gpu01")["state"]
    assert eviction(server, eviction_id)["state"] == "pending"


def test_scheduler_api_answers_the_adapter_contract(server: Server) -> None:
    """The shape the adapter parses, from the real server (no Slurm needed)."""
    seed(server, "gpu09")
    with server.live.client(server.token) as http:
        listed = http.get("/v1/evictions", params={"state": "pending", "limit": 500}).json()
        assert listed["count"] == len(listed["data"])
        assert [e["reason_kind"] for e in listed["data"] if e["node"] == "gpu09"] == ["rule"]
        assert http.post("/v1/nodes/gpu09/return", json={"note": "x"}).status_code == 404


def _slurm_windows(server: Server) -> list[dict[str, Any]]:
    with server.live.client(server.token) as http:
        answer = http.get("/v1/maintenance", params={"key_prefix": "slurm:"})
    assert answer.status_code == 200, answer.text
    found: list[dict[str, Any]] = answer.json()["data"]
    return found


def test_slurm_sync_opens_a_window_for_a_maint_reservation_and_ends_it_when_deleted(
    slurm_env: Path, server: Server
) -> None:
    scontrol("create", "reservation", "ReservationName=fw-psu", "flags=maint",
             "nodes=gpu[03-04]", "starttime=now", "duration=120", "users=root")  # fmt: skip
    scontrol("create", "reservation", "ReservationName=fw-plain", "nodes=gpu01",
             "starttime=now", "duration=60", "users=root")  # fmt: skip
    try:
        done = sync_once(server, "--maintenance")
        assert "maintenance windows opened 1, ended 0" in done.stderr
        [window] = _slurm_windows(server)
        assert window["key"] == "slurm:fw-psu" and window["state"] == "active"
        assert window["nodes"] == ["gpu03", "gpu04"]  # the hostlist, expanded by scontrol
        assert "fw-psu" in window["reason"] and window["created_by"] == "slurm-adapter"
        span = datetime.fromisoformat(window["ends_at"]) - datetime.fromisoformat(
            window["starts_at"]
        )
        assert span.total_seconds() == 120 * 60
        again = sync_once(server, "--maintenance")  # nothing changed: nothing done
        assert "maintenance windows" not in again.stderr
        assert [w["id"] for w in _slurm_windows(server)] == [window["id"]]
    finally:
        scontrol("delete", "ReservationName=fw-psu")
        scontrol("delete", "ReservationName=fw-plain")
    done = sync_once(server, "--maintenance")
    assert "maintenance windows opened 0, ended 1" in done.stderr
    [ended] = _slurm_windows(server)
    assert ended["state"] == "ended" and ended["ended_by"] == "slurm-adapter"
