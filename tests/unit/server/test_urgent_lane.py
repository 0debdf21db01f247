"""The urgent lane: a targeted pass over the nodes of urgent events judges them exactly as the
whole-fleet pass would, patches the newest snapshot, plans for those nodes under the same budget
and dedup, and leaves the rest (and the fleet's windows) to the next whole-fleet pass. Both
databases; the NOTIFY payload on PostgreSQL."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from sqlalchemy import insert, select
from tests.conftest import bearer
from tests.factories import gpu_uuid, make_batch
from tests.faults.waiting import wait_for
from tests.unit.server.act.test_planner import _budget_events
from tests.unit.server.conftest import Push
from tests.unit.server.judge.test_incremental_assessment import MINUTES, START, _push_minutes
from tests.unit.server.routers.test_risk_api import _xid_batch

from fleetwatch.config import ServerSettings
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.rules.xid_catalog import XidCatalog
from fleetwatch.server import background as registry_module
from fleetwatch.server.act.planner import EvictionPlanner, PlannerState
from fleetwatch.server.background import BackgroundJobs
from fleetwatch.server.db.secret_box import SecretBox
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.db.tables import (
    alerts,
    eviction_audit,
    evictions,
    job_notices,
    webhook_outbox,
    webhook_subscriptions,
)
from fleetwatch.server.judge import assessor as assessor_module
from fleetwatch.server.judge.assessment import FleetAssessment, GpuAssessment
from fleetwatch.server.judge.assessor import Assessor
from fleetwatch.server.judge.judging import FleetJudge
from fleetwatch.server.runtime.leader import (
    MAX_PAYLOAD_BYTES,
    WAKE_CHANNEL,
    notify_wake,
    parse_wake,
    wake_payload,
)
from fleetwatch.server.runtime.metric_families import ServerMetrics
from fleetwatch.server.runtime.urgent import UrgentNodes
from fleetwatch.server.tell.alerting import Alerter


def _assessor(db: Database, settings: ServerSettings) -> Assessor:
    return Assessor(db, settings, XidCatalog.load(), HealthThresholds())


def _judged(snapshot: FleetAssessment, nodes: set[str] | None = None) -> dict[str, Any]:
    return {
        g.uuid: (g.node, g.index, g.age_days, g.features, g.verdicts)
        for g in snapshot.gpus
        if nodes is None or g.node in nodes
    }


def _rules(snapshot: FleetAssessment, node: str) -> set[str]:
    return {v.rule for g in snapshot.gpus if g.node == node for v in g.verdicts}


def _lost(node: str, index: int, at: datetime) -> dict[str, Any]:
    batch = make_batch(node, gpus=2, ticks=1, start=at, interval_s=30.0)
    batch["events"] = [
        {"kind": "gpu_lost", "ts": at.isoformat(), "uuid": gpu_uuid(node, index),
         "message": "GPU has fallen off the bus"}
    ]  # fmt: skip
    return batch


def test_targeted_judgement_equals_the_full_one_and_leaves_the_rest(
    push: Push, db: Database, settings: ServerSettings
) -> None:
    """Two assessors with the same history of whole-fleet passes: one judges node-b and node-c
    (thinned windows, a reboot) alone, the other the whole fleet. Their verdicts on those nodes
    are equal, evidence included; node-d's new fatal Xid waits for the next whole-fleet pass,
    after which both assessors agree on every GPU."""
    targeted, full = _assessor(db, settings), _assessor(db, settings)
    last = MINUTES - 3
    for first in range(0, last, 3):
        for node in ("node-a", "node-b", "node-d"):
            _push_minutes(push, node, 30.0, first, first + 3)
        _push_minutes(push, "node-c", 10.0, first, first + 3)
        for assessor in (targeted, full):
            assessor.run_once(now=START + timedelta(minutes=first + 3))
    before = targeted.latest
    assert before is not None
    for node in ("node-a", "node-b", "node-d"):
        _push_minutes(push, node, 30.0, last, MINUTES)
    _push_minutes(push, "node-c", 10.0, last, MINUTES - 0.5)
    _push_minutes(push, "node-c", 10.0, MINUTES - 0.5, MINUTES, boot="boot-2")
    assert push(_lost("node-d", 0, START + timedelta(minutes=MINUTES - 1))).status_code == 200
    assert push(_lost("node-e", 1, START + timedelta(minutes=MINUTES - 1))).status_code == 200
    now = START + timedelta(minutes=MINUTES, seconds=5)
    names = {"node-b", "node-c", "node-e"}  # node-e: new since the last whole-fleet pass

    patched = targeted.run_nodes(names, now=now)
    whole = full.run_once(now=now)

    assert _judged(patched, names) == _judged(whole, names)
    assert _rules(patched, "node-b") == {"persistent_throttle", "xid79_off_bus"}
    assert _rules(patched, "node-e") == {"gpu_lost"}
    # The others are the earlier snapshot's, unchanged; node-d's loss is not judged yet.
    assert _judged(patched, {"node-a", "node-d"}) == _judged(before, {"node-a", "node-d"})
    assert "gpu_lost" not in _rules(patched, "node-d")
    assert "gpu_lost" in _rules(whole, "node-d")
    assert targeted.latest is patched
    assert patched.at == now and patched.whole_at == before.at
    assert patched.judged_at("node-b") == now and patched.judged_at("node-a") == before.at
    # The order stays the whole-fleet pass's: by node, then index.
    assert [(g.node, g.index) for g in patched.gpus] == [(g.node, g.index) for g in whole.gpus]

    later = now + timedelta(seconds=30)
    assert _judged(targeted.run_once(now=later)) == _judged(full.run_once(now=later))
    assert targeted.latest is not None and targeted.latest.fleet_at is None


def test_patched_snapshot_drops_a_gpu_gone_and_adds_a_new_node() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    base = FleetAssessment(at, [_gpu("a", 0), _gpu("b", 0), _gpu("b", 1), _gpu("c", 0)], None, None)
    later = at + timedelta(seconds=5)
    patched = base.patched(later, {"b", "z"}, [_gpu("b", 1), _gpu("z", 0)])
    assert [(g.node, g.index) for g in patched.gpus] == [("a", 0), ("b", 1), ("c", 0), ("z", 0)]
    assert patched.gpus[0] is base.gpus[0] and patched.gpus[2] is base.gpus[3]
    again = patched.patched(later + timedelta(seconds=1), {"c"}, [])
    assert [g.node for g in again.gpus] == ["a", "b", "z"]  # a node with no GPU left
    assert again.whole_at == at and again.judged_at("b") == later
    assert again.judged_at("c") == later + timedelta(seconds=1)


def _gpu(node: str, index: int) -> GpuAssessment:
    at = datetime(2025, 1, 1, tzinfo=UTC)
    return GpuAssessment(f"{node}-{index}", node, index, None, None, at, 1.0, {}, ())


def _evicted(db: Database) -> dict[str, str]:
    with db.read() as conn:
        rows = conn.execute(select(evictions.c.node, evictions.c.state)).all()
    return {row.node: row.state for row in rows}


def test_planner_for_nodes_evicts_them_only_once_and_keeps_the_budget(
    client: TestClient, push: Push, db: Database
) -> None:
    state = client.app.state  # type: ignore[attr-defined]
    assessor: Assessor = state.assessor
    planner: EvictionPlanner = state.planner
    healthy = [f"node-{i:03d}" for i in range(100)]
    for node in healthy:
        assert push(make_batch(node, gpus=2, ticks=1)).status_code == 200
    assessor.run_once()
    for node in healthy:  # an Xid storm, each node woken on its own
        assert push(_xid_batch(node, 79)).status_code == 200
    for node in healthy[:10]:
        assessor.run_nodes({node})
        result = planner.run_for({node})
        assert result.budget == 5
    evicted = _evicted(db)
    assert sorted(evicted) == healthy[:10]
    assert list(evicted.values()).count("pending") == 5  # the budget: 5 of 100 nodes
    assert list(evicted.values()).count("paged") == 5
    # Again: nothing new (one eviction per node), the storm still one budget event.
    assessor.run_nodes(set(healthy[:10]))
    assert planner.run_for(set(healthy[:10])).created == {}
    with db.read() as conn:
        audit = conn.execute(select(eviction_audit.c.actor, eviction_audit.c.to_state)).all()
    assert len(audit) == 10 and {a.actor for a in audit} == {"planner"}
    # The whole-fleet pass finds the other 90 nodes' Xids; all paged, the episode still one.
    assessor.run_once()
    assert planner.run_once().created == {"paged": 90}
    assert list(_evicted(db).values()).count("pending") == 5
    assert len(_budget_events(db)) == 1


def test_a_targeted_snapshot_does_not_count_as_a_risk_assessment(
    client: TestClient, push: Push
) -> None:
    """Risk streaks count whole-fleet assessments: patching node-x in does not make the
    snapshot a new one for every other node."""
    state = client.app.state  # type: ignore[attr-defined]
    assessor: Assessor = state.assessor
    assert push(make_batch("node-x", gpus=2, ticks=1)).status_code == 200
    first = assessor.run_once()
    patched = assessor.run_nodes({"node-x"})
    assert patched.whole_at == first.at < patched.at
    state.planner.run_once()
    with state.db.read() as conn:
        assert PlannerState.load(conn).assessed_at == first.at


def _xid79_on_both_nodes(push: Push, assessor: Assessor) -> None:
    """node-x and node-y assessed whole, then an Xid 79 on each judged by a targeted pass."""
    for node in ("node-x", "node-y"):
        assert push(make_batch(node, gpus=2, ticks=1)).status_code == 200
    assessor.run_once()
    for node in ("node-x", "node-y"):
        assert push(_xid_batch(node, 79)).status_code == 200
    assessor.run_nodes({"node-x", "node-y"})


def test_alerts_resolve_only_what_the_patched_snapshot_judged_anew(
    client: TestClient, push: Push, db: Database
) -> None:
    """An alert of a node the targeted pass did not judge, last seen after the whole-fleet pass
    the snapshot was built on, stays firing even when the snapshot no longer shows it; the
    targeted node's own cleared alert resolves."""
    state = client.app.state  # type: ignore[attr-defined]
    assessor: Assessor = state.assessor
    _xid79_on_both_nodes(push, assessor)
    alerter = Alerter(db, state.settings, lambda: assessor.latest)
    assert alerter.run_once().fired == 2  # one per node: Xid 79 on GPU 1
    # Another process's newer view: both alerts' conditions gone from a snapshot patched for
    # node-x only (node-y's GPUs as of the older whole-fleet pass, without the Xid).
    base = assessor.latest
    assert base is not None
    cleared = [g for g in base.gpus if g.node == "node-x"]
    cleared = [replace(g, verdicts=()) for g in cleared]
    old = FleetAssessment(
        base.whole_at - timedelta(seconds=1),
        [replace(g, verdicts=()) for g in base.gpus],
        None,
        None,
    )
    view = old.patched(datetime.now(UTC) + timedelta(seconds=1), {"node-x"}, cleared)
    result = Alerter(db, state.settings, lambda: view).run_once()
    assert result.resolved == 1
    with db.read() as conn:
        rows = conn.execute(select(alerts.c.node, alerts.c.state)).all()
    assert {(r.node, r.state) for r in rows} == {("node-x", "resolved"), ("node-y", "firing")}


def test_targeted_alerts_fire_for_their_nodes_only_and_never_resolve(
    client: TestClient, push: Push, db: Database
) -> None:
    """The urgent lane's alerts (``Alerter.run_for``) fire for the named nodes' verdicts and
    queue their pages, count a repeat as one alert, and leave every other node alone: no alert
    for another node's verdict, no resolve of a firing alert whose condition is gone."""
    state = client.app.state  # type: ignore[attr-defined]
    assessor: Assessor = state.assessor
    _xid79_on_both_nodes(push, assessor)
    with db.write() as conn:
        conn.execute(
            insert(webhook_subscriptions).values(
                name="on-call", kind="generic", url="http://receiver.test/hook", secret=None,
                filters={}, enabled=True, created_at=datetime.now(UTC),
            )
        )  # fmt: skip
    alerter = Alerter(db, state.settings, lambda: assessor.latest)
    first = alerter.run_for({"node-x"})
    assert (first.fired, first.still, first.resolved, first.queued) == (1, 0, 0, 1)
    with db.read() as conn:
        rows = conn.execute(select(alerts.c.node, alerts.c.state, alerts.c.occurrences)).all()
        pages = conn.execute(select(webhook_outbox.c.alert_id, webhook_outbox.c.event)).all()
    assert [(r.node, r.state, r.occurrences) for r in rows] == [("node-x", "firing", 1)]
    assert [(p.alert_id, p.event) for p in pages] == [(first.ids[0], "trigger")]
    assert alerter.run_once().fired == 1  # the whole pass adds node-y's (and counts node-x's)
    # node-y's condition gone from the view: only a whole pass may resolve it.
    base = assessor.latest
    assert base is not None
    gpus = [g if g.node == "node-x" else replace(g, verdicts=()) for g in base.gpus]
    view = FleetAssessment(base.at, gpus, base.bundle, base.model_version, base.fleet_at)
    again = Alerter(db, state.settings, lambda: view).run_for({"node-x", "node-y"})
    assert (again.fired, again.still, again.resolved) == (0, 1, 0)
    with db.read() as conn:
        rows = conn.execute(select(alerts.c.node, alerts.c.state, alerts.c.occurrences)).all()
    assert sorted((r.node, r.state, r.occurrences) for r in rows) == [
        ("node-x", "firing", 3),
        ("node-y", "firing", 1),
    ]


class _Poked:
    def __init__(self) -> None:
        self.pokes = 0

    def poke(self) -> None:
        self.pokes += 1


def test_urgent_nodes_fall_back_to_the_whole_fleet_when_too_many() -> None:
    urgent, fleet = _Poked(), _Poked()
    waiting = UrgentNodes(urgent, fleet, limit=3)  # type: ignore[arg-type]
    waiting.add(["a", "b"])
    waiting.add(["b", "c"])
    assert (urgent.pokes, fleet.pokes) == (2, 0)
    assert waiting.take() == {"a", "b", "c"} and waiting.take() == frozenset()
    waiting.add(["a", "b", "c", "d"])
    assert (urgent.pokes, fleet.pokes) == (2, 1)
    assert waiting.take() == frozenset()  # the whole-fleet pass judges them
    waiting.add(None)
    assert fleet.pokes == 2


def test_wake_payload_names_nodes_or_falls_back_to_the_fleet() -> None:
    names = {"node-a", "rack7.example.com", "ñode"}
    assert parse_wake(wake_payload(names)) == names
    assert wake_payload(None) == "" and parse_wake("") is None
    many = [f"node-{i:04d}-" + "x" * 240 for i in range(40)]  # 253-character names
    assert wake_payload(many) == ""
    fits = many[: MAX_PAYLOAD_BYTES // 260]
    assert parse_wake(wake_payload(fits)) == set(fits)
    for bad in ("{", "[]", '{"a": 1}', "[1]", "null"):
        assert parse_wake(bad) is None


@pytest.mark.postgres
def test_notify_carries_the_nodes_on_postgresql(migrated_postgres_url: str) -> None:
    engine = make_engine(ServerSettings(database_url=migrated_postgres_url))
    conninfo = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        with psycopg.connect(conninfo, autocommit=True) as listener:
            listener.execute(f"LISTEN {WAKE_CHANNEL}")
            names = ["node-a", "node-" + "b" * 248]
            notify_wake(engine, names)
            notify_wake(engine, [f"n{i:03d}-" + "x" * 248 for i in range(40)])  # too long
            notify_wake(engine)
            got = [parse_wake(n.payload) for n in listener.notifies(timeout=30, stop_after=3)]
    finally:
        engine.dispose()
    assert got == [set(names), None, None]


def _noticed_nodes(db: Database) -> set[str]:
    with db.read() as conn:
        rows = conn.execute(select(job_notices.c.node).where(job_notices.c.cleared_at.is_(None)))
        return {row.node for row in rows}


def _firing_xid_nodes(db: Database) -> set[str]:
    with db.read() as conn:
        query = select(alerts.c.node).where(alerts.c.state == "firing", alerts.c.kind == "xid")
        return set(conn.execute(query).scalars())


def test_an_urgent_wake_evicts_without_a_whole_fleet_pass(
    push: Push,
    client: TestClient,
    tokens: dict[str, str],
    db: Database,
    settings: ServerSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The registry's urgent job on the leader: it judges, plans, tells the jobs and alerts for
    node-x alone. node-y's fatal Xid, stored as well but not woken for, waits for the
    whole-fleet pass."""
    jobs = BackgroundJobs(
        db,
        settings,
        metrics=ServerMetrics(CollectorRegistry()),
        secrets=SecretBox([]),
        heard_since=datetime.now(UTC) - timedelta(hours=1),
    )
    monkeypatch.setattr(jobs, "elector", type("Leading", (), {"is_leader": True})())
    for node in ("node-x", "node-y"):
        assert push(make_batch(node, gpus=2, ticks=1)).status_code == 200
    started = {"started_at": datetime.now(UTC).isoformat(), "nodes": ["node-x", "node-y"]}
    agent = bearer(tokens["agent"])
    assert client.post("/v1/jobs/train/start", json=started, headers=agent).status_code == 200
    jobs._assess_then_act()
    assert _noticed_nodes(db) == set()
    whole_passes: list[object] = []
    real = assessor_module.assess_fleet
    monkeypatch.setattr(
        assessor_module, "assess_fleet", lambda *a, **k: whole_passes.append(1) or real(*a, **k)
    )
    for node in ("node-x", "node-y"):
        assert push(_xid_batch(node, 79)).status_code == 200
    jobs.urgent.add(["node-x"])
    assert jobs._urgent_pass() == 1
    assert whole_passes == []
    assert _evicted(db) == {"node-x": "pending"}
    assert _noticed_nodes(db) == {"node-x"}  # the job hears of node-x at once
    assert _firing_xid_nodes(db) == {"node-x"}  # and on-call is paged for it
    assert jobs._urgent_pass() == 0  # nothing waiting
    woken: list[str] = []
    monkeypatch.setattr(jobs.planner_waker, "poke", lambda: woken.append("planner"))
    monkeypatch.setattr(jobs.alerts_waker, "poke", lambda: woken.append("alerts"))
    jobs._assess_then_act()
    assert whole_passes == [1]
    assert woken == ["planner", "alerts"]  # the leader's assessment wakes their loops
    jobs._plan_then_notify()
    jobs.alerter.run_once()
    assert _evicted(db) == {"node-x": "pending", "node-y": "paged"}  # a budget of one node
    assert _noticed_nodes(db) == {"node-x", "node-y"}
    assert _firing_xid_nodes(db) == {"node-x", "node-y"}
    assert registry_module.URGENT_IDLE_S >= settings.assess_interval_s


def test_the_urgent_job_runs_on_a_poke_in_the_app(make_client: Any, tokens: dict[str, str]) -> None:
    """With the background jobs on and every timer an hour away, a fatal Xid pushed to the app
    is evicted by the urgent job alone, and its pass is counted as job ``urgent``."""
    hour = 3600.0
    client = make_client(
        background_jobs=True,
        assess_interval_s=hour,
        planner_interval_s=hour,
        alert_interval_s=hour,
        refit_interval_s=0,
    )
    state = client.app.state
    runs = state.metrics.background_runs

    def count(job: str) -> float:
        return float(runs.labels(job=job)._value.get())

    # Settled: the first passes of the leader's jobs, and the new leader's assessment.
    wait_for(
        "the first passes",
        lambda: count("assessment") >= 2 and min(count("planner"), count("alerts")) >= 1,
        timeout=120,
    )
    urgent_before = count("urgent")
    whole_before = count("assessment")
    response = client.post(
        "/v1/ingest", json=_xid_batch("node-x", 79), headers=bearer(tokens["agent"])
    )
    assert response.status_code == 200

    def evicted() -> bool:
        return "node-x" in _evicted(state.db)

    wait_for("the eviction of node-x", evicted, timeout=120)
    wait_for("the urgent pass counted", lambda: count("urgent") > urgent_before, timeout=60)
    assert count("assessment") == whole_before


def test_a_targeted_pass_does_not_wait_for_a_whole_fleet_pass_in_progress(
    push: Push, db: Database, settings: ServerSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole-fleet pass is held after it read the events; node-x's fatal Xid stored then is
    judged by a targeted pass meanwhile, and the whole-fleet snapshot, which has not seen it,
    is published with node-x's targeted GPUs patched in."""
    assessor = _assessor(db, settings)
    for node in ("node-x", "node-y"):
        assert push(make_batch(node, gpus=2, ticks=1)).status_code == 200
    assessor.run_once()
    read, release = threading.Event(), threading.Event()
    real = FleetJudge._load_events

    def held(self: FleetJudge, *args: Any, **kwargs: Any) -> Any:
        found = real(self, *args, **kwargs)
        if kwargs.get("node_ids") is None:  # the whole-fleet pass
            read.set()
            assert release.wait(120), "the test never released the whole-fleet pass"
        return found

    monkeypatch.setattr(FleetJudge, "_load_events", held)
    whole = threading.Thread(target=assessor.run_once)
    whole.start()
    try:
        assert read.wait(120)
        assert push(_xid_batch("node-x", 79, minutes_ago=0.1)).status_code == 200
        patched = assessor.run_nodes({"node-x"})
        assert "xid79_off_bus" in _rules(patched, "node-x")
    finally:
        release.set()
        whole.join(120)
    latest = assessor.latest
    assert latest is not None and latest.at == patched.at
    assert latest.whole_at > patched.whole_at  # the new whole-fleet pass, patched
    assert "xid79_off_bus" in _rules(latest, "node-x")


class _AgeBundle:
    """A stand-in risk model: p = age in days / 100 (what matters is which GPUs get scored)."""

    def __init__(self) -> None:
        self.scored: list[int] = []

    covariates: tuple[str, ...] = ()  # age only, as RiskBundle.covariates says

    def score(self, units: Any, horizon_days: float) -> Any:
        self.scored.append(len(units))
        p = [float(a) / 100 for a in units["age_days"]]
        return type("Scores", (), {"probability": p, "model": [None] * len(p),
                                   "factors": [()] * len(p)})()  # fmt: skip

    def probability(self, units: Any, horizon_days: float) -> list[float]:
        self.scored.append(len(units))
        return [float(a) / 100 for a in units["age_days"]]


def test_patched_snapshot_scores_only_the_fresh_gpus() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    bundle = _AgeBundle()
    gpus = [_gpu("a", 0), _gpu("b", 0), _gpu("b", 1), _gpu("c", 0)]
    base = FleetAssessment(at, gpus, bundle, 1)  # type: ignore[arg-type]
    base.risks(1.0)
    fresh = [replace(_gpu("b", 1), age_days=50.0), _gpu("z", 0)]
    patched = base.patched(at + timedelta(seconds=5), {"b", "z"}, fresh)
    assert bundle.scored == [4, 2]  # the fleet once, then the two fresh GPUs only
    carried = patched.risks(1.0)
    assert bundle.scored == [4, 2]
    again = FleetAssessment(patched.at, patched.gpus, bundle, 1).risks(1.0)  # type: ignore[arg-type]
    assert [(r.gpu, r.probability, r.basis) for r in carried] == [
        (r.gpu, r.probability, r.basis) for r in again
    ]
    assert [r.probability for r in carried] == [0.01, 0.5, 0.01, 0.01]


def test_patched_snapshot_carries_node_risks_as_a_fresh_grouping_has_them() -> None:
    """A patch regroups only its nodes' risks; the result is what grouping every GPU anew
    gives, node for node and in the same order, and the other nodes' entries are the same."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    bundle = _AgeBundle()
    gpus = [_gpu("a", 0), _gpu("b", 0), _gpu("b", 1), _gpu("c", 0), _gpu("d", 0)]
    base = FleetAssessment(at, gpus, bundle, 1)  # type: ignore[arg-type]
    before = base.node_risks(1.0)
    fresh = [replace(_gpu("b", 1), age_days=50.0), _gpu("z", 0)]
    patched = base.patched(at + timedelta(seconds=5), {"b", "c", "z"}, fresh)
    carried = patched.node_risks(1.0)
    assert bundle.scored == [5, 2]  # nothing scored for the grouping
    again = FleetAssessment(patched.at, patched.gpus, bundle, 1).node_risks(1.0)  # type: ignore[arg-type]

    def plain(nodes: Any) -> list[tuple[str, float | None, list[tuple[str, float | None]]]]:
        return [
            (node, p, [(r.gpu.uuid, r.probability) for r in members])
            for node, (p, members) in nodes.items()
        ]

    assert plain(carried) == plain(again)
    assert list(carried) == ["a", "b", "d", "z"]  # c has no GPU left
    assert carried["b"][0] == pytest.approx(0.5)
    assert carried["a"] is before["a"] and carried["d"] is before["d"]


def test_a_targeted_pass_reads_its_own_windows_while_a_whole_pass_holds_the_fleets(
    push: Push, db: Database, settings: ServerSettings
) -> None:
    """A whole-fleet pass holds the fleet's windows while it reads new samples (held here by
    the test): the targeted pass does not wait for them. It reads node-x's samples from the
    database, judges its fatal Xid, and gives the verdicts a whole-fleet pass gives."""
    targeted, full = _assessor(db, settings), _assessor(db, settings)
    for node in ("node-x", "node-y"):
        assert push(make_batch(node, gpus=2, ticks=3)).status_code == 200
    now = datetime.now(UTC)
    targeted.run_once(now=now)
    assert push(_xid_batch("node-x", 79)).status_code == 200
    judge = targeted.judge
    judge.state_wait_s = 0.0
    later = now + timedelta(seconds=1)
    with judge._state:  # what a whole-fleet pass holds while it reads the fleet's samples
        patched = targeted.run_nodes({"node-x"}, now=later)
    assert judge.fresh_reads == 1
    assert "xid79_off_bus" in _rules(patched, "node-x")
    assert _rules(patched, "node-y") == set()
    whole = full.run_once(now=later)
    assert _judged(patched, {"node-x"}) == _judged(whole, {"node-x"})
    # With the windows free, the targeted pass copies them as before.
    targeted.run_nodes({"node-x"}, now=later)
    assert judge.fresh_reads == 1


def test_only_xids_that_may_drain_wake_the_urgent_lane(
    make_client: Any, tokens: dict[str, str], tmp_path: Path
) -> None:
    """An application Xid (13) is stored and left to the routine pass; a fatal one (79) and a
    code the fleet's rules file promotes to critical (43 here) wake the lane for their node."""
    rules = tmp_path / "rules.toml"
    rules.write_text('[xid.43]\nseverity = "critical"\n', "utf-8")
    client = make_client(rules_file=rules)
    woken: list[list[str]] = []
    client.app.state.urgent.add = woken.append
    for node, code in (("node-app", 13), ("node-fatal", 79), ("node-promoted", 43)):
        response = client.post(
            "/v1/ingest", json=_xid_batch(node, code), headers=bearer(tokens["agent"])
        )
        assert response.status_code == 200 and response.json()["accepted"]["events"] == 1
    assert woken == [["node-fatal"], ["node-promoted"]]
