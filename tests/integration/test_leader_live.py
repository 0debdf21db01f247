"""One leader among several real `fleetwatch server` processes on one PostgreSQL.

The write jobs run on timers far longer than the test (an hour), so once every process has made
its first passes, an eviction can only come from a wake-up: a fatal Xid posted to an `api`
replica must reach the leader through NOTIFY. Killing the leader with SIGKILL hands the jobs to
another process, which acts on a new Xid the same way and repeats nothing already done.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.factories import make_batch
from tests.faults.waiting import wait_for
from tests.integration.cluster import (
    Fleet,
    is_leader,
    kill_leader,
    push,
    report,
    runs,
    start,
    the_leader,
)
from tests.integration.live import LiveServer, create_token

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

HOUR = "3600"


@pytest.fixture
def pg_db(migrated_postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    # Regular ticks an hour apart: within the test, only wake-ups (and each new leader's first
    # passes) make the planner and the alerts act.
    for name in ("ASSESS_INTERVAL_S", "PLANNER_INTERVAL_S", "ALERT_INTERVAL_S"):
        monkeypatch.setenv(f"FLEETWATCH_SERVER_{name}", HOUR)
    monkeypatch.setenv("FLEETWATCH_SERVER_REFIT_INTERVAL_S", "0")
    monkeypatch.setenv("FLEETWATCH_SERVER_METRICS_REQUIRE_TOKEN", "false")  # polled often
    return migrated_postgres_url


def fatal_batch(node: str) -> dict:
    batch = make_batch(node, gpus=2, ticks=3)
    failing = batch["gpus"][1]
    batch["events"] = [{
        "kind": "xid", "ts": (datetime.now(UTC) - timedelta(seconds=1)).isoformat(),
        "xid": 79, "pci_bus_id": failing["pci_bus_id"],
        "message": f"NVRM: Xid (PCI:{failing['pci_bus_id']}): 79, GPU has fallen off the bus.",
    }]  # fmt: skip
    return batch


@pytest.fixture
def fleet(pg_db: str) -> Iterator[Fleet]:
    counts = Fleet(pg_db)
    yield counts
    counts.dispose()


def check_fatal_xid_once(
    fleet: Fleet, api: LiveServer, leader: LiveServer, token: str, node: str
) -> None:
    """A fatal Xid posted to a replica that is not the leader: one eviction, one alert, made
    by the leader's wake-up and not its timer (its planner and alerts ran once, at start, and
    next run an hour later)."""
    assert not is_leader(api)
    wait_for(
        "the leader's first passes",
        lambda: all(runs(leader, job) >= 1 for job in ("planner", "alerts", "assessment")),
    )
    timer_runs = {job: runs(leader, job) for job in ("planner", "alerts")}
    push(api, token, fatal_batch(node))
    wait_for(f"an eviction of {node} after a wake-up", lambda: fleet.evictions(node) >= 1)
    wait_for(f"an alert for {node}", lambda: any(s == "firing" for _, s in fleet.alerts(node)))
    assert {job: runs(leader, job) for job in timer_runs} == timer_runs, "a timer ran, not a wake"
    report(f"{node}: {fleet.evictions(node)} eviction(s), alerts {fleet.alerts(node)}")
    assert fleet.evictions(node) == 1
    kinds = [kind for kind, _ in fleet.alerts(node)]
    assert len(kinds) == len(set(kinds)), f"an alert fired twice: {fleet.alerts(node)}"


@pytest.mark.parametrize("roles", [["api", "all"], ["api", "worker", "worker"]])
def test_one_leader_acts_on_a_wake_from_any_replica_and_survives_kill(
    pg_db: str, fleet: Fleet, tmp_path: Path, roles: list[str]
) -> None:
    token = create_token(pg_db, "agent", f"leader-{len(roles)}")
    tag = "-".join(roles)
    with ExitStack() as stack:
        servers = start(stack, pg_db, tmp_path, roles)
        api = servers[0]
        leader = the_leader(servers)
        assert leader is not api, "an api replica never leads"
        report(f"{tag}: one leader of {len(servers)} ({leader.url})")
        check_fatal_xid_once(fleet, api, leader, token, f"wake-{tag}")

        kill_leader(leader)
        if len(servers) == 2:  # only the api replica is left: start a worker to take over
            servers += start(stack, pg_db, tmp_path, ["worker"])
        successor = the_leader(servers)
        report(f"{tag}: after kill -9, {successor.url} leads")
        # The new leader's first passes see the old Xid: nothing of it is done twice.
        check_fatal_xid_once(fleet, api, successor, token, f"after-{tag}")
        assert fleet.evictions(f"wake-{tag}") == 1
        kinds = [kind for kind, _ in fleet.alerts(f"wake-{tag}")]
        assert len(kinds) == len(set(kinds)), fleet.alerts(f"wake-{tag}")
        assert all(state == "firing" for _, state in fleet.alerts(f"wake-{tag}"))
