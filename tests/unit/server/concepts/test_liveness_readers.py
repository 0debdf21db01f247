"""After a restart, /v1/nodes, the fleet page and /metrics read node state as the alerter does.

A fresh app over a database whose nodes were last seen an hour ago (the server was down that long)
calls none of them unreachable until their intervals have passed since its start; in the grace
they are *unheard*. Time moves by the app's injected clock, never by sleeping.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from fastapi.testclient import TestClient
from sqlalchemy import update
from tests.conftest import bearer
from tests.factories import make_batch
from tests.unit.server.conftest import Push

from fleetwatch.config import ServerSettings
from fleetwatch.server.app import create_app
from fleetwatch.server.concepts.liveness import Liveness
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import nodes

INTERVAL_S = 10.0  # make_batch's interval; unreachable after 3 of them (the default)


class SteppedClock:
    """UTC now, moved by the test."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


def test_liveness_reads_up_unheard_and_unreachable() -> None:
    seen = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)
    started = seen + timedelta(minutes=10)
    liveness = Liveness(3.0, heard_since=started)
    assert liveness.state(seen, INTERVAL_S, seen + timedelta(seconds=29)) == "up"
    assert liveness.state(seen, INTERVAL_S, started + timedelta(seconds=5)) == "unheard"
    assert liveness.state(seen, INTERVAL_S, started + timedelta(seconds=31)) == "unreachable"
    # A process that has listened all along (no start to count from) has no unheard nodes.
    assert Liveness(3.0).state(seen, INTERVAL_S, started) == "unreachable"


def _states(client: TestClient, token: str) -> dict[str, str]:
    listed = client.get("/v1/nodes", headers=bearer(token)).json()["data"]
    return {node["name"]: node["state"] for node in listed}


def _metric_lines(client: TestClient, token: str) -> set[str]:
    text = client.get("/metrics", headers=bearer(token)).text
    return {line for line in text.splitlines() if line.startswith("fleetwatch_node")}


def test_a_restarted_process_calls_no_node_unreachable_before_its_intervals_since_the_start(
    client: TestClient, db: Database, push: Push, settings: ServerSettings, tokens: dict[str, str]
) -> None:
    assert push(make_batch("node-a", gpus=1)).status_code == 200
    assert push(make_batch("node-b", gpus=1, interval_s=3600.0)).status_code == 200
    started = utcnow()
    with db.write() as conn:  # both last reported an hour before the restart
        conn.execute(update(nodes).values(last_seen=started - timedelta(hours=1)))
    clock = SteppedClock(started)
    read = tokens["read"]
    with TestClient(create_app(settings, clock=clock)) as fresh:
        state = fresh.app.state  # type: ignore[attr-defined]
        # One start for every judge of this process.
        assert state.liveness.heard_since == started
        assert state.alerter.heard_since == state.planner.heard_since == started
        state.assessor.run_once()

        clock.now = started + timedelta(seconds=5)
        # node-b's three intervals (3 h) have not passed even by its last batch: up.
        assert _states(fresh, read) == {"node-a": "unheard", "node-b": "up"}
        assert fresh.get("/v1/nodes/node-a", headers=bearer(read)).json()["state"] == "unheard"
        unheard = fresh.get("/v1/nodes", params={"state": "unheard"}, headers=bearer(read))
        assert [n["name"] for n in unheard.json()["data"]] == ["node-a"]
        lines = _metric_lines(fresh, read)
        assert not any(line.startswith('fleetwatch_node_up{node="node-a"}') for line in lines)
        assert 'fleetwatch_node_up{node="node-b"} 1' in lines
        assert {
            'fleetwatch_nodes{state="unheard"} 1',
            'fleetwatch_nodes{state="unreachable"} 0',
            'fleetwatch_nodes{state="up"} 1',
        } <= lines
        page = fresh.get("/", headers=bearer(read)).text
        assert re.search(r'<b class="muted">0</b>nodes unreachable', page)
        assert re.search(r'<b class="warn">1</b>nodes not heard since the server started', page)
        assert (
            'not heard since the server started:</span> <a class="node" href="/nodes/node-a">'
            "node-a</a>" in page
        )
        assert state.alerter.run_once(clock.now).fired == 0  # and the alerter agrees

        clock.now = started + timedelta(seconds=3 * INTERVAL_S + 1)
        assert _states(fresh, read) == {"node-a": "unreachable", "node-b": "up"}
        lines = _metric_lines(fresh, read)
        assert 'fleetwatch_node_up{node="node-a"} 0' in lines
        assert {
            'fleetwatch_nodes{state="unheard"} 0',
            'fleetwatch_nodes{state="unreachable"} 1',
        } <= lines
        page = fresh.get("/", headers=bearer(read)).text
        assert re.search(r'<b class="bad">1</b>nodes unreachable', page)
        assert "nodes not heard since the server started" not in page
        assert state.alerter.run_once(clock.now).fired == 1  # node-a's unreachable alert
