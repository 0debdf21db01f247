"""A server behind on ingest does not call its nodes unreachable (server.concepts.ingest_lag).

Each push stores how late it was stored (``nodes.lag_s``); the fleet's median of them moves every
unreachable deadline out. Ten nodes report through POST /v1/ingest (both databases); the lag and
the silence are then set in the database and judged at an injected ``now`` by the planner and the
alerter, as the leader runs them, and by the readers (``GET /v1/nodes``, ``/metrics``) at the
app's own clock. Interval 10 s, 3 intervals: a node is unreachable after 30 s of silence, or
after 230 s while the fleet's pushes are stored 200 s late.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from tests.factories import make_batch
from tests.unit.server.conftest import Push
from tests.unit.server.judge.test_fleet_silence import _alert, _evictions, _firing, _fleet, _plan

from fleetwatch.server.concepts.ingest_lag import MIN_NODES, WINDOW, fleet_lag_s
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import evictions, nodes

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
LAG = 200.0
QUIET = {"unreachable_storm_pct": 0.0, "drain_budget_pct": 50.0}  # no storm guard in the way


def _heard(*lags: float | None) -> list[tuple[datetime, float | None]]:
    return [(T0, lag) for lag in lags]


def test_the_fleet_lag_is_the_median_of_the_recently_heard_nodes() -> None:
    heard = _heard(10.0, 200.0, 210.0, 190.0, None, *([195.0] * 6))
    assert fleet_lag_s(heard, T0, max_s=3600) == 195.0
    # A node heard before the window no longer counts: its lag is an old push's.
    old = [(T0 - WINDOW - timedelta(seconds=1), 5000.0)] * 20
    assert fleet_lag_s(heard + old, T0, max_s=3600) == 195.0
    # A few wrong clocks move the median little; the lag is never below 0 nor above the cap.
    assert fleet_lag_s(_heard(*[-3.0] * 8, 9000.0, 9000.0), T0, max_s=3600) == 0.0
    assert fleet_lag_s(_heard(*[9000.0] * 10), T0, max_s=3600) == 3600
    assert fleet_lag_s(_heard(*[200.0] * 10), T0, max_s=0) == 0.0  # 0: off
    assert fleet_lag_s([], T0, max_s=3600) == 0.0


def test_a_few_nodes_have_no_fleet_lag() -> None:
    """Nine nodes' median is theirs, not a server's backlog (a node whose readings are an hour
    old moves no deadline of the other)."""
    assert fleet_lag_s(_heard(*[200.0] * (MIN_NODES - 1)), T0, max_s=3600) == 0.0
    assert fleet_lag_s(_heard(*[200.0] * (MIN_NODES - 1), None), T0, max_s=3600) == 0.0
    assert fleet_lag_s(_heard(*[200.0] * MIN_NODES), T0, max_s=3600) == 200.0


def _lags(db: Database) -> dict[str, float | None]:
    with db.read() as conn:
        return {r.name: r.lag_s for r in conn.execute(select(nodes.c.name, nodes.c.lag_s))}


def test_a_push_stores_how_late_it_was_stored(push: Push, db: Database) -> None:
    """The lag is the node's ``last_seen`` (the server's clock at storing) minus the push's
    newest reading, whatever the machine's speed."""
    start = utcnow() - timedelta(seconds=LAG + 20)
    late = make_batch("node-late", gpus=2, ticks=3, start=start)
    assert push(late).status_code == 200
    newest = start + timedelta(seconds=20)  # 3 ticks of 10 s
    with db.read() as conn:
        row = conn.execute(
            select(nodes.c.last_seen, nodes.c.lag_s).where(nodes.c.name == "node-late")
        ).one()
    assert row.lag_s is not None
    assert abs(row.lag_s - (row.last_seen - newest).total_seconds()) < 1e-3
    assert row.lag_s >= LAG  # stored no earlier than it was made


def _fleet_heard(db: Database, at: datetime, lag_s: float | None, silent: dict[str, float]) -> None:
    """Every node last heard at ``at`` with ``lag_s``, but those of ``silent``: seconds before."""
    with db.write() as conn:
        conn.execute(update(nodes).values(last_seen=at, lag_s=lag_s))
        for name, seconds in silent.items():
            conn.execute(
                update(nodes)
                .where(nodes.c.name == name)
                .values(last_seen=at - timedelta(seconds=seconds))
            )


def test_within_the_fleets_lag_a_silent_node_is_not_drained_nor_paged(
    client: TestClient, push: Push, db: Database
) -> None:
    _fleet(push)
    now = utcnow() + timedelta(minutes=5)
    # node-00: 100 s silent, past its 30 s but within 30 + 200; node-01: 300 s, past both.
    _fleet_heard(db, now, LAG, {"node-00": 100.0, "node-01": 300.0})
    result = _plan(client, now, **QUIET)
    assert result.silent == 1
    assert _evictions(db) == [("node-01", "pending", "node_unreachable")]
    _alert(client, now, **QUIET)
    assert _firing(db) == ["node:node-01:unreachable"]


def test_with_the_grace_off_the_same_silence_drains_both(
    client: TestClient, push: Push, db: Database
) -> None:
    _fleet(push)
    now = utcnow() + timedelta(minutes=5)
    _fleet_heard(db, now, LAG, {"node-00": 100.0, "node-01": 300.0})
    _plan(client, now, unreachable_lag_grace_max_s=0.0, **QUIET)
    assert _evictions(db) == [("node-00", "pending", "node_unreachable"),
                              ("node-01", "pending", "node_unreachable")]  # fmt: skip


def _eviction_reason(db: Database, node: str) -> Any:
    with db.read() as conn:
        return conn.execute(select(evictions).where(evictions.c.node == node)).one()


def test_the_drain_says_the_lag_it_waited_for(client: TestClient, push: Push, db: Database) -> None:
    _fleet(push)
    now = utcnow() + timedelta(minutes=5)
    _fleet_heard(db, now, LAG, {"node-01": 300.0})
    _plan(client, now, **QUIET)
    row = _eviction_reason(db, "node-01")
    assert row.evidence["fleet_ingest_lag_s"] == LAG
    assert "200 s for the fleet's late pushes" in row.reason


def test_an_open_drain_stays_while_only_the_lag_holds_its_node_back(
    client: TestClient, push: Push, db: Database
) -> None:
    _fleet(push)
    now = utcnow() + timedelta(minutes=5)
    # Drained and paged with the fleet on time: 100 s silent is past 30 s.
    _fleet_heard(db, now, 0.0, {"node-00": 100.0})
    _plan(client, now, **QUIET)
    _alert(client, now, **QUIET)
    assert _evictions(db) == [("node-00", "pending", "node_unreachable")]
    # The fleet's pushes then fall 200 s behind; node-00 has still not reported: it is not back.
    later = now + timedelta(seconds=5)
    _fleet_heard(db, later, LAG, {"node-00": 105.0})
    _plan(client, later, **QUIET)
    _alert(client, later, **QUIET)
    assert _evictions(db) == [("node-00", "pending", "node_unreachable")]
    assert _firing(db) == ["node:node-00:unreachable"]
    # It reports: the drain is cancelled and the page resolved, as for any node back.
    back = later + timedelta(seconds=5)
    _fleet_heard(db, back, LAG, {})
    _plan(client, back, **QUIET)
    _alert(client, back, **QUIET)
    assert _evictions(db) == [("node-00", "cancelled", "node_unreachable")]
    assert _firing(db) == []


@pytest.mark.parametrize("grace", [3600.0, 0.0])
def test_readers_judge_by_the_same_lag(
    client: TestClient, push: Push, db: Database, read: Any, grace: float
) -> None:
    state = client.app.state  # type: ignore[attr-defined]
    # This app started just now: it would call node-00 unheard (silent since before it could
    # hear it). Listening since an hour ago, it judges by last_seen and the lag alone.
    state.liveness = replace(
        state.liveness, heard_since=utcnow() - timedelta(hours=1), lag_max_s=grace
    )
    state.fleet._liveness = state.liveness
    _fleet(push)
    _fleet_heard(db, utcnow(), LAG, {"node-00": 100.0})
    states = {n["name"]: n["state"] for n in read("/v1/nodes").json()["data"]}
    assert states["node-00"] == ("up" if grace else "unreachable")
    assert states["node-01"] == "up"
    assert read("/v1/nodes/node-00").json()["state"] == states["node-00"]
    page = read("/metrics").text
    assert "fleetwatch_fleet_ingest_lag_seconds 200.000\n" in page  # measured either way
    assert f'fleetwatch_node_up{{node="node-00"}} {1 if grace else 0}\n' in page
