"""Job notices across two real server processes on one PostgreSQL (issue 15): a fatal Xid pushed
to the leader reaches a StepReporter long-polling the other replica (woken by NOTIFY), and a
reporter that connects later (a rank that reconnected) reads what it missed from the start."""

from __future__ import annotations

import threading
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fleetwatch.client import StepReporter
from tests.conftest import TEST_SECRET_KEY
from tests.faults.waiting import wait_for
from tests.integration.cluster import push, start, the_leader
from tests.integration.live import create_token
from tests.unit.server.routers.test_risk_api import _xid_batch

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


@pytest.fixture
def pg_db(migrated_postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    for name, value in {
        "ASSESS_INTERVAL_S": "3600",  # the fatal Xid wakes it (NOTIFY from any replica)
        "PLANNER_INTERVAL_S": "3600",  # the leader plans and derives notices after assessing
        "ALERT_INTERVAL_S": "3600",
        "STRAGGLER_INTERVAL_S": "3600",
        "ROLLUP_INTERVAL_S": "3600",
        "LIFECYCLE_INTERVAL_S": "3600",
        "REFIT_INTERVAL_S": "0",
        "UNREACHABLE_AFTER_INTERVALS": "1000",
        "METRICS_REQUIRE_TOKEN": "false",
        "SECRET_KEYS": TEST_SECRET_KEY,
    }.items():
        monkeypatch.setenv(f"FLEETWATCH_SERVER_{name}", value)
    return migrated_postgres_url


def test_a_notice_reaches_a_rank_through_the_other_process_and_after_a_reconnect(
    pg_db: str, tmp_path: Path
) -> None:
    agent = create_token(pg_db, "agent", "notice-agent")
    with ExitStack() as stack:
        servers = start(stack, pg_db, tmp_path, ["all", "all"])
        leader = the_leader(servers)
        [standby] = [s for s in servers if s is not leader]
        heard: list[dict[str, Any]] = []
        arrived = threading.Event()

        def on_notice(notice: dict[str, Any]) -> None:
            heard.append(notice)
            arrived.set()

        rank0 = stack.enter_context(
            StepReporter(
                standby.url,
                agent,
                "live-job",
                rank=0,
                node="node-n1",
                flush_interval_s=0.1,
                on_notice=on_notice,
            )  # fmt: skip
        )
        rank0.start(nodes=["node-n1", "node-n2"], started_at=datetime.now(UTC))
        wait_for("the job's start stored", lambda: rank0.sent_events == 1)
        push(leader, agent, _xid_batch("node-n1", 79))
        wait_for("notices at rank 0 via the standby", lambda: len(heard) >= 2, timeout=120)
        kinds = {(n["kind"], n["node"]) for n in heard}
        assert kinds == {("drain_pending", "node-n1"), ("gpu_out", "node-n1")}
        assert rank0.should_checkpoint() and rank0.exit_advised

        # A rank that was away reads everything from its cursor (0), through the leader.
        late = stack.enter_context(
            StepReporter(
                leader.url, agent, "live-job", rank=1, node="node-n2", flush_interval_s=0.1
            )  # fmt: skip
        )
        wait_for("the late rank's notices", lambda: len(late.notices) >= 2, timeout=120)
        assert [n["id"] for n in late.notices] == sorted(n["id"] for n in heard)
        assert late.should_checkpoint()
