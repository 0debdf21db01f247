"""Repeat offenders: a node evicted for hardware again within ``repeat_offender_days`` of its
return is marked (``repeat_of``), alerted (``node:<name>:repeat_offender``), listed in the weekly
report, and drained first when the budget is short. Planner passes run with injected clocks."""

from __future__ import annotations

import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select
from tests.conftest import bearer
from tests.factories import make_batch, make_validation
from tests.unit.server.conftest import Push
from tests.unit.server.routers.test_risk_api import _xid_batch

from fleetwatch.config import ServerSettings
from fleetwatch.reports.weekly import _repeat_offenders
from fleetwatch.server.act.planner import EvictionPlanner, PlanResult
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import evictions
from fleetwatch.server.tell.conditions import derive_conditions


def _pass(client: TestClient, **overrides: Any) -> PlanResult:
    state = client.app.state  # type: ignore[attr-defined]
    state.assessor.run_once()
    settings: ServerSettings = state.settings.model_copy(update=overrides.pop("settings", {}))
    return EvictionPlanner(state.db, settings, state.assessor).run_once(**overrides)


def _rows(db: Database) -> list[dict[str, Any]]:
    with db.read() as conn:
        return [dict(r._mapping) for r in conn.execute(select(evictions).order_by(evictions.c.id))]


def _evict_and_return(
    client: TestClient, push: Push, tokens: dict[str, str], node: str = "node-a"
) -> int:
    """``node``: a fatal Xid, drained, validated, returned; the id of that eviction."""
    assert push(_xid_batch(node, 79)).status_code == 200
    _pass(client)
    [row] = [r for r in _rows(client.app.state.db) if r["node"] == node]  # type: ignore[attr-defined]
    sched = bearer(tokens["scheduler"])
    for step in ("ack", "complete"):
        assert client.post(f"/v1/evictions/{row['id']}/{step}", headers=sched).status_code == 200
    agent = bearer(tokens["agent"])
    validation = make_validation(node)
    assert client.post(f"/v1/nodes/{node}/validations", json=validation, headers=agent)
    assert client.post(f"/v1/nodes/{node}/return", headers=sched).status_code == 200
    return int(row["id"])


def _fails_again(push: Push, node: str = "node-a") -> None:
    time.sleep(0.05)  # the new Xid is newer than the return
    assert push(_xid_batch(node, 79, minutes_ago=0)).status_code == 200
    time.sleep(0.05)
    later = make_batch(node, gpus=2, ticks=1, interval_s=3600.0, start=utcnow())
    assert push(later).status_code == 200


def test_a_node_failing_again_soon_after_its_return_is_marked_and_alerted(
    client: TestClient, push: Push, db: Database, tokens: dict[str, str]
) -> None:
    first = _evict_and_return(client, push, tokens)
    _fails_again(push)
    now = utcnow() + timedelta(hours=2)  # past the cooldown after the return
    assert _pass(client, now=now).created == {"pending": 1}
    again = _rows(db)[-1]
    assert again["repeat_of"] == first and again["reason_kind"] == "rule"
    api = client.get(f"/v1/evictions/{again['id']}", headers=bearer(tokens["read"])).json()
    assert api["repeat_of"] == first
    assert api["audit"][0]["detail"]["repeat_of"] == first
    settings: ServerSettings = client.app.state.settings  # type: ignore[attr-defined]
    with db.read() as conn:
        found = derive_conditions(conn, None, now=now, settings=settings)
    alert = found["node:node-a:repeat_offender"]
    assert (alert.kind, alert.severity, alert.node) == ("repeat_offender", "warning", "node-a")
    assert alert.evidence["repeat_of"] == first and alert.evidence["eviction_id"] == again["id"]
    assert 0 <= alert.evidence["days_in_service"] < 1
    # Once it returns again, the alert resolves.
    with db.write() as conn:
        conn.execute(
            evictions.update().where(evictions.c.id == again["id"]).values(state="returned")
        )
    with db.read() as conn:
        assert "node:node-a:repeat_offender" not in derive_conditions(
            conn, None, now=now, settings=settings
        )


def test_no_mark_when_the_window_is_off(
    client: TestClient, push: Push, db: Database, tokens: dict[str, str]
) -> None:
    _evict_and_return(client, push, tokens)
    _fails_again(push)
    now = utcnow() + timedelta(hours=2)
    assert _pass(client, now=now, settings={"repeat_offender_days": 0}).created == {"pending": 1}
    assert _rows(db)[-1]["repeat_of"] is None


def test_no_mark_past_the_window(
    client: TestClient, push: Push, db: Database, tokens: dict[str, str]
) -> None:
    """The return was 2 hours before the new eviction; a window of an hour does not reach it."""
    _evict_and_return(client, push, tokens)
    _fails_again(push)
    now = utcnow() + timedelta(hours=2)
    window = {"repeat_offender_days": 1 / 24}
    assert _pass(client, now=now, settings=window).created == {"pending": 1}
    assert _rows(db)[-1]["repeat_of"] is None


def test_weekly_report_lists_the_weeks_repeat_offenders() -> None:
    start = utcnow() - timedelta(days=3)
    row = SimpleNamespace(
        id=9, node="node-a", repeat_of=4, created_at=start + timedelta(days=1),
        reason_kind="rule", dry_run=False,
    )  # fmt: skip
    earlier = SimpleNamespace(
        id=3, node="node-b", repeat_of=1, created_at=start - timedelta(days=2),
        reason_kind="rule", dry_run=False,
    )  # fmt: skip
    plain = SimpleNamespace(
        id=10, node="node-c", repeat_of=None, created_at=start + timedelta(days=1),
        reason_kind="risk", dry_run=False,
    )  # fmt: skip
    week = SimpleNamespace(evictions=[row, earlier, plain], start=start, end=utcnow())
    assert _repeat_offenders(week) == [  # type: ignore[arg-type]
        {
            "node": "node-a",
            "eviction_id": 9,
            "repeat_of": 4,
            "evicted_at": row.created_at.isoformat(),
            "reason_kind": "rule",
        }
    ]


def test_a_repeat_offender_drains_first_when_the_budget_is_short(
    client: TestClient, push: Push, db: Database, tokens: dict[str, str]
) -> None:
    """Two nodes, a budget of one drain: node-b (a repeat offender) drains, node-a is paged,
    although by name and saving node-a would come first."""
    ok = make_batch("node-a", gpus=2, ticks=1, interval_s=3600.0, start=utcnow())
    assert push(ok).status_code == 200
    first = _evict_and_return(client, push, tokens, node="node-b")
    _fails_again(push, node="node-b")
    _fails_again(push, node="node-a")
    now = utcnow() + timedelta(hours=2)
    assert _pass(client, now=now, settings={"drain_budget_pct": 1}).created == {
        "pending": 1,
        "paged": 1,
    }
    latest = {row["node"]: row for row in _rows(db) if row["id"] != first}
    assert (latest["node-b"]["state"], latest["node-b"]["repeat_of"]) == ("pending", first)
    assert (latest["node-a"]["state"], latest["node-a"]["repeat_of"]) == ("paged", None)
