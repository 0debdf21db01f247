"""``fleetwatch slurm-sync`` against a fake ``scontrol`` (``fake_scontrol.py``: nodes in a JSON
file, each argv recorded) and the fake scheduler API (``tests/fake_scheduler_api.py``, real HTTP
on localhost). The same flows against a real slurmctld: ``tests/integration/test_slurm_sync.py``.
"""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result
from tests.fake_scheduler_api import FakeSchedulerApi
from tests.faults.waiting import wait_for
from tests.unit.adapters.conftest import sync_loop

from fleetwatch.adapters.client import SchedulerClient
from fleetwatch.adapters.slurm import MAX_REASON, Scontrol, SlurmBackend, drain_reason, parse_nodes
from fleetwatch.adapters.sync import SyncEngine
from fleetwatch.cli import main

HERE = Path(__file__).parent


class FakeSlurm:
    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path = root / "bin" / "scontrol"
        self.path.parent.mkdir()
        shutil.copy(HERE / "fake_scontrol.py", self.path)
        self.path.chmod(self.path.stat().st_mode | stat.S_IXUSR)
        self.state = root / "nodes.json"
        self.log = root / "scontrol.log"
        self.log.touch()
        monkeypatch.setenv("FAKE_SCONTROL_STATE", str(self.state))
        monkeypatch.setenv("FAKE_SCONTROL_LOG", str(self.log))
        self.set(**{f"gpu0{i}": {"state": "IDLE"} for i in range(1, 5)})

    def set(self, **nodes: dict[str, Any]) -> None:
        current = json.loads(self.state.read_text()) if self.state.exists() else {}
        current.update(nodes)
        self.state.write_text(json.dumps(current))

    def node(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.state.read_text())[name]
        return found

    def updates(self) -> list[list[str]]:
        calls = [json.loads(line) for line in self.log.read_text().splitlines()]
        return [argv for argv in calls if argv[0] == "update"]


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    return FakeSlurm(tmp_path, monkeypatch)


def sync(runner: CliRunner, api: FakeSchedulerApi, slurm: FakeSlurm, *extra: str) -> Result:
    args = ["slurm-sync", "--server", api.url, "--token", "sched-token", "--once"]
    return runner.invoke(main, [*args, "--scontrol", str(slurm.path), *extra])


def test_drain_reason_is_one_safe_line_with_the_prefix() -> None:
    reason = drain_reason('xid 79\n"GPU fell off the bus" [x@y]; $(rm -rf /)\t')
    assert reason == "fleetwatch: xid 79 'GPU fell off the bus' (x@y); $(rm -rf /)"


def test_drain_reason_truncates_long_reasons() -> None:
    reason = drain_reason("ecc " * 200)
    assert len(reason) == MAX_REASON and reason.endswith("...")
    assert drain_reason("  \n ") == "fleetwatch: unhealthy"


def test_parse_nodes_reads_state_and_reason_with_spaces() -> None:
    text = (
        "NodeName=gpu02 Arch=x86_64 State=IDLE+DRAIN Partitions=gpu "
        "Reason=fleetwatch: xid 79 on gpu02 [root@2026-11-30T08:10:41]\n"
        "NodeName=gpu03 State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@2026-11-30T08:00]\n"
        "NodeName=gpu04 State=MIXED Partitions=gpu\n"
    )
    nodes = {n.name: n for n in parse_nodes(text)}
    assert nodes["gpu02"].reason == "fleetwatch: xid 79 on gpu02" and nodes["gpu02"].ours
    assert nodes["gpu03"].unavailable and not nodes["gpu03"].ours
    assert not nodes["gpu04"].unavailable and nodes["gpu04"].reason == ""


def test_slurm_sync_drains_then_completes_a_pending_eviction(
    runner: CliRunner, api: FakeSchedulerApi, slurm: FakeSlurm
) -> None:
    eviction = api.add("gpu02", reason='xid 79 "fell off the bus"')
    result = sync(runner, api, slurm)
    assert result.exit_code == 0, result.output
    assert slurm.updates() == [
        ["update", "NodeName=gpu02", "State=DRAIN", "Reason=fleetwatch: xid 79 'fell off the bus'"]
    ]
    assert slurm.node("gpu02")["state"] == "IDLE+DRAIN"
    assert eviction["state"] == "completed" and eviction["claimed_by"] == "slurm-adapter"
    assert [c[1] for c in api.changes()] == ["/v1/evictions/1/ack", "/v1/evictions/1/complete"]
    assert api.changes()[0][2] == {"lease_s": 300}


def test_slurm_sync_leaves_a_node_drained_by_someone_else_and_rejects(
    runner: CliRunner, api: FakeSchedulerApi, slurm: FakeSlurm
) -> None:
    slurm.set(gpu03={"state": "IDLE+DRAIN", "reason": "bad fan, ticket 123"})
    eviction = api.add("gpu03")
    assert sync(runner, api, slurm).exit_code == 0
    assert slurm.updates() == []
    assert slurm.node("gpu03")["reason"] == "bad fan, ticket 123"
    assert eviction["state"] == "rejected"
    assert eviction["detail"].startswith("already drained by someone else: bad fan, ticket 123")


def test_slurm_sync_leaves_a_down_node_alone(
    runner: CliRunner, api: FakeSchedulerApi, slurm: FakeSlurm
) -> None:
    slurm.set(gpu01={"state": "DOWN+NOT_RESPONDING", "reason": "Not responding"})
    eviction = api.add("gpu01")
    assert sync(runner, api, slurm).exit_code == 0
    assert slurm.updates() == [] and eviction["state"] == "rejected"


def test_slurm_sync_rejects_with_the_scontrol_error(
    runner: CliRunner, api: FakeSchedulerApi, slurm: FakeSlurm
) -> None:
    slurm.set(gpu04={"state": "IDLE", "fail": "slurm_update error: Access/permission denied"})
    eviction = api.add("gpu04")
    assert sync(runner, api, slurm).exit_code == 0
    assert eviction["state"] == "rejected"
    assert eviction["detail"] == "slurm failed: slurm_update error: Access/permission denied"


def test_slurm_sync_rejects_unknown_nodes_and_hostlist_expressions(
    runner: CliRunner, api: FakeSchedulerApi, slurm: FakeSlurm
) -> None:
    unknown = api.add("gpu99")
    hostlist = api.add("gpu[01-04]")
    assert sync(runner, api, slurm).exit_code == 0
    assert unknown["state"] == hostlist["state"] == "rejected"
    assert "not known to slurm" in unknown["detail"]
    assert slurm.updates() == []


def test_slurm_sync_skips_an_eviction_another_adapter_holds(
    runner: CliRunner, api: FakeSchedulerApi, slurm: FakeSlurm
) -> None:
    api.add("gpu02")

    def held_elsewhere(method: str, url: str, token: str | None, body: Any) -> tuple[int, Any]:
        if url.endswith("/ack"):  # another adapter acked it between our list and our ack
            api.calls.append((method, url, body))
            return 409, {"message": "claimed by someone-else"}
        return FakeSchedulerApi.handle(api, method, url, token, body)

    api.handle = held_elsewhere  # type: ignore[method-assign]
    result = sync(runner, api, slurm)
    assert result.exit_code == 0, result.output
    assert slurm.updates() == [] and [c[1] for c in api.changes()] == ["/v1/evictions/1/ack"]


def test_slurm_sync_completes_when_fleetwatch_already_drained_the_node(
    runner: CliRunner, api: FakeSchedulerApi, slurm: FakeSlurm
) -> None:
    slurm.set(gpu02={"state": "IDLE+DRAIN", "reason": "fleetwatch: earlier"})
    eviction = api.add("gpu02")
    assert sync(runner, api, slurm).exit_code == 0
    assert slurm.updates() == [] and eviction["state"] == "completed"


def test_slurm_sync_resumes_a_returned_node_it_drained(
    runner: CliRunner, api: FakeSchedulerApi, slurm: FakeSlurm
) -> None:
    slurm.set(
        gpu02={"state": "IDLE+DRAIN", "reason": "fleetwatch: xid 79"},
        gpu03={"state": "IDLE+DRAIN", "reason": "bad fan"},
    )
    api.add("gpu02", state="returned")
    api.add("gpu03", state="returned")
    assert sync(runner, api, slurm).exit_code == 0
    assert slurm.updates() == [["update", "NodeName=gpu02", "State=RESUME"]]
    assert slurm.node("gpu03")["state"] == "IDLE+DRAIN"


def test_slurm_sync_does_not_resume_for_an_older_returned_eviction(
    runner: CliRunner, api: FakeSchedulerApi, slurm: FakeSlurm
) -> None:
    slurm.set(gpu02={"state": "IDLE+DRAIN", "reason": "fleetwatch: evicted again"})
    api.add("gpu02", state="returned")
    api.add("gpu02", state="completed")
    assert sync(runner, api, slurm).exit_code == 0
    assert slurm.updates() == [] and api.changes() == []


def test_slurm_sync_reports_a_node_an_operator_resumed_as_returned(
    runner: CliRunner, api: FakeSchedulerApi, slurm: FakeSlurm
) -> None:
    eviction = api.add("gpu01", state="completed")
    still_drained = api.add("gpu02", state="completed")
    slurm.set(gpu02={"state": "IDLE+DRAIN", "reason": "fleetwatch: xid 79"})
    assert sync(runner, api, slurm).exit_code == 0
    assert eviction["state"] == "returned" and still_drained["state"] == "completed"
    assert [c[1] for c in api.changes()] == ["/v1/nodes/gpu01/return"]
    assert "slurm" in api.changes()[0][2]["note"]
    assert slurm.updates() == []


def _slurm_state(slurm: FakeSlurm, node: str) -> str | None:
    try:
        return str(slurm.node(node)["state"])
    except json.JSONDecodeError:  # fake scontrol is rewriting the file right now
        return None


def test_slurm_sync_loop_drains_and_resumes_at_once_not_on_its_interval(
    api: FakeSchedulerApi, slurm: FakeSlurm
) -> None:
    """The loop runs with a 60 s interval; each change comes while it waits in its long-poll and
    is waited for at most 20 s, so a loop that slept out its interval fails here."""
    client = SchedulerClient.connect(api.url, "sched-token")
    engine = SyncEngine(client, SlurmBackend(Scontrol(str(slurm.path))))
    with sync_loop(engine, api, interval_s=60.0):
        wait_for("the first long-poll", lambda: api.waiting, timeout=20)
        eviction = api.add("gpu02")
        wait_for("gpu02 drained", lambda: eviction["state"] == "completed", timeout=20)
        assert _slurm_state(slurm, "gpu02") == "IDLE+DRAIN"
        wait_for("the long-poll after the drain", lambda: api.waiting, timeout=20)
        # An operator returns the repaired node through the API.
        returned = httpx.post(
            f"{api.url}/v1/nodes/gpu02/return",
            json={"note": "reseated"},
            headers={"Authorization": "Bearer sched-token"},
        )
        assert returned.status_code == 200, returned.text
        wait_for("gpu02 resumed", lambda: _slurm_state(slurm, "gpu02") == "IDLE", timeout=20)
    client.close()
    assert [argv[1:3] for argv in slurm.updates()] == [
        ["NodeName=gpu02", "State=DRAIN"],
        ["NodeName=gpu02", "State=RESUME"],
    ]


def test_slurm_sync_dry_run_changes_nothing(
    runner: CliRunner, api: FakeSchedulerApi, slurm: FakeSlurm
) -> None:
    api.add("gpu02")
    api.add("gpu01", state="completed")
    slurm.set(gpu03={"state": "IDLE+DRAIN", "reason": "fleetwatch: x"})
    api.add("gpu03", state="returned")
    result = sync(runner, api, slurm, "--dry-run")
    assert result.exit_code == 0, result.output
    assert "would hold it and complete" in result.output
    assert slurm.updates() == [] and api.changes() == []


def test_slurm_sync_skips_evictions_the_server_marks_dry_run(
    runner: CliRunner, api: FakeSchedulerApi, slurm: FakeSlurm
) -> None:
    eviction = api.add("gpu02", dry_run=True)
    assert sync(runner, api, slurm).exit_code == 0
    assert slurm.updates() == [] and eviction["state"] == "pending"


def test_slurm_sync_unreachable_server_exits_4_in_one_line(
    runner: CliRunner, slurm: FakeSlurm
) -> None:
    args = ["slurm-sync", "--server", "http://127.0.0.1:1", "--token", "t", "--once"]
    result = runner.invoke(main, [*args, "--scontrol", str(slurm.path)])
    assert result.exit_code == 4
    assert result.output.strip().splitlines()[-1].startswith("Error: GET /v1/evictions: Connect")


def test_slurm_sync_bad_token_exits_4(
    runner: CliRunner, api: FakeSchedulerApi, slurm: FakeSlurm
) -> None:
    args = ["slurm-sync", "--server", api.url, "--token", "wrong", "--once"]
    result = runner.invoke(main, [*args, "--scontrol", str(slurm.path)])
    assert result.exit_code == 4 and "HTTP 401: bad token" in result.output


def test_slurm_sync_without_scontrol_exits_2(runner: CliRunner, api: FakeSchedulerApi) -> None:
    args = ["slurm-sync", "--server", api.url, "--token", "sched-token", "--once"]
    result = runner.invoke(main, [*args, "--scontrol", "/nonexistent/scontrol"])
    assert result.exit_code == 2 and "scontrol not found" in result.output


def test_slurm_sync_finds_scontrol_on_path(
    runner: CliRunner,
    api: FakeSchedulerApi,
    slurm: FakeSlurm,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", f"{slurm.path.parent}:/usr/bin:/bin")
    api.add("gpu01")
    args = ["slurm-sync", "--server", api.url, "--token", "sched-token", "--once"]
    assert runner.invoke(main, args).exit_code == 0
    assert slurm.node("gpu01")["state"] == "IDLE+DRAIN"


def test_slurm_sync_exits_1_when_an_action_fails(
    runner: CliRunner, api: FakeSchedulerApi, slurm: FakeSlurm
) -> None:
    api.add("gpu02")

    def complete_fails(method: str, url: str, token: str | None, body: Any) -> tuple[int, Any]:
        if url.endswith("/complete"):
            return 500, {"message": "database is down"}
        return FakeSchedulerApi.handle(api, method, url, token, body)

    api.handle = complete_fails  # type: ignore[method-assign]
    result = sync(runner, api, slurm)
    assert result.exit_code == 1
    assert "1 action(s) failed" in result.output and "HTTP 500: database is down" in result.output


def test_slurm_sync_reads_server_and_token_from_the_environment(
    runner: CliRunner,
    api: FakeSchedulerApi,
    slurm: FakeSlurm,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLEETWATCH_SCHEDULER_SERVER_URL", api.url + "/")
    monkeypatch.setenv("FLEETWATCH_SCHEDULER_TOKEN", "sched-token")
    api.add("gpu01")
    result = runner.invoke(main, ["slurm-sync", "--once", "--scontrol", str(slurm.path)])
    assert result.exit_code == 0, result.output
    assert slurm.node("gpu01")["state"] == "IDLE+DRAIN"


def test_slurm_sync_without_a_server_says_which_flag_or_variable(
    runner: CliRunner, slurm: FakeSlurm
) -> None:
    result = runner.invoke(main, ["slurm-sync", "--once", "--token", "t", "--interval", "0"])
    assert result.exit_code == 2
    assert result.output.strip() == (
        "Error: --server / FLEETWATCH_SCHEDULER_SERVER_URL: Field required; "
        "--interval / FLEETWATCH_SCHEDULER_INTERVAL_S: Input should be greater than or equal "
        "to 0.1"
    )
