"""What a maintenance window changes for the judges: the planner, the alerter and the lifecycle.

Inside a window a node's silence and what a planned reset causes (a GPU lost from the bus) are
no fault: no unreachable eviction or alert, no failure recorded. A fatal Xid inside one still
drains, alerts and ends the GPU's lifetime as a failure. After the window, silence counts from
its end. Passes are driven by hand with an explicit ``now``; both databases.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import insert, select
from tests.factories import gpu_uuid, make_batch, make_gpu, make_sample
from tests.unit.server.conftest import Push
from tests.unit.server.routers.test_risk_api import _xid_batch

from fleetwatch.rules.xid import XidCatalog
from fleetwatch.server.act.planner import EvictionPlanner
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import alerts, evictions, gpu_lifetimes, stragglers
from fleetwatch.server.ingest.store import store_batch
from fleetwatch.server.repo.maintenance import create_window, end_window
from fleetwatch.server.schemas.maintenance import MaintenanceCreate
from fleetwatch.server.tell.alerting import Alerter
from fleetwatch.server.upkeep.lifecycle import sync_lifetimes
from fleetwatch.telemetry import Batch

INTERVAL_S = 10.0


def _open(db: Database, *, now: datetime | None = None, **body: Any) -> int:
    with db.write() as conn:
        made = MaintenanceCreate(reason="planned work", **body)
        return create_window(conn, made, actor="test", now=now or utcnow()).id


def _end(db: Database, window_id: int, now: datetime) -> None:
    with db.write() as conn:
        end_window(conn, window_id, actor="test", now=now)


def _evictions(db: Database) -> list[tuple[str, str, str]]:
    with db.read() as conn:
        rows = conn.execute(select(evictions).order_by(evictions.c.id))
        return [(r.node, r.state, r.reason.split(":")[0]) for r in rows]


def _firing(db: Database) -> set[str]:
    with db.read() as conn:
        rows = conn.execute(select(alerts.c.dedup_key).where(alerts.c.state == "firing"))
        return set(rows.scalars())


def _jobs(client: TestClient) -> tuple[EvictionPlanner, Alerter]:
    state = client.app.state  # type: ignore[attr-defined]
    state.assessor.run_once()
    return state.planner, state.alerter


def test_silence_in_a_window_drains_and_pages_nobody_and_counts_again_from_its_end(
    client: TestClient, push: Push, db: Database
) -> None:
    for name in ("node-m", "node-x"):
        assert push(make_batch(name, gpus=1, interval_s=INTERVAL_S)).status_code == 200
    window = _open(db, nodes=["node-m"])
    _jobs(client)
    # Two of two nodes silent would be a fleet-wide silence (test_fleet_silence): guard off.
    state = client.app.state  # type: ignore[attr-defined]
    per_node = state.settings.model_copy(update={"unreachable_storm_pct": 0.0})
    planner = EvictionPlanner(db, per_node, state.assessor)
    alerter = Alerter(db, per_node, lambda: state.assessor.latest)
    t = utcnow() + timedelta(minutes=10)  # both silent for 60 intervals
    planner.run_once(t)
    alerter.run_once(t)
    assert _evictions(db) == [("node-x", "pending", "node_unreachable")]
    assert _firing(db) == {"node:node-x:unreachable"}

    _end(db, window, t)
    planner.run_once(t + timedelta(seconds=3 * INTERVAL_S - 1))
    alerter.run_once(t + timedelta(seconds=3 * INTERVAL_S - 1))
    assert len(_evictions(db)) == 1  # its intervals since the window's end have not passed
    assert _firing(db) == {"node:node-x:unreachable"}

    later = t + timedelta(seconds=3 * INTERVAL_S + 1)
    planner.run_once(later)
    alerter.run_once(later)
    # (paged: two of two nodes would drain, past the fleet drain budget)
    assert [(n, r) for n, _, r in _evictions(db)][1] == ("node-m", "node_unreachable")
    assert {"node:node-x:unreachable", "node:node-m:unreachable"} <= _firing(db)


def test_a_window_opened_on_an_unreachable_node_cancels_its_eviction_and_resolves_its_alert(
    client: TestClient, push: Push, db: Database
) -> None:
    assert push(make_batch("node-q", gpus=1, interval_s=INTERVAL_S)).status_code == 200
    planner, alerter = _jobs(client)
    t = utcnow() + timedelta(minutes=5)
    planner.run_once(t)
    alerter.run_once(t)
    assert _evictions(db) == [("node-q", "pending", "node_unreachable")]
    _open(db, selector="rack=r1")  # make_batch's nodes are in rack r1
    assert planner.run_once(t).cancelled == 1
    assert alerter.run_once(t).resolved == 1
    assert _evictions(db) == [("node-q", "cancelled", "node_unreachable")]


def test_in_a_window_a_fatal_xid_still_drains_and_alerts_but_a_lost_gpu_does_not(
    client: TestClient, push: Push, db: Database
) -> None:
    assert push(_xid_batch("node-f", 79)).status_code == 200
    lost = make_batch("node-l", gpus=2, ticks=3)
    lost["events"] = [
        {"kind": "gpu_lost", "uuid": lost["gpus"][1]["uuid"], "ts": utcnow().isoformat(),
         "pci_bus_id": lost["gpus"][1]["pci_bus_id"], "message": "GPU reset by the operator"}
    ]  # fmt: skip
    assert push(lost).status_code == 200
    _open(db, nodes=["node-f", "node-l"])
    planner, alerter = _jobs(client)
    now = utcnow()
    planner.run_once(now)
    alerter.run_once(now)
    assert [(n, s) for n, s, _ in _evictions(db)] == [("node-f", "pending")]
    firing = _firing(db)
    assert any(key.startswith(f"gpu:{gpu_uuid('node-f', 1)}:") for key in firing), firing
    assert not any(lost["gpus"][1]["uuid"] in key for key in firing), firing


def test_out_of_a_window_a_lost_gpu_drains(client: TestClient, push: Push, db: Database) -> None:
    """The control for the test above: the same lost GPU with no window is a drain."""
    lost = make_batch("node-l", gpus=2, ticks=3)
    lost["events"] = [
        {"kind": "gpu_lost", "uuid": lost["gpus"][1]["uuid"], "ts": utcnow().isoformat(),
         "pci_bus_id": lost["gpus"][1]["pci_bus_id"], "message": "GPU has fallen off the bus"}
    ]  # fmt: skip
    assert push(lost).status_code == 200
    planner, _ = _jobs(client)
    planner.run_once(utcnow())
    assert [(n, s) for n, s, _ in _evictions(db)] == [("node-l", "pending")]


# --- the lifecycle: failures recorded -----------------------------------------------------------

T0 = datetime(2025, 3, 1, 8, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


def _report(db: Database, gpu: dict[str, Any], *, at: datetime, ticks: int, events: Any) -> None:
    batch = make_batch("node-a", gpus=0, start=at, interval_s=60.0, events=events)
    batch["gpus"] = [gpu]
    times = [at + timedelta(seconds=60.0 * t) for t in range(ticks)]
    batch["samples"] = [make_sample(gpu["uuid"], ts) for ts in times]
    store_batch(
        db, Batch.model_validate_json(json.dumps(batch)), content_sha256="0" * 64, now=times[-1]
    )


def _ending(db: Database, serial: str) -> tuple[str | None, str | None]:
    with db.read() as conn:
        row = conn.execute(
            select(gpu_lifetimes.c.end_kind, gpu_lifetimes.c.cause).where(
                gpu_lifetimes.c.serial == serial
            )
        ).one()
    return row.end_kind, row.cause


def test_lifecycle_a_gpu_lost_in_a_window_is_no_failure_a_fatal_xid_is(
    db: Database, push: Push
) -> None:
    catalog = XidCatalog.load()
    lost_at = T0 + timedelta(minutes=4)
    _open(db, now=T0, nodes=["node-a"], starts_at=T0, ends_at=T0 + 2 * HOUR)
    quiet = make_gpu("node-a", 0, serial="RESET1")
    lost = {"kind": "gpu_lost", "ts": lost_at.isoformat(), "uuid": quiet["uuid"], "message": "x"}
    _report(db, quiet, at=T0, ticks=5, events=[lost])
    with db.write() as conn:
        sync_lifetimes(conn, now=T0 + 3 * HOUR, catalog=catalog, leave_after_s=3600.0)
    assert _ending(db, "RESET1") == (None, None)  # a planned reset: still in service

    bad = make_gpu("node-a", 1, serial="DEAD1")
    xid = {"kind": "xid", "xid": 79, "ts": lost_at.isoformat(), "uuid": bad["uuid"],
           "pci_bus_id": bad["pci_bus_id"], "message": "GPU has fallen off the bus"}  # fmt: skip
    _report(db, bad, at=T0, ticks=5, events=[xid])
    with db.write() as conn:
        sync_lifetimes(conn, now=T0 + 3 * HOUR, catalog=catalog, leave_after_s=3600.0)
    end_kind, cause = _ending(db, "DEAD1")
    assert end_kind == "failure" and cause is not None and "Xid 79" in cause


def test_in_a_window_a_hardware_straggler_is_not_drained(
    client: TestClient, push: Push, db: Database
) -> None:
    for node in ("node-s", "node-t", "node-u"):
        assert push(make_batch(node, gpus=2, ticks=2)).status_code == 200
    now = utcnow()
    with db.write() as conn:
        for node in ("node-s", "node-t"):
            conn.execute(insert(stragglers).values(
                job_id="job-1", node=node, kind="hardware", started_at=now - timedelta(hours=1),
                updated_at=now, ended_at=None, windows=7, ratio=1.5, evidence={"peers": 15},
            ))  # fmt: skip
    _open(db, nodes=["node-s"], now=now)
    planner, alerter = _jobs(client)
    planner.run_once(now)
    alerter.run_once(now)
    assert [(n, s) for n, s, _ in _evictions(db)] == [("node-t", "pending")]
    assert _firing(db) == {"node:node-t:straggler"}
