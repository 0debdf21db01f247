"""The eviction planner: rules, risk against cost, stragglers, hysteresis, budget, dry run.

Telemetry comes in through POST /v1/ingest; assessments and planner passes are driven by hand
(the test settings turn the background loop off). Both databases.
"""

from __future__ import annotations

import math
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert, select
from tests.conftest import bearer
from tests.factories import gpu_uuid, make_batch, make_validation
from tests.unit.server.conftest import Push
from tests.unit.server.routers.test_risk_api import _store_model, _xid_batch

from fleetwatch.config import ServerSettings
from fleetwatch.rules.overrides import load_rules
from fleetwatch.server.act.planner import DrainCosts, EvictionPlanner, PlanResult, made_from
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import events, eviction_audit, evictions, stragglers
from fleetwatch.server.judge.assessor import Assessor


def _planner(client: TestClient, **overrides: Any) -> EvictionPlanner:
    """The app's planner, or one with other settings over the app's assessor and database."""
    state = client.app.state  # type: ignore[attr-defined]
    if not overrides:
        planner: EvictionPlanner = state.planner
        return planner
    settings: ServerSettings = state.settings.model_copy(update=overrides)
    return EvictionPlanner(state.db, settings, state.assessor)


def _pass(client: TestClient, planner: EvictionPlanner | None = None, **kw: Any) -> PlanResult:
    client.app.state.assessor.run_once()  # type: ignore[attr-defined]
    return (planner or _planner(client)).run_once(**kw)


def _rows(db: Database) -> list[dict[str, Any]]:
    with db.read() as conn:
        return [dict(r._mapping) for r in conn.execute(select(evictions).order_by(evictions.c.id))]


def _trail(db: Database, eviction_id: int) -> list[tuple[str | None, str, str]]:
    with db.read() as conn:
        rows = conn.execute(
            select(eviction_audit)
            .where(eviction_audit.c.eviction_id == eviction_id)
            .order_by(eviction_audit.c.id)
        )
        return [(r.from_state, r.to_state, r.actor) for r in rows]


def test_drain_costs_follow_the_formula() -> None:
    costs = DrainCosts.from_settings(ServerSettings(_env_file=None))  # type: ignore[call-arg]
    # 512 GPUs x $2.5 x (1 h / 2 + 0.25 h) and 8 GPUs x 4 h x $2.5
    assert costs.failure_usd == 960.0
    assert costs.drain_usd(8) == 80.0
    assert costs.saving(1 / 12, 8) == pytest.approx(0.0)
    assert costs.saving(0.5, 8) == 400.0


def test_planner_fatal_xid_creates_a_pending_eviction_with_evidence(
    client: TestClient, push: Push, db: Database
) -> None:
    assert push(_xid_batch("node-a", 79)).status_code == 200
    assert push(make_batch("node-b", gpus=2, ticks=3)).status_code == 200
    result = _pass(client)
    assert result.created == {"pending": 1}
    [row] = _rows(db)
    assert row["node"] == "node-a" and row["state"] == "pending" and not row["dry_run"]
    assert row["reason_kind"] == "rule" and "GPU 1" in row["reason"]
    gpu = row["evidence"]["gpus"][0]
    assert gpu["uuid"] == gpu_uuid("node-a", 1)
    assert any(79 in v["xids"] and v["severity"] in ("critical", "fatal") for v in gpu["verdicts"])
    assert row["expected_saving_usd"] == 960.0 - 2 * 4 * 2.5  # p = 1, a 2-GPU node
    assert _trail(db, row["id"]) == [(None, "pending", "planner")]


def test_planner_does_not_recreate_an_open_eviction(
    client: TestClient, push: Push, db: Database, tokens: dict[str, str]
) -> None:
    assert push(_xid_batch("node-a", 79)).status_code == 200
    _pass(client)
    assert _pass(client).created == {}
    [row] = _rows(db)
    sched = bearer(tokens["scheduler"])
    assert client.post(f"/v1/evictions/{row['id']}/ack", headers=sched).status_code == 200
    assert client.post(f"/v1/evictions/{row['id']}/complete", headers=sched).status_code == 200
    # Completed but not returned: still open, the verdict still stands, nothing new.
    assert _pass(client, now=utcnow() + timedelta(hours=2)).created == {}
    assert len(_rows(db)) == 1


def test_planner_cooldown_after_a_rejection(
    client: TestClient, push: Push, db: Database, tokens: dict[str, str]
) -> None:
    assert push(_xid_batch("node-a", 79)).status_code == 200
    _pass(client)
    [row] = _rows(db)
    response = client.post(f"/v1/evictions/{row['id']}/reject", json={"reason": "busy"},
                           headers=bearer(tokens["scheduler"]))  # fmt: skip
    assert response.status_code == 200
    assert _pass(client).created == {}
    assert _pass(client, now=utcnow() + timedelta(seconds=3500)).created == {}
    later = _pass(client, now=utcnow() + timedelta(seconds=3700))
    assert later.created == {"pending": 1}
    assert [r["state"] for r in _rows(db)] == ["rejected", "pending"]


def test_planner_after_a_return_old_evidence_does_not_drain_again(
    client: TestClient, push: Push, db: Database, tokens: dict[str, str]
) -> None:
    assert push(_xid_batch("node-a", 79)).status_code == 200
    _pass(client)
    [row] = _rows(db)
    sched = bearer(tokens["scheduler"])
    for step in ("ack", "complete"):
        assert client.post(f"/v1/evictions/{row['id']}/{step}", headers=sched).status_code == 200
    agent = bearer(tokens["agent"])
    validated = client.post("/v1/nodes/node-a/validations", json=make_validation(), headers=agent)
    assert validated.status_code == 201, validated.text
    assert client.post("/v1/nodes/node-a/return", headers=sched).status_code == 200
    # An hourly reporter from now on, so that two hours ahead the node is not unreachable.
    hourly = make_batch("node-a", gpus=2, ticks=1, interval_s=3600.0, start=utcnow())
    assert push(hourly).status_code == 200
    # Past the cooldown the Xid is still in the judging lookback, but older than the repair.
    assert _pass(client, now=utcnow() + timedelta(hours=2)).created == {}
    # A new fatal Xid after the return drains again (once the cooldown is over).
    time.sleep(0.05)
    assert push(_xid_batch("node-a", 79, minutes_ago=0)).status_code == 200
    time.sleep(0.05)  # a reading after the Xid: the node is judged as of its newest reading
    later = make_batch("node-a", gpus=2, ticks=1, interval_s=3600.0, start=utcnow())
    assert push(later).status_code == 200
    assert _pass(client, now=utcnow() + timedelta(hours=2)).created == {"pending": 1}


def test_planner_cancels_a_pending_eviction_whose_reason_cleared(
    client: TestClient, push: Push, db: Database
) -> None:
    assert push(_xid_batch("node-a", 79, minutes_ago=20)).status_code == 200
    _pass(client)
    [row] = _rows(db)
    assert row["state"] == "pending"
    # Xid 79 is cleared by a reboot (reset class): the node boots and reports again.
    assert push(make_batch("node-a", gpus=2, ticks=2, boot_id="boot-2")).status_code == 200
    result = _pass(client)
    assert result.cancelled == 1
    [row] = _rows(db)
    assert row["state"] == "cancelled"
    assert _trail(db, row["id"])[-1] == ("pending", "cancelled", "planner")


def test_planner_expired_lease_returns_the_eviction_to_pending(
    client: TestClient, push: Push, db: Database, tokens: dict[str, str]
) -> None:
    assert push(_xid_batch("node-a", 79)).status_code == 200
    _pass(client)
    [row] = _rows(db)
    ack = client.post(f"/v1/evictions/{row['id']}/ack", json={"lease_s": 60},
                      headers=bearer(tokens["scheduler"]))  # fmt: skip
    assert ack.status_code == 200
    assert _pass(client).expired == 0
    assert _pass(client, now=utcnow() + timedelta(seconds=61)).expired == 1
    [row] = _rows(db)
    assert row["state"] == "pending" and row["claimed_by"] is None
    assert _trail(db, row["id"])[-1] == ("acked", "pending", "planner")


def test_planner_dry_run_only_recommends(
    client: TestClient, push: Push, db: Database, tokens: dict[str, str]
) -> None:
    assert push(_xid_batch("node-a", 79)).status_code == 200
    planner = _planner(client, planner_dry_run=True)
    assert _pass(client, planner).created == {"recommended": 1}
    assert _pass(client, planner).created == {}
    [row] = _rows(db)
    assert row["state"] == "recommended" and row["dry_run"] is True
    response = client.post(f"/v1/evictions/{row['id']}/ack", headers=bearer(tokens["scheduler"]))
    assert response.status_code == 409 and "recommended" in response.json()["error"]
    pending = client.get("/v1/evictions", params={"state": "pending"},
                         headers=bearer(tokens["read"])).json()  # fmt: skip
    assert pending["count"] == 0


def test_planner_risk_drains_only_above_the_cost_break_even(
    client: TestClient, push: Push, db: Database
) -> None:
    _store_model(db)
    assert push(make_batch("node-a", gpus=2, ticks=3)).status_code == 200
    snap = client.app.state.assessor.run_once()  # type: ignore[attr-defined]
    members = snap.node_risks(1.0)["node-a"][1]
    p = 1.0 - math.prod(1.0 - r.model_probability for r in members)
    assert 0.0 < p < 0.5
    # Drain cost: 2 GPUs x 4 h x $2.5 = $20. A failure costs job_gpus x $2.5 x 0.75 h, so the
    # break-even job is 20 / (p x 1.875) GPUs.
    break_even = 20.0 / (p * 1.875)
    small = _planner(client, job_gpus=max(1, math.floor(break_even * 0.9)))
    for _ in range(3):
        assert _pass(client, small).created == {}
    big_gpus = math.ceil(break_even * 1.1)
    big = _planner(client, job_gpus=big_gpus)
    assert _pass(client, big).created == {}  # the first risky assessment
    assert big.run_once().created == {}  # the same assessment twice counts once
    assert _pass(client, big).created == {"pending": 1}  # second consecutive assessment
    [row] = _rows(db)
    assert row["reason_kind"] == "risk"
    evidence = row["evidence"]
    assert evidence["probability"] == pytest.approx(p, rel=1e-3)  # the GPUs aged a little
    assert evidence["break_even_probability"] == pytest.approx(20.0 / (big_gpus * 1.875))
    expected = evidence["probability"] * big_gpus * 1.875 - 20.0
    assert row["expected_saving_usd"] == pytest.approx(expected, abs=0.01)
    assert row["expected_saving_usd"] == pytest.approx(0.1 * 20.0, abs=0.05)  # 10 % over
    assert {g["uuid"] for g in evidence["gpus"]} == {gpu_uuid("node-a", i) for i in (0, 1)}
    assert all(g["factors"] for g in evidence["gpus"])


def _straggler(db: Database, node: str, *, kind: str, open_s: float, ratio: float = 1.5) -> None:
    now = utcnow()
    with db.write() as conn:
        conn.execute(insert(stragglers).values(
            job_id="job-1", node=node, kind=kind, started_at=now - timedelta(seconds=open_s),
            updated_at=now, ended_at=None, windows=7, ratio=ratio, evidence={"peers": 15},
        ))  # fmt: skip


def test_planner_drains_a_hardware_straggler_after_ten_minutes(
    client: TestClient, push: Push, db: Database
) -> None:
    for node in ("node-a", "node-b", "node-c"):
        assert push(make_batch(node, gpus=2, ticks=2)).status_code == 200
    _straggler(db, "node-a", kind="hardware", open_s=700, ratio=1.5)
    _straggler(db, "node-b", kind="hardware", open_s=120)
    _straggler(db, "node-c", kind="workload", open_s=7000)
    assert _pass(client).created == {"pending": 1}
    [row] = _rows(db)
    assert row["node"] == "node-a" and row["reason_kind"] == "straggler"
    assert row["evidence"]["ratio"] == 1.5 and row["evidence"]["windows"] == 7
    assert row["evidence"]["job_id"] == "job-1"
    # 512 GPUs x $2.5 x (1 - 1/1.5) x 24 h - 2 GPUs x 4 h x $2.5
    assert row["expected_saving_usd"] == pytest.approx(512 * 2.5 / 3 * 24 - 20, abs=0.01)


def test_planner_drain_budget_holds_under_a_fleet_wide_xid_storm(
    client: TestClient, push: Push, db: Database, tokens: dict[str, str]
) -> None:
    nodes = [f"node-{i:03d}" for i in range(100)]
    for node in nodes:
        batch = _xid_batch(node, 79)
        assert push(batch).status_code == 200
    result = _pass(client)
    assert result.budget == 5
    assert result.created == {"pending": 5, "paged": 95}
    assert result.budget_event
    states = [r["state"] for r in _rows(db)]
    assert states.count("pending") == 5 and states.count("paged") == 95
    paged = next(r for r in _rows(db) if r["state"] == "paged")
    assert "budget" in paged["detail"]
    # The storm goes on: nothing new, and still exactly one fleet event.
    for _ in range(2):
        assert _pass(client).created == {}

    def budget_events() -> list[Any]:
        with db.read() as conn:
            return conn.execute(
                select(events).where(events.c.kind == "drain_budget_exhausted")
            ).all()

    [event] = budget_events()
    assert event.node_id is None
    assert event.details["known_nodes"] == 100 and event.details["paged"] == 95
    assert event.details["draining"] == 5
    assert event.details["top_reasons"][0]["nodes"] == 95
    # Schedulers only see the five to drain.
    pending = client.get("/v1/evictions", params={"state": "pending"},
                         headers=bearer(tokens["read"])).json()  # fmt: skip
    assert pending["count"] == 5


def test_planner_drains_an_unreachable_node(client: TestClient, push: Push, db: Database) -> None:
    """A killed agent: nothing for 3 of its intervals is a rule eviction; reporting again
    cancels it while it is still pending."""
    assert push(make_batch("node-quiet", gpus=2, ticks=1, interval_s=10.0)).status_code == 200
    assert _pass(client, now=utcnow() + timedelta(seconds=20)).created == {}
    assert _pass(client, now=utcnow() + timedelta(seconds=45)).created == {"pending": 1}
    [row] = _rows(db)
    assert row["reason_kind"] == "rule" and row["reason"].startswith("node_unreachable")
    assert row["evidence"]["interval_s"] == 10.0
    assert push(make_batch("node-quiet", gpus=2, ticks=1, interval_s=10.0)).status_code == 200
    assert _pass(client).cancelled == 1


def test_a_gpu_gone_from_its_node_drains_and_alerts_with_json_evidence(
    client: TestClient, push: Push, db: Database, tokens: dict[str, str]
) -> None:
    """A health verdict's evidence holds times (gpu_missing: when the GPU was last seen): the
    eviction and the alert store it as JSON. A demo run once failed every pass on this."""
    assert push(make_batch("node-m", gpus=2, ticks=1, interval_s=0.1)).status_code == 200
    time.sleep(0.5)  # longer than 3 intervals: GPU 1 is missing while GPU 0 keeps reporting
    assert push(make_batch("node-m", gpus=1, ticks=1, interval_s=0.1)).status_code == 200
    assert _pass(client).created == {"pending": 1}
    [row] = _rows(db)
    verdict = row["evidence"]["gpus"][0]["verdicts"][0]
    assert verdict["rule"] == "gpu_missing"
    assert isinstance(verdict["evidence"]["last_seen"], str)
    state = client.app.state  # type: ignore[attr-defined]
    assert state.alerter.run_once() is not None
    firing = client.get("/v1/alerts", params={"state": "firing"},
                        headers=bearer(tokens["read"])).json()  # fmt: skip
    assert any(a["node"] == "node-m" for a in firing["data"]), firing


# --- a leader change: another process's assessor and planner on the same database -------------

Leader = tuple[Assessor, EvictionPlanner]
TAKEOVER = pytest.mark.parametrize("takeover", [False, True], ids=["one_leader", "new_leader"])


def _leader(client: TestClient, **overrides: Any) -> Leader:
    """What a freshly started process would plan with: its own assessor, nothing in memory."""
    state = client.app.state  # type: ignore[attr-defined]
    settings: ServerSettings = state.settings.model_copy(update=overrides)
    catalog, thresholds = load_rules(settings.rules_file)
    assessor = Assessor(state.db, settings, catalog, thresholds)
    return assessor, EvictionPlanner(state.db, settings, assessor)


def _assess_and_plan(leader: Leader) -> PlanResult:
    leader[0].run_once()
    return leader[1].run_once()


def _budget_events(db: Database) -> list[Any]:
    with db.read() as conn:
        return conn.execute(select(events).where(events.c.kind == "drain_budget_exhausted")).all()


@TAKEOVER
def test_planner_risk_streak_continues_on_a_new_leader(
    client: TestClient, push: Push, db: Database, takeover: bool
) -> None:
    _store_model(db)
    assert push(make_batch("node-a", gpus=2, ticks=3)).status_code == 200
    snap = client.app.state.assessor.run_once()  # type: ignore[attr-defined]
    p = 1.0 - math.prod(1.0 - r.model_probability for r in snap.node_risks(1.0)["node-a"][1])
    job_gpus = math.ceil(20.0 / (p * 1.875) * 2)  # twice the break-even job (see above)
    first = _leader(client, job_gpus=job_gpus)
    assert _assess_and_plan(first).created == {}  # one risky assessment: not yet
    second = _leader(client, job_gpus=job_gpus) if takeover else first
    assert _assess_and_plan(second).created == {"pending": 1}  # the second, whoever counts it
    [row] = _rows(db)
    assert row["node"] == "node-a" and row["reason_kind"] == "risk"


@TAKEOVER
def test_planner_budget_episode_continues_on_a_new_leader(
    client: TestClient, push: Push, db: Database, tokens: dict[str, str], takeover: bool
) -> None:
    """20 nodes with a fatal Xid: a budget of 1, 19 paged, one event. A person rejects the 19;
    with no cooldown the next pass pages them again: the same episode, so no second event."""
    for i in range(20):
        assert push(_xid_batch(f"node-{i:02d}", 79)).status_code == 200
    first = _leader(client, eviction_cooldown_s=0)
    result = _assess_and_plan(first)
    assert result.budget == 1 and result.created == {"pending": 1, "paged": 19}
    assert result.budget_event
    for row in _rows(db):
        if row["state"] == "paged":
            rejected = client.post(f"/v1/evictions/{row['id']}/reject", json={"reason": "not now"},
                                   headers=bearer(tokens["scheduler"]))  # fmt: skip
            assert rejected.status_code == 200, rejected.text
    second = _leader(client, eviction_cooldown_s=0) if takeover else first
    again = _assess_and_plan(second)
    assert again.created == {"paged": 19} and not again.budget_event
    assert len(_budget_events(db)) == 1


def test_planner_a_stale_snapshot_does_not_cancel_what_it_has_not_seen(
    client: TestClient, push: Push, db: Database
) -> None:
    """A standby assessed node-a healthy; then a fatal Xid came and the leader drained node-a.
    Taking over before its next assessment, the standby must not cancel that eviction."""
    assert push(make_batch("node-a", gpus=2, ticks=3)).status_code == 200
    standby = _leader(client)
    standby[0].run_once()
    assert push(_xid_batch("node-a", 79, minutes_ago=0)).status_code == 200
    assert _pass(client).created == {"pending": 1}  # the leader, on a fresh assessment
    assert standby[1].run_once().cancelled == 0  # the standby's older snapshot: no Xid in it
    [row] = _rows(db)
    assert row["state"] == "pending"
    assert made_from(_row_of(db, row["id"])) > standby[0].current().at
    assert _assess_and_plan(standby).created == {}  # fresh: the Xid is there, nothing new
    assert [r["state"] for r in _rows(db)] == ["pending"]


def _row_of(db: Database, eviction_id: int) -> Any:
    with db.read() as conn:
        return conn.execute(select(evictions).where(evictions.c.id == eviction_id)).one()


def test_made_from_falls_back_to_creation_and_ignores_database_reasons(
    client: TestClient, push: Push, db: Database
) -> None:
    assert push(_xid_batch("node-a", 79)).status_code == 200
    snap = client.app.state.assessor.run_once()  # type: ignore[attr-defined]
    _planner(client).run_once()
    row = _row_of(db, _rows(db)[0]["id"])
    assert made_from(row) == snap.at  # the assessment the eviction was made from

    def like(**changes: Any) -> Any:
        return SimpleNamespace(**{**row._mapping, **changes})

    older = like(evidence={k: v for k, v in row.evidence.items() if k != "assessed_at"})
    assert made_from(older) == row.created_at  # made before evidence carried assessed_at
    assert made_from(like(reason_kind="straggler")) is None  # read at each pass
    assert made_from(like(reason="node_unreachable: no report for 40 s")) is None
