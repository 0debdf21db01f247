"""Maintenance windows across two real server processes on one PostgreSQL, through the CLI.

A window opened with ``fleetwatch maintenance add`` against one replica is honoured by the other
(``/v1/nodes`` reads ``maintenance``) and by the leader, whichever it is: of two nodes that go
silent, only the one outside the window gets an unreachable eviction and alert. Ended with
``fleetwatch maintenance end`` against the other replica, the window's node is judged again
from the window's end: it gets its eviction after its intervals.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.factories import make_batch
from tests.faults.waiting import wait_for
from tests.integration.cluster import Fleet, push, report, runs, start, the_leader
from tests.integration.live import FLEETWATCH, create_token

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

PASSES = 3


@pytest.fixture
def pg_db(migrated_postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    for name, value in {
        "ASSESS_INTERVAL_S": "3600",
        "PLANNER_INTERVAL_S": "1",
        "ALERT_INTERVAL_S": "1",
        "STRAGGLER_INTERVAL_S": "3600",
        "ROLLUP_INTERVAL_S": "3600",
        "LIFECYCLE_INTERVAL_S": "3600",
        "REFIT_INTERVAL_S": "0",
        "DRAIN_BUDGET_PCT": "100",
        # Two of two nodes silent would be a fleet-wide silence: each node is judged on its own.
        "UNREACHABLE_STORM_PCT": "0",
        "METRICS_REQUIRE_TOKEN": "false",
    }.items():
        monkeypatch.setenv(f"FLEETWATCH_SERVER_{name}", value)
    return migrated_postgres_url


@pytest.fixture
def fleet(pg_db: str) -> Iterator[Fleet]:
    counts = Fleet(pg_db)
    yield counts
    counts.dispose()


def _cli(*args: str, server: str, token: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLEETWATCH_URL": server, "FLEETWATCH_TOKEN": token}
    return subprocess.run(
        [*FLEETWATCH, "maintenance", *args], capture_output=True, text=True, timeout=300, env=env
    )


def test_a_window_made_through_one_replica_is_honoured_by_the_other_and_the_leader(
    pg_db: str, fleet: Fleet, tmp_path: Path
) -> None:
    tag = f"mw{uuid.uuid4().hex[:6]}"  # the database is shared by the session's tests
    inside, outside = f"{tag}-in", f"{tag}-out"
    tokens = {s: create_token(pg_db, s, f"{tag}-{s}") for s in ("agent", "read", "scheduler")}
    with ExitStack() as stack:
        a, b = start(stack, pg_db, tmp_path, ["all", "all"])
        leader = the_leader([a, b])

        made = _cli("add", "--node", inside, "--until-ended", "--reason", "swap PSU",
                    server=a.url, token=tokens["scheduler"])  # fmt: skip
        assert made.returncode == 0, made.stderr
        window_id = made.stdout.split()[2]
        listed = _cli("list", server=b.url, token=tokens["read"])
        assert listed.returncode == 0 and f"{window_id}\tactive\t{inside}" in listed.stdout

        # Both report once (1 s interval) and fall silent: unreachable after 3 s.
        for name in (inside, outside):
            batch = make_batch(name, gpus=1, interval_s=1.0)
            batch["node"]["labels"] = {"cluster": tag}
            push(b, tokens["agent"], batch)
        wait_for(f"an eviction of {outside}", lambda: fleet.evictions(outside) >= 1)
        before = runs(leader, "planner"), runs(leader, "alerts")
        wait_for(
            f"{PASSES} more planner and alert passes",
            lambda: (
                runs(leader, "planner") >= before[0] + PASSES
                and runs(leader, "alerts") >= before[1] + PASSES
            ),
        )
        assert fleet.evictions(inside) == 0
        assert ("unreachable", "firing") in fleet.alerts(outside)
        assert fleet.alerts(inside) == []
        with b.client(tokens["read"]) as read:
            node = read.get(f"/v1/nodes/{inside}").json()
        assert node["state"] == "maintenance" and node["maintenance"]["id"] == int(window_id)
        report(f"{inside} in window {window_id} (made via {a.url}): read on {b.url}; no eviction")

        ended = _cli("end", window_id, server=b.url, token=tokens["scheduler"])
        assert ended.returncode == 0 and "ended" in ended.stdout, ended.stderr
        again = _cli("end", window_id, server=a.url, token=tokens["scheduler"])
        assert again.returncode != 0 and "ended already" in again.stderr
        wait_for(f"an eviction of {inside} after the window", lambda: fleet.evictions(inside) >= 1)
        report(f"window {window_id} ended via {b.url}: {inside} evicted by the leader after it")
