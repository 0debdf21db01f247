"""The urgent lane across processes: an api process and a worker on one PostgreSQL, every timer an
hour away. A fatal Xid pushed to the api process reaches the worker (the leader) through NOTIFY
with its node, and the worker's targeted pass evicts the node without a whole-fleet pass. The api
process serves the worker's stored whole-fleet snapshot rather than judging the fleet itself."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.factories import make_batch
from tests.faults.waiting import wait_for
from tests.integration.cluster import Fleet, metric, push, report, runs, start, the_leader
from tests.integration.live import create_token
from tests.integration.test_leader_live import fatal_batch

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

HOUR = "3600"


@pytest.fixture
def pg_db(migrated_postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    for name in ("ASSESS_INTERVAL_S", "PLANNER_INTERVAL_S", "ALERT_INTERVAL_S"):
        monkeypatch.setenv(f"FLEETWATCH_SERVER_{name}", HOUR)
    monkeypatch.setenv("FLEETWATCH_SERVER_REFIT_INTERVAL_S", "0")
    monkeypatch.setenv("FLEETWATCH_SERVER_METRICS_REQUIRE_TOKEN", "false")  # polled often
    return migrated_postgres_url


@pytest.fixture
def fleet(pg_db: str) -> Iterator[Fleet]:
    counts = Fleet(pg_db)
    yield counts
    counts.dispose()


def test_a_fatal_xid_pushed_to_the_api_process_is_evicted_by_the_urgent_lane(
    pg_db: str, fleet: Fleet, tmp_path: Path
) -> None:
    token = create_token(pg_db, "agent")
    with ExitStack() as stack:
        api, worker = start(stack, pg_db, tmp_path, ["api", "worker"])
        assert the_leader([api, worker]) is worker
        push(api, token, make_batch("node-urgent", gpus=2, ticks=3))
        push(api, token, make_batch("node-calm", gpus=2, ticks=3))
        # Settled: the worker's first passes (its start and its leadership) are done.
        wait_for(
            "the worker's first passes",
            lambda: (
                runs(worker, "assessment") >= 2
                and min(runs(worker, "planner"), runs(worker, "alerts")) >= 1
            ),
            timeout=120,
        )
        snapshots = "fleetwatch_fleet_snapshots_total{outcome="
        wait_for(
            "the api process adopting the worker's snapshot",
            lambda: metric(api, snapshots + '"adopted"}'),
        )
        assert (metric(worker, snapshots + '"published"}') or 0) >= 1
        assert metric(api, snapshots + '"published"}') is None, "only the leader publishes"
        whole = runs(worker, "assessment")
        urgent = runs(worker, "urgent")
        push(api, token, fatal_batch("node-urgent"))
        wait_for("an eviction of node-urgent", lambda: fleet.evictions("node-urgent") >= 1)
        wait_for("the urgent pass counted", lambda: runs(worker, "urgent") > urgent)
        report(
            f"urgent lane: evicted; worker passes: assessment {runs(worker, 'assessment')}, "
            f"urgent {runs(worker, 'urgent')}"
        )
        assert runs(worker, "assessment") == whole, "no whole-fleet pass was needed"
        assert fleet.evictions("node-urgent") == 1
        assert fleet.evictions("node-calm") == 0
        # The api process's own targeted pass runs beside the worker's, and may end after it.
        wait_for("the api process's own targeted pass", lambda: runs(api, "urgent") >= 1)
