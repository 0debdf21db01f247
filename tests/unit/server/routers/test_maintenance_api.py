"""Maintenance windows over the API: opening, listing, ending, validation, and how nodes read
while one covers them (``/v1/nodes``, the fleet page, ``/metrics``). Both databases; time moves by
the app's injected clock, never by sleeping."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update
from tests.conftest import bearer
from tests.factories import make_batch
from tests.unit.server.concepts.test_liveness_readers import SteppedClock
from tests.unit.server.conftest import Push

from fleetwatch.config import ServerSettings
from fleetwatch.server.app import create_app
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import maintenance_windows, nodes
from fleetwatch.server.repo.maintenance import (
    create_window,
    end_window,
    maintenance_intervals,
    nodes_in_maintenance,
)
from fleetwatch.server.schemas.maintenance import MaintenanceCreate

INTERVAL_S = 10.0  # make_batch's; unreachable after 3 of them


def _stored(db: Database) -> int:
    with db.read() as conn:
        return int(conn.execute(select(func.count()).select_from(maintenance_windows)).scalar_one())


def test_maintenance_window_opens_lists_and_ends_with_who_and_when(
    client: TestClient, tokens: dict[str, str]
) -> None:
    sched = bearer(tokens["scheduler"])
    made = client.post(
        "/v1/maintenance",
        json={"nodes": ["node-b", "node-a", "node-a"], "reason": "BIOS update"},
        headers=sched,
    )
    assert made.status_code == 201, made.text
    window = made.json()
    assert window["state"] == "active" and window["ends_at"] is None
    assert window["nodes"] == ["node-a", "node-b"] and window["covered"] == ["node-a", "node-b"]
    assert window["created_by"] == "test-scheduler" and window["ended_at"] is None

    read = bearer(tokens["read"])
    listed = client.get("/v1/maintenance", params={"state": "active"}, headers=read).json()
    assert [w["id"] for w in listed["data"]] == [window["id"]]
    by_node = client.get("/v1/maintenance", params={"node": "node-b"}, headers=read).json()
    assert by_node["count"] == 1
    assert client.get("/v1/maintenance", params={"node": "node-c"}, headers=read).json() == {
        "count": 0,
        "data": [],
    }
    assert client.get(f"/v1/maintenance/{window['id']}", headers=read).json() == window

    admin = bearer(tokens["admin"])
    ended = client.delete(f"/v1/maintenance/{window['id']}", headers=admin)
    assert ended.status_code == 200, ended.text
    assert ended.json()["state"] == "ended" and ended.json()["ended_by"] == "test-admin"
    again = client.delete(f"/v1/maintenance/{window['id']}", headers=admin)
    assert again.status_code == 409 and "ended already" in again.json()["error"]
    assert client.delete("/v1/maintenance/999", headers=admin).status_code == 404


def test_maintenance_window_ended_before_it_begins_is_cancelled(
    client: TestClient, tokens: dict[str, str]
) -> None:
    sched = bearer(tokens["scheduler"])
    start = utcnow() + timedelta(days=1)
    body = {
        "selector": "rack=r12",
        "starts_at": start.isoformat(),
        "ends_at": (start + timedelta(hours=4)).isoformat(),
        "reason": "PDU swap",
    }
    window = client.post("/v1/maintenance", json=body, headers=sched).json()
    assert window["state"] == "upcoming" and window["selector"] == {"rack": "r12"}
    cancelled = client.delete(f"/v1/maintenance/{window['id']}", headers=sched).json()
    assert cancelled["state"] == "cancelled"


def test_maintenance_key_is_open_once(client: TestClient, tokens: dict[str, str]) -> None:
    sched = bearer(tokens["scheduler"])
    body = {"nodes": ["n1"], "reason": "r", "key": "slurm:maint1"}
    first = client.post("/v1/maintenance", json=body, headers=sched)
    assert first.status_code == 201
    second = client.post("/v1/maintenance", json=body, headers=sched)
    assert second.status_code == 409 and "slurm:maint1" in second.json()["error"]
    client.delete(f"/v1/maintenance/{first.json()['id']}", headers=sched)
    assert client.post("/v1/maintenance", json=body, headers=sched).status_code == 201


_NOW = "2026-12-01T10:00:00Z"
BAD_BODIES: list[tuple[str, dict[str, Any], list[Any]]] = [
    ("both", {"nodes": ["n1"], "selector": "rack=r1", "reason": "x"}, ["body", "nodes"]),
    ("neither", {"reason": "x"}, ["body", "nodes"]),
    ("empty nodes", {"nodes": [], "reason": "x"}, ["body", "nodes"]),
    ("bad node", {"nodes": ["gpu[01-04]"], "reason": "x"}, ["body", "nodes", 0]),
    ("no equals", {"selector": "rack", "reason": "x"}, ["body", "selector"]),
    ("empty value", {"selector": "rack=", "reason": "x"}, ["body", "selector"]),
    ("bad label", {"selector": "ra ck=r1", "reason": "x"}, ["body", "selector"]),
    ("twice", {"selector": "rack=r1,rack=r2", "reason": "x"}, ["body", "selector"]),
    (
        "end before start",
        {"nodes": ["n1"], "reason": "x", "starts_at": _NOW, "ends_at": "2026-12-01T09:00:00Z"},
        ["body", "ends_at"],
    ),
    (
        "end equals start",
        {"nodes": ["n1"], "reason": "x", "starts_at": _NOW, "ends_at": _NOW},
        ["body", "ends_at"],
    ),  # fmt: skip
    (
        "naive time",
        {"nodes": ["n1"], "reason": "x", "ends_at": "2030-01-01T00:00:00"},
        ["body", "ends_at"],
    ),  # fmt: skip
    ("no reason", {"nodes": ["n1"]}, ["body", "reason"]),
    ("blank reason", {"nodes": ["n1"], "reason": "   "}, ["body", "reason"]),
    ("long reason", {"nodes": ["n1"], "reason": "x" * 501}, ["body", "reason"]),
    ("NUL reason", {"nodes": ["n1"], "reason": "a\x00b"}, ["body", "reason"]),
    ("unknown field", {"nodes": ["n1"], "reason": "x", "until": "ended"}, ["body", "until"]),
]


@pytest.mark.parametrize(("case", "body", "loc"), BAD_BODIES, ids=[c for c, _, _ in BAD_BODIES])
def test_maintenance_bad_body_is_a_422_naming_the_field_and_stores_nothing(
    client: TestClient, db: Database, tokens: dict[str, str], case: str, body: Any, loc: list[Any]
) -> None:
    response = client.post("/v1/maintenance", json=body, headers=bearer(tokens["scheduler"]))
    assert response.status_code == 422, (case, response.text)
    assert loc in [d["loc"] for d in response.json()["detail"]], response.json()
    assert _stored(db) == 0


def test_maintenance_read_token_may_not_open_or_end(
    client: TestClient, tokens: dict[str, str]
) -> None:
    body = {"nodes": ["n1"], "reason": "x"}
    refused = client.post("/v1/maintenance", json=body, headers=bearer(tokens["read"]))
    assert refused.status_code == 403
    made = client.post("/v1/maintenance", json=body, headers=bearer(tokens["admin"])).json()
    gone = client.delete(f"/v1/maintenance/{made['id']}", headers=bearer(tokens["read"]))
    assert gone.status_code == 403
    agent = client.get("/v1/maintenance", headers=bearer(tokens["agent"]))
    assert agent.status_code == 403


def test_maintenance_intervals_clip_merge_and_follow_selectors(
    client: TestClient, db: Database, push: Push
) -> None:
    assert push(make_batch("node-a", gpus=1)).status_code == 200
    batch = make_batch("node-r", gpus=1)
    batch["node"]["labels"] = {"rack": "r12", "cluster": "c"}
    assert push(batch).status_code == 200
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    with db.write() as conn:

        def open_(start: float, end: float | None, **kw: Any) -> int:
            body = MaintenanceCreate(
                starts_at=t0 + timedelta(hours=start),
                ends_at=t0 + timedelta(hours=end) if end is not None else None,
                reason="r",
                **kw,
            )
            return create_window(conn, body, actor="t", now=t0).id

        open_(1, 3, nodes=["node-a"])
        open_(2, 5, nodes=["node-a"])  # overlaps: merged
        open_(-5, 0.5, nodes=["node-a"])  # begins before the period: clipped
        open_(10, None, selector="rack=r12")  # until ended: clipped at until
        early = open_(20, 30, nodes=["node-a"])
        end_window(conn, early, actor="t", now=t0 + timedelta(hours=22))  # ended early
        cancelled = open_(40, 41, nodes=["node-a"])
        end_window(conn, cancelled, actor="t", now=t0)  # called off: never counts

    with db.read() as conn:
        spans = maintenance_intervals(conn, t0, t0 + timedelta(hours=48))
        assert nodes_in_maintenance(conn, t0 + timedelta(hours=12)) == {"node-r"}
        assert nodes_in_maintenance(conn, t0 + timedelta(hours=4)) == {"node-a"}
        assert nodes_in_maintenance(conn, t0 + timedelta(hours=40, minutes=30)) == {"node-r"}
    h = lambda n: t0 + timedelta(hours=n)  # noqa: E731
    assert spans == {
        "node-a": [(h(0), h(0.5)), (h(1), h(5)), (h(20), h(22))],
        "node-r": [(h(10), h(48))],
    }


def _nodes(client: TestClient, token: str) -> dict[str, dict[str, Any]]:
    listed = client.get("/v1/nodes", headers=bearer(token)).json()["data"]
    return {node["name"]: node for node in listed}


def test_nodes_page_and_metrics_show_maintenance_and_silence_counts_from_its_end(
    client: TestClient, db: Database, push: Push, settings: ServerSettings, tokens: dict[str, str]
) -> None:
    for name in ("node-a", "node-b"):
        assert push(make_batch(name, gpus=1)).status_code == 200
    rack = make_batch("node-r", gpus=1)
    rack["node"]["labels"] = {"rack": "r12"}
    assert push(rack).status_code == 200
    seen = utcnow()
    with db.write() as conn:
        conn.execute(update(nodes).values(last_seen=seen))
    clock = SteppedClock(seen)
    read, sched = bearer(tokens["read"]), bearer(tokens["scheduler"])
    with TestClient(create_app(settings, clock=clock)) as fresh:
        named = fresh.post(
            "/v1/maintenance", json={"nodes": ["node-a"], "reason": "reseat GPU 3"}, headers=sched
        ).json()
        by_rack = fresh.post(
            "/v1/maintenance", json={"selector": "rack=r12", "reason": "PDU"}, headers=sched
        ).json()
        assert by_rack["covered"] == ["node-r"]

        clock.now = seen + timedelta(minutes=10)  # everyone silent for 60 intervals
        found = _nodes(fresh, tokens["read"])
        assert {n: found[n]["state"] for n in found} == {
            "node-a": "maintenance",
            "node-b": "unreachable",
            "node-r": "maintenance",
        }
        assert found["node-a"]["maintenance"]["id"] == named["id"]
        assert found["node-a"]["maintenance"]["reason"] == "reseat GPU 3"
        assert found["node-b"]["maintenance"] is None
        detail = fresh.get("/v1/nodes/node-r", headers=read).json()
        assert detail["state"] == "maintenance" and detail["maintenance"]["id"] == by_rack["id"]
        only = fresh.get("/v1/nodes", params={"state": "maintenance"}, headers=read).json()
        assert [n["name"] for n in only["data"]] == ["node-a", "node-r"]
        metrics = fresh.get("/metrics", headers=read).text
        assert 'fleetwatch_nodes{state="maintenance"} 2' in metrics
        assert 'fleetwatch_node_up{node="node-b"} 0' in metrics
        assert 'fleetwatch_node_up{node="node-a"}' not in metrics  # no rule fires on it
        page = fresh.get("/", headers=read).text
        assert re.search(r'<b class="muted">2</b>nodes in maintenance', page)
        assert (
            f'<a class="node" href="/nodes/node-a">node-a</a> (window {named["id"]}: '
            "reseat GPU 3)" in page
        )

        fresh.delete(f"/v1/maintenance/{named['id']}", headers=sched)
        clock.now += timedelta(seconds=3 * INTERVAL_S - 1)  # within its intervals since the end
        assert _nodes(fresh, tokens["read"])["node-a"]["state"] == "unheard"
        assert 'fleetwatch_node_up{node="node-a"}' not in fresh.get("/metrics", headers=read).text
        clock.now += timedelta(seconds=2)
        assert _nodes(fresh, tokens["read"])["node-a"]["state"] == "unreachable"
        assert 'fleetwatch_node_up{node="node-a"} 0' in fresh.get("/metrics", headers=read).text
