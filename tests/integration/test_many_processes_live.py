"""Two and three real server processes on one PostgreSQL, real agents pushing through different
replicas, and a real webhook receiver: a fatal Xid is acted on exactly once (one eviction, one
firing alert, one delivery), and a leader killed with kill -9 in the middle of its work leaves
the rest to a successor that does nothing twice.

The assessment runs on wake-ups only (its timer is an hour), so a fatal Xid stored by any replica
reaches the leader through NOTIFY. The planner and the alerts tick every 2 s and the outbox every
0.5 s: after each check the test waits for several more passes of each, in which a duplicate would
have shown up. Nodes never turn unreachable within a test: an agent whose server was killed
spools, and that silence is not what is tested here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetwatch.sim.spec import FleetSpec
from tests.conftest import TEST_SECRET_KEY
from tests.faults.waiting import wait_for
from tests.integration.cluster import Fleet, kill_leader, report, runs, start, the_leader
from tests.integration.live import (
    AgentProcess,
    LiveServer,
    create_token,
    fleetwatch,
    log_xid79,
    start_agent,
)
from tests.integration.receiver import WebhookReceiver, webhook_receiver

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

SECRET = "many-processes"
PASSES = 3  # further passes of the planner, the alerts and the outbox before counting


@pytest.fixture
def pg_db(migrated_postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    for name, value in {
        "ASSESS_INTERVAL_S": "3600",
        "PLANNER_INTERVAL_S": "2",
        "ALERT_INTERVAL_S": "2",
        "WEBHOOK_DELIVERY_INTERVAL_S": "0.5",
        # A dead leader's claim on a delivery lapses after 6 timeouts: 30 s, not the default 60
        # (18 s in the test that waits for it).
        "WEBHOOK_TIMEOUT_S": "5",
        "STRAGGLER_INTERVAL_S": "3600",  # jobs idle on 2 shared cores
        "ROLLUP_INTERVAL_S": "3600",
        "LIFECYCLE_INTERVAL_S": "3600",
        "REFIT_INTERVAL_S": "0",
        "UNREACHABLE_AFTER_INTERVALS": "1000",
        "METRICS_REQUIRE_TOKEN": "false",  # polled often for the leader and its passes
        "SECRET_KEYS": TEST_SECRET_KEY,  # PostgreSQL stores webhook secrets only encrypted
    }.items():
        monkeypatch.setenv(f"FLEETWATCH_SERVER_{name}", value)
    return migrated_postgres_url


@pytest.fixture
def fleet(pg_db: str) -> Iterator[Fleet]:
    counts = Fleet(pg_db)
    yield counts
    counts.dispose()


@dataclass
class Node:
    name: str
    server: LiveServer  # the replica its agent pushes to
    agent: AgentProcess
    kernel_log: Path


class Cluster:
    """One test's agents (named ``<tag>-000``... in cluster ``<tag>``, with GPUs of their own:
    the database is shared by the session's tests, and a GPU reported by two nodes at once is
    refused) and tokens."""

    def __init__(self, stack: ExitStack, url: str, tmp_path: Path, tag: str, seed: int) -> None:
        self.stack, self.url, self.tmp_path, self.tag = stack, url, tmp_path, tag
        self.seed = seed  # the simulated fleet's GPU serials and UUIDs
        self.tokens = {s: create_token(url, s, f"{tag}-{s}") for s in ("agent", "read", "admin")}

    def subscribe(self, server: LiveServer, receiver: WebhookReceiver) -> None:
        """A signed generic webhook for this test's cluster only (the database is shared)."""
        body = {"name": self.tag, "kind": "generic", "url": receiver.url, "secret": SECRET,
                "filters": {"clusters": [self.tag]}}  # fmt: skip
        with server.client(self.tokens["admin"]) as admin:
            answer = admin.post("/v1/webhooks", json=body)
            assert answer.status_code == 201, answer.text

    def start_nodes(self, servers: list[LiveServer]) -> list[Node]:
        """One simulated node per server given, its agent pushing to that server, with a
        kernel log the test writes Xid lines into."""
        out = self.tmp_path / "sim"
        fleetwatch("sim", "init", "--nodes", str(len(servers)), "--gpus", "2",
                   "--seed", str(self.seed), "--out", str(out))  # fmt: skip
        path = out / "fleet.json"
        spec = FleetSpec.load(path)
        layout = spec.layout.model_copy(update={"cluster": self.tag})
        pattern = self.tag + "-{index:03d}"
        spec = spec.model_copy(update={"layout": layout, "node_name_pattern": pattern})
        spec.save(path)
        nodes = []
        for i, server in enumerate(servers):
            name = spec.node_name(i)
            kernel_log = self.tmp_path / f"{name}-kern.log"
            kernel_log.write_text("")
            agent = start_agent(name, server.url, self.tokens["agent"], self.tmp_path / "agents",
                                "--collectors", "sim,kernel-log", "--sim-spec", str(path),
                                "--kernel-log", str(kernel_log))  # fmt: skip
            self.stack.callback(agent.stop)
            nodes.append(Node(name, server, agent, kernel_log))
        return nodes

    def xid79(self, node: Node) -> None:
        """The kernel of ``node`` logs Xid 79 (fallen off the bus) for its last GPU."""

        def gpus() -> list[dict[str, object]]:
            with node.server.client(self.tokens["read"]) as read:
                answer = read.get(f"/v1/nodes/{node.name}")
            return answer.json().get("gpus", []) if answer.status_code == 200 else []

        found = wait_for(f"the GPUs of {node.name} on the server", gpus)
        log_xid79(node.kernel_log, str(found[-1]["pci_bus_id"]))


def more_passes(leader: LiveServer) -> None:
    """Wait until the leader has run the planner, the alerts and the outbox PASSES more times."""
    jobs = ("planner", "alerts", "webhooks")
    before = {job: runs(leader, job) for job in jobs}
    wait_for(
        f"{PASSES} more passes of {', '.join(jobs)} on {leader.url}",
        lambda: all(runs(leader, job) >= before[job] + PASSES for job in jobs),
    )


def acted_on(fleet: Fleet, receiver: WebhookReceiver, node: str) -> None:
    wait_for(f"an eviction of {node}", lambda: fleet.evictions(node) >= 1)
    wait_for(f"a firing alert for {node}", lambda: "firing" in {s for _, s in fleet.alerts(node)})
    wait_for(f"a delivery for {node}", lambda: receiver.deliveries(node), timeout=180)


def counts(fleet: Fleet, receiver: WebhookReceiver, node: str) -> dict[str, int]:
    sent = receiver.deliveries(node)
    keys = fleet.alert_keys(node)
    found = {
        "evictions": fleet.evictions(node),
        "alert rows": len(keys),
        "alert conditions": len(set(keys)),
        "firing": sum(state == "firing" for _, state in fleet.alerts(node)),
        "deliveries": len(sent),
        "delivery keys": len({d.key for d in sent}),
        "unsigned": sum(not d.signed for d in sent),
    }
    report(f"{node}: " + ", ".join(f"{k} {v}" for k, v in found.items()))
    return found


def assert_once(found: dict[str, int], deliveries: tuple[int, ...] = (1,)) -> None:
    """One eviction, one firing alert, one delivery key: nothing done twice. ``deliveries``:
    the raw counts allowed, 2 where a delivery was in flight when its sender died (delivery is
    at least once: sent again with the same key)."""
    assert found["evictions"] == 1, found
    assert found["alert rows"] == found["alert conditions"] == found["firing"] == 1, found
    assert found["delivery keys"] == 1 and found["deliveries"] in deliveries, found
    assert found["unsigned"] == 0, found


def test_two_processes_act_once_and_a_leader_killed_mid_pass_repeats_nothing(
    pg_db: str, fleet: Fleet, tmp_path: Path
) -> None:
    """[all, all]: three agents, two pushing to the standby and one to the leader. For the
    second fatal Xid the test holds writes to the alerts table: the leader plans the eviction,
    then waits inside its alert pass, and is killed there. The survivor finishes the job."""
    with webhook_receiver(SECRET) as receiver, ExitStack() as stack:
        cluster = Cluster(stack, pg_db, tmp_path, "mp2", seed=2)
        servers = start(stack, pg_db, tmp_path, ["all", "all"])
        leader = the_leader(servers)
        [standby] = [s for s in servers if s is not leader]
        cluster.subscribe(standby, receiver)
        first, _, second = cluster.start_nodes([standby, leader, standby])

        cluster.xid79(first)
        acted_on(fleet, receiver, first.name)
        more_passes(leader)
        assert_once(counts(fleet, receiver, first.name))

        with fleet.writes_held("alerts"):
            cluster.xid79(second)
            wait_for(f"an eviction of {second.name}", lambda: fleet.evictions(second.name) >= 1)
            wait_for("the leader's alert pass held", lambda: fleet.waiting_on("alerts") >= 1)
            kill_leader(leader)
        at_kill = counts(fleet, receiver, second.name)
        report(f"mp2: leader killed inside its alert pass; by then: {at_kill}")
        assert (at_kill["evictions"], at_kill["alert rows"], at_kill["deliveries"]) == (1, 0, 0)
        successor = the_leader(servers)
        assert successor is standby
        acted_on(fleet, receiver, second.name)
        more_passes(successor)
        assert_once(counts(fleet, receiver, second.name))
        assert_once(counts(fleet, receiver, first.name))


def test_three_processes_act_once_and_a_leader_killed_mid_delivery_repeats_nothing(
    pg_db: str, fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[api, all, worker]: agents push to the api replica, the standby and the leader. The
    receiver holds the second alert's delivery unanswered and the leader is killed while it
    waits for the answer; the successor sends it again, with the same Idempotency-Key, once the
    dead leader's claim on it has lapsed (the outbox's lease, 18 s here)."""
    # The lease is 6 delivery timeouts, and waiting it out was most of this test's time: 3 s
    # (18 s of lease, not 30) is still a hundred times what the local receiver takes to answer.
    monkeypatch.setenv("FLEETWATCH_SERVER_WEBHOOK_TIMEOUT_S", "3")
    with webhook_receiver(SECRET) as receiver, ExitStack() as stack:
        cluster = Cluster(stack, pg_db, tmp_path, "mp3", seed=3)
        servers = start(stack, pg_db, tmp_path, ["api", "all", "worker"])
        api = servers[0]
        leader = the_leader(servers)
        assert leader is not api
        [standby] = [s for s in servers[1:] if s is not leader]
        cluster.subscribe(api, receiver)
        first, _, second = cluster.start_nodes([api, leader, standby])

        cluster.xid79(first)
        acted_on(fleet, receiver, first.name)
        more_passes(leader)
        assert_once(counts(fleet, receiver, first.name))

        receiver.hold(lambda d: d.node == second.name and d.event == "trigger")
        cluster.xid79(second)
        assert receiver.held.wait(120), "the leader never sent the second alert"
        kill_leader(leader)  # inside its delivery pass, waiting for the receiver's answer
        receiver.release()
        report(f"mp3: leader killed mid-delivery; by then: {counts(fleet, receiver, second.name)}")
        successor = the_leader(servers)
        assert successor is standby
        wait_for("the delivery sent again", lambda: len(receiver.deliveries(second.name)) >= 2,
                 timeout=180)  # fmt: skip
        more_passes(successor)
        assert_once(counts(fleet, receiver, second.name), deliveries=(2,))
        assert_once(counts(fleet, receiver, first.name))
