"""Fleet-wide silence: many nodes silent at once is the server's or the network's fault.

Ten nodes report through POST /v1/ingest; silence is then set in the database (``last_seen``)
and judged at an injected ``now``, by the planner and the alerter, as the leader runs them. The
threshold is 25 % here: two silent nodes are each node's own, three are a storm. Both databases.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select, update
from tests.factories import make_batch
from tests.unit.server.conftest import Push
from tests.unit.server.tell.test_alerts_webhooks import _xid79

from fleetwatch.config import ServerSettings
from fleetwatch.server.act.planner import EvictionPlanner, PlanResult
from fleetwatch.server.concepts.liveness import Liveness
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import alerts, evictions, nodes
from fleetwatch.server.judge.silence import is_storm
from fleetwatch.server.metrics.exposition import FleetExposition
from fleetwatch.server.repo.maintenance import create_window
from fleetwatch.server.schemas.maintenance import MaintenanceCreate
from fleetwatch.server.tell.alerting import Alerter

NODES = [f"node-{i:02d}" for i in range(10)]
LATER = timedelta(minutes=5)  # every node is silent by then (interval 10 s, 3 intervals)


def _settings(client: TestClient, **overrides: Any) -> ServerSettings:
    base: ServerSettings = client.app.state.settings  # type: ignore[attr-defined]
    return base.model_copy(
        update={"unreachable_storm_pct": 25.0, "unreachable_storm_min_nodes": 2, **overrides}
    )


def _fleet(push: Push, xid_node: str | None = None) -> None:
    for name in NODES:
        batch = _xid79(name) if name == xid_node else make_batch(name, gpus=2, ticks=1)
        assert push(batch).status_code == 200


def _hear(db: Database, names: list[str], at: datetime) -> None:
    """These nodes reported at ``at``: the others stay silent since their push."""
    with db.write() as conn:
        conn.execute(update(nodes).where(nodes.c.name.in_(names)).values(last_seen=at))


def _plan(client: TestClient, now: datetime, **overrides: Any) -> PlanResult:
    state = client.app.state  # type: ignore[attr-defined]
    state.assessor.run_once()
    return EvictionPlanner(state.db, _settings(client, **overrides), state.assessor).run_once(now)


def _alert(client: TestClient, now: datetime, **overrides: Any) -> None:
    state = client.app.state  # type: ignore[attr-defined]
    snapshot = state.assessor.run_once()
    Alerter(state.db, _settings(client, **overrides), lambda: snapshot).run_once(now)


def _evictions(db: Database) -> list[tuple[str, str, str]]:
    with db.read() as conn:
        rows = conn.execute(select(evictions).order_by(evictions.c.id))
        return [(r.node, r.state, r.reason.split(":")[0].split(" ")[0]) for r in rows]


def _firing(db: Database) -> list[str]:
    with db.read() as conn:
        rows = conn.execute(select(alerts.c.dedup_key).where(alerts.c.state == "firing"))
        return sorted(rows.scalars())


def _silence_alert(db: Database) -> Any:
    with db.read() as conn:
        return conn.execute(select(alerts).where(alerts.c.dedup_key == "fleet:silence")).one()


def test_a_storm_needs_more_than_the_share_and_two_nodes() -> None:
    assert is_storm(3, 10, 25.0) and not is_storm(2, 10, 25.0)
    assert not is_storm(1, 2, 25.0)  # one node is its own silence, at any fleet size
    assert not is_storm(10, 10, 0.0)  # 0: off
    assert not is_storm(0, 0, 25.0)
    assert not is_storm(3, 10, 25.0, min_nodes=10)  # the default minimum: a small fleet's 3
    assert is_storm(10, 40, 5.0, min_nodes=10)
    assert not is_storm(1, 2, 5.0, min_nodes=1)  # never fewer than two


def test_below_the_threshold_silent_nodes_are_evicted_and_alerted(
    client: TestClient, push: Push, db: Database
) -> None:
    _fleet(push)
    now = utcnow() + LATER
    _hear(db, NODES[2:], now)
    result = _plan(client, now, drain_budget_pct=50.0)
    assert result.silent == 2 and not result.silence_storm
    assert _evictions(db) == [("node-00", "pending", "node_unreachable"),
                              ("node-01", "pending", "node_unreachable")]  # fmt: skip
    _alert(client, now)
    assert _firing(db) == ["node:node-00:unreachable", "node:node-01:unreachable"]


def test_a_storm_evicts_nobody_and_fires_one_fleet_alert(
    client: TestClient, push: Push, db: Database
) -> None:
    _fleet(push)
    now = utcnow() + LATER
    _hear(db, NODES[4:], now)
    result = _plan(client, now)
    assert result.silent == 4 and result.silence_storm
    assert _evictions(db) == []
    _alert(client, now)
    assert _firing(db) == ["fleet:silence"]
    alert = _silence_alert(db)
    assert alert.kind == "fleet_silence" and alert.severity == "critical"
    assert alert.evidence["unreachable_nodes"] == 4 and alert.evidence["share_pct"] == 40.0
    assert "ingest" in alert.summary and "network" in alert.summary


def test_a_small_fleets_few_silent_nodes_are_no_storm_by_default(
    client: TestClient, push: Push, db: Database
) -> None:
    """The product default (at least 10 nodes): 4 of 10 silent is 40 %, far over the share, but
    a small fleet's few silent nodes (a rack's power) are drained one by one."""
    _fleet(push)
    now = utcnow() + LATER
    _hear(db, NODES[4:], now)
    default = ServerSettings().unreachable_storm_min_nodes
    result = _plan(client, now, unreachable_storm_min_nodes=default, drain_budget_pct=50.0)
    assert default == 10
    assert result.silent == 4 and not result.silence_storm
    assert [node for node, _, reason in _evictions(db)] == NODES[:4]


def test_a_fatal_xid_in_a_storm_still_drains(client: TestClient, push: Push, db: Database) -> None:
    """The budget (5 % of 10 nodes: one) is not eaten by the silent nodes."""
    _fleet(push, xid_node="node-09")
    now = utcnow() + LATER
    _hear(db, NODES[4:], now)
    _plan(client, now)
    assert _evictions(db) == [("node-09", "pending", "xid79_off_bus")]


def test_without_the_guard_a_silence_eats_the_budget(
    client: TestClient, push: Push, db: Database
) -> None:
    """The failure the guard prevents: the fatal Xid's eviction is paged behind the silent."""
    _fleet(push, xid_node="node-09")
    now = utcnow() + LATER
    _hear(db, NODES[4:], now)
    _plan(client, now, unreachable_storm_pct=0.0)
    made = _evictions(db)
    assert ("node-09", "paged", "xid79_off_bus") in made
    assert sum(1 for _, _, reason in made if reason == "node_unreachable") == 4


def test_when_the_share_falls_back_the_alert_resolves_and_a_silent_node_drains(
    client: TestClient, push: Push, db: Database
) -> None:
    _fleet(push)
    now = utcnow() + LATER
    _hear(db, NODES[4:], now)
    _plan(client, now)
    _alert(client, now)
    assert _firing(db) == ["fleet:silence"]
    later = now + timedelta(seconds=10)
    _hear(db, NODES[1:], later)  # all but node-00 report again
    result = _plan(client, later)
    assert result.silent == 1 and not result.silence_storm
    assert _evictions(db) == [("node-00", "pending", "node_unreachable")]
    _alert(client, later)
    assert _firing(db) == ["node:node-00:unreachable"]
    assert _silence_alert(db).state == "resolved"


def test_open_unreachable_evictions_and_alerts_stay_through_a_storm(
    client: TestClient, push: Push, db: Database
) -> None:
    """Made on the node's own silence before the storm: neither cancelled nor resolved by it."""
    _fleet(push)
    now = utcnow() + LATER
    _hear(db, NODES[1:], now)
    _plan(client, now)
    _alert(client, now)
    assert _evictions(db) == [("node-00", "pending", "node_unreachable")]
    later = now + timedelta(minutes=5)
    _hear(db, NODES[5:], later)  # node-00 and four more silent: a storm
    result = _plan(client, later)
    assert result.silence_storm and result.cancelled == 0
    assert _evictions(db) == [("node-00", "pending", "node_unreachable")]
    _alert(client, later)
    assert _firing(db) == ["fleet:silence", "node:node-00:unreachable"]


def test_nodes_in_maintenance_do_not_count(client: TestClient, push: Push, db: Database) -> None:
    """Four of ten silent is a storm; with three of them in a window, one of seven is not."""
    _fleet(push)
    now = utcnow() + LATER
    _hear(db, NODES[4:], now)
    with db.write() as conn:
        made = MaintenanceCreate(reason="planned work", nodes=NODES[1:4])
        create_window(conn, made, actor="test", now=now - timedelta(minutes=1))
    result = _plan(client, now)
    assert result.silent == 1 and not result.silence_storm
    assert _evictions(db) == [("node-00", "pending", "node_unreachable")]
    _alert(client, now)
    assert _firing(db) == ["node:node-00:unreachable"]


def _scrape(db: Database, now: datetime) -> list[str]:
    liveness = Liveness(3.0, clock=lambda: now)
    return FleetExposition(db, ttl_s=0, liveness=liveness, storm_pct=25.0).render().splitlines()


def test_metrics_show_the_silent_nodes_and_the_storm(push: Push, db: Database) -> None:
    _fleet(push)
    now = utcnow() + LATER
    _hear(db, NODES[2:], now)
    lines = _scrape(db, now)
    assert "fleetwatch_fleet_silent_nodes 2" in lines and "fleetwatch_fleet_silence 0" in lines
    _hear(db, NODES[4:], now)
    _hear(db, NODES[:4], now - LATER)
    lines = _scrape(db, now)
    assert "fleetwatch_fleet_silent_nodes 4" in lines and "fleetwatch_fleet_silence 1" in lines


def test_another_process_decides_the_same_from_the_database(
    client: TestClient, push: Push, db: Database
) -> None:
    """No state of the storm lives in a process: a new leader's planner and alerter (fresh
    instances) neither evict, nor fire a second alert, nor resolve the first."""
    _fleet(push)
    now = utcnow() + LATER
    _hear(db, NODES[4:], now)
    _plan(client, now)
    _alert(client, now)
    [first] = _firing(db)
    later = now + timedelta(seconds=5)
    result = _plan(client, later)  # each call builds a new planner and alerter
    _alert(client, later)
    assert result.silence_storm and _evictions(db) == []
    assert _firing(db) == [first] == ["fleet:silence"]
    assert _silence_alert(db).occurrences == 2
