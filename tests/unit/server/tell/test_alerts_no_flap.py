"""Alerts and evictions do not flap when a process starts or acts on an older snapshot.

Each rule on both databases: a process with no assessment resolves nothing; a snapshot older than
an alert's last sighting does not resolve it; silence from before a process started is not a
node's silence (no unreachable alert or eviction, none resolved or cancelled, in the grace).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select
from tests.factories import make_batch
from tests.unit.server.conftest import Push
from tests.unit.server.tell.test_alerts_webhooks import _xid79

from fleetwatch.config import ServerSettings
from fleetwatch.server.act.planner import EvictionPlanner
from fleetwatch.server.concepts.liveness import is_unheard, node_state
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import alerts, evictions
from fleetwatch.server.judge.assessment import FleetAssessment
from fleetwatch.server.tell.alerting import Alerter

INTERVAL_S = 10.0  # make_batch's interval; unreachable after 3 of them (the default)


def _state(client: TestClient) -> Any:
    return client.app.state  # type: ignore[attr-defined]


def _alerts(db: Database) -> list[tuple[int, str, str]]:
    with db.read() as conn:
        rows = conn.execute(select(alerts).order_by(alerts.c.id))
        return [(row.id, row.dedup_key, row.state) for row in rows]


def _evictions(db: Database) -> list[tuple[int, str, str]]:
    with db.read() as conn:
        rows = conn.execute(select(evictions).order_by(evictions.c.id))
        return [(row.id, row.node, row.state) for row in rows]


def _alerter(
    client: TestClient,
    snapshot: FleetAssessment | None,
    heard_since: datetime | None = None,
) -> Alerter:
    """Another process's alerter: same database and settings, its own snapshot and start."""
    state = _state(client)
    return Alerter(state.db, state.settings, lambda: snapshot, heard_since=heard_since)


def test_liveness_counts_silence_only_since_the_server_listened() -> None:
    seen = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)
    started = seen + timedelta(minutes=10)  # the server was down for ten minutes
    assert node_state(seen, 10.0, 3.0, started + timedelta(seconds=5)) == "unreachable"
    assert node_state(seen, 10.0, 3.0, started + timedelta(seconds=5), started) == "up"
    assert node_state(seen, 10.0, 3.0, started + timedelta(seconds=31), started) == "unreachable"
    assert is_unheard(seen, 10.0, 3.0, started + timedelta(seconds=5), started)
    assert not is_unheard(seen, 10.0, 3.0, started + timedelta(seconds=31), started)
    # A node heard after the start is judged by its own last batch.
    later = started + timedelta(minutes=1)
    assert node_state(later, 10.0, 3.0, later + timedelta(seconds=31), started) == "unreachable"


def test_a_process_with_no_assessment_resolves_nothing(
    client: TestClient, db: Database, push: Push
) -> None:
    assert push(_xid79("node-a")).status_code == 200
    _state(client).assessor.run_once()
    assert _state(client).alerter.run_once().fired == 1
    [(alert_id, key, state)] = _alerts(db)
    assert key.startswith("gpu:") and state == "firing"
    # A freshly started process, before its first assessment: nothing resolves.
    fresh = _alerter(client, None, heard_since=datetime.now(UTC))
    for _ in range(3):
        result = fresh.run_once()
        assert (result.fired, result.resolved, result.queued) == (0, 0, 0)
    assert _alerts(db) == [(alert_id, key, "firing")]


def test_a_snapshot_older_than_an_alert_does_not_resolve_it(
    client: TestClient, db: Database, push: Push
) -> None:
    assessor = _state(client).assessor
    assert push(make_batch("node-a", gpus=2)).status_code == 200
    stale = assessor.run_once()  # another worker's snapshot, from before the Xid
    assert push(_xid79("node-a")).status_code == 200
    assessor.run_once()
    assert _state(client).alerter.run_once().fired == 1
    [(alert_id, key, _)] = _alerts(db)
    # The other worker's pass lacks the Xid, but its snapshot predates the alert: it stays.
    other = _alerter(client, stale)
    assert other.run_once().resolved == 0
    assert _alerts(db) == [(alert_id, key, "firing")]
    # The node reboots: a snapshot made after the alert was last seen resolves it.
    assert push(make_batch("node-a", gpus=2, boot_id="boot-2")).status_code == 200
    cleared = assessor.run_once()
    assert _alerter(client, cleared).run_once().resolved == 1
    assert _alerts(db) == [(alert_id, key, "resolved")]


def test_silence_from_before_a_start_is_no_unreachable_alert_until_the_grace_ends(
    client: TestClient, db: Database, push: Push
) -> None:
    assert push(make_batch("node-q", gpus=1)).status_code == 200
    seen = datetime.now(UTC)
    snapshot = _state(client).assessor.run_once()
    # The server was down ten minutes: a process started then gives the node its intervals.
    started = seen + timedelta(minutes=10)
    fresh = _alerter(client, snapshot, heard_since=started)
    assert fresh.run_once(started + timedelta(seconds=5)).fired == 0
    assert _alerts(db) == []
    # A worker up all along saw the silence: its unreachable alert is not resolved by a process
    # still in its grace (the node has not come back).
    long_up = _alerter(client, snapshot)
    assert long_up.run_once(started + timedelta(seconds=5)).fired == 1
    [(alert_id, key, _)] = _alerts(db)
    assert key == "node:node-q:unreachable"
    assert fresh.run_once(started + timedelta(seconds=6)).resolved == 0
    assert _alerts(db) == [(alert_id, key, "firing")]
    # Past the grace the fresh process agrees: still the same alert, firing.
    passed = fresh.run_once(started + timedelta(seconds=3 * INTERVAL_S + 1))
    assert (passed.fired, passed.resolved, passed.still) == (0, 0, 1)
    # The node reports again: now it resolves.
    assert push(make_batch("node-q", gpus=1)).status_code == 200
    assert fresh.run_once().resolved == 1


def test_silence_from_before_a_start_is_no_unreachable_eviction_until_the_grace_ends(
    client: TestClient, db: Database, push: Push, settings: ServerSettings
) -> None:
    state = _state(client)
    assert push(make_batch("node-q", gpus=1)).status_code == 200
    assert push(make_batch("node-r", gpus=1)).status_code == 200
    seen = datetime.now(UTC)
    state.assessor.run_once()
    started = seen + timedelta(minutes=10)
    # Two of two nodes silent would be a fleet-wide silence (test_fleet_silence): guard off.
    per_node = state.settings.model_copy(update={"unreachable_storm_pct": 0.0})
    fresh = EvictionPlanner(db, per_node, state.assessor, heard_since=started)
    assert fresh.run_once(started + timedelta(seconds=5)).created == {}
    assert _evictions(db) == []
    # A planner up all along drains a silent node; the fresh one, in its grace, neither cancels
    # it nor adds another.
    long_up = EvictionPlanner(db, per_node, state.assessor)
    made = long_up.run_once(started + timedelta(seconds=5)).created
    assert sum(made.values()) == 2
    before = _evictions(db)
    in_grace = fresh.run_once(started + timedelta(seconds=6))
    assert (in_grace.created, in_grace.cancelled) == ({}, 0)
    assert _evictions(db) == before
    past = fresh.run_once(started + timedelta(seconds=3 * INTERVAL_S + 1))
    assert (past.created, past.cancelled) == ({}, 0)
    assert _evictions(db) == before
    # The node reports again: its eviction is cancelled.
    assert push(make_batch("node-q", gpus=1)).status_code == 200
    state.assessor.run_once()
    assert fresh.run_once().cancelled >= 1
    assert [node for _, node, s in _evictions(db) if s == "cancelled"][:1] == ["node-q"]
