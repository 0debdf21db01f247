"""A small fleet for week 2026-W48 (Mon 2026-11-23 .. Mon 2026-11-30 UTC), inserted row by row.

The rows are returned too, so that tests recompute every figure from them in plain Python.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert

from fleetwatch.models.registry import PARAMS_FORMAT
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import (
    events,
    evictions,
    gpu_hourly,
    gpu_lifetimes,
    gpus,
    nodes,
    risk_models,
    stragglers,
)
from fleetwatch.server.ingest.sample_writer import write_sample_rows

WEEK = "2026-W48"
START = datetime(2026, 11, 23, tzinfo=UTC)
END = START + timedelta(days=7)
NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
WEIBULL = {"lambda": 400.0, "rho": 1.3}


def t(day: int, hour: int = 0) -> datetime:
    return datetime(2026, 11, day, hour, tzinfo=UTC)


def _rows() -> dict[str, list[dict[str, Any]]]:
    far = datetime(2026, 1, 1, tzinfo=UTC)
    node_rows = [
        {"id": 1, "name": "n1", "labels": {"rack": "r1"}, "last_seen": NOW},
        {"id": 2, "name": "n2", "labels": {"rack": "r1"}, "last_seen": NOW},
        {"id": 3, "name": "n3", "labels": {"rack": "r2"}, "last_seen": t(26, 12)},
    ]
    for n in node_rows:
        n.update(interval_s=10.0, first_seen=far)
    sku = {1: "H100", 2: "H100", 3: "A100"}
    driver = {1: "550.90", 2: "550.90", 3: "535.10"}
    gpu_rows = [
        {"id": 2 * n + i, "uuid": f"GPU-n{n}-{i}", "node_id": n, "index": i,
         "serial": f"SN-n{n}-{i}", "name": sku[n], "driver_version": driver[n],
         "first_seen": far, "last_seen": NOW}
        for n in (1, 2, 3) for i in (0, 1)
    ]  # fmt: skip
    installed = datetime(2026, 6, 1, tzinfo=UTC)
    lifetimes = [
        {"serial": g["serial"], "gpu_uuid": g["uuid"], "node_id": g["node_id"],
         "location": f"n{g['node_id']}/slot{g['index']}", "sku": g["name"],
         "installed_at": installed, "removed_at": None, "end_kind": None, "cause": None}
        for g in gpu_rows
    ]  # fmt: skip
    by_serial = {lt["serial"]: lt for lt in lifetimes}
    by_serial["SN-n1-0"].update(removed_at=t(24, 6), end_kind="failure", cause="DBE")
    by_serial["SN-n2-1"].update(removed_at=t(28), end_kind="failure")
    by_serial["SN-n2-0"].update(installed_at=t(19))
    extra = [
        # n1/slot0's replacement, a day after the failure
        {"serial": "SN-new", "gpu_uuid": "GPU-new", "node_id": 1, "location": "n1/slot0",
         "sku": "H100", "installed_at": t(25, 6), "removed_at": None, "end_kind": None,
         "cause": None},
        # last week: n2/slot0 failed and was replaced by SN-n2-0
        {"serial": "SN-prev", "gpu_uuid": "GPU-prev", "node_id": 2, "location": "n2/slot0",
         "sku": "H100", "installed_at": installed, "removed_at": t(18),
         "end_kind": "failure", "cause": "fell off the bus"},
        # history for the survival curves
        {"serial": "SN-old1", "gpu_uuid": None, "node_id": 3, "location": "n3/old",
         "sku": "A100", "installed_at": datetime(2025, 1, 1, tzinfo=UTC),
         "removed_at": datetime(2025, 9, 1, tzinfo=UTC), "end_kind": "failure", "cause": "DBE"},
        {"serial": "SN-old2", "gpu_uuid": None, "node_id": 3, "location": "n3/old2",
         "sku": "A100", "installed_at": datetime(2025, 1, 1, tzinfo=UTC),
         "removed_at": datetime(2025, 5, 1, tzinfo=UTC), "end_kind": "retirement",
         "cause": None},
    ]  # fmt: skip
    for lt in lifetimes + extra:
        lt["source"] = "observed"
    ev = [
        # confirmed: n1's GPU fails 4 h after the drain
        {"node": "n1", "reason_kind": "risk", "dry_run": False, "created_at": t(24),
         "completed_at": t(24, 2), "returned_at": t(25, 8)},
        # unconfirmed: a straggler drain with nothing fatal near it
        {"node": "n3", "reason_kind": "straggler", "dry_run": False, "created_at": t(26),
         "completed_at": t(26, 1), "returned_at": t(26, 5)},
        # a dry-run recommendation: not a drain
        {"node": "n2", "reason_kind": "risk", "dry_run": True, "created_at": t(27),
         "completed_at": None, "returned_at": None},
        # confirmed by the fatal Xid 79 two hours before; still out at week end
        {"node": "n2", "reason_kind": "rule", "dry_run": False, "created_at": t(29, 11),
         "completed_at": t(29, 12), "returned_at": None},
        # last week's drain, back in this week's predecessor
        {"node": "n1", "reason_kind": "rule", "dry_run": False, "created_at": t(17),
         "completed_at": t(17, 1), "returned_at": t(17, 7)},
    ]  # fmt: skip
    for e in ev:
        e.update(state="returned" if e["returned_at"] else "completed", reason="test",
                 updated_at=e["created_at"])  # fmt: skip
    event_rows = [
        {"node_id": 2, "gpu_uuid": "GPU-n2-1", "kind": "xid", "xid": 79, "ts": t(29, 10)},
        {"node_id": 1, "gpu_uuid": "GPU-n1-1", "kind": "xid", "xid": 13, "ts": t(24, 3)},
        {"node_id": 1, "gpu_uuid": "GPU-n1-1", "kind": "xid", "xid": 13, "ts": t(25, 3)},
        {"node_id": 3, "gpu_uuid": "GPU-n3-0", "kind": "xid", "xid": 48, "ts": t(27, 9)},
        {"node_id": 3, "gpu_uuid": None, "kind": "node_boot", "xid": None, "ts": t(27, 10)},
        {"node_id": 1, "gpu_uuid": "GPU-n1-0", "kind": "xid", "xid": 48, "ts": t(20)},
    ]
    for e in event_rows:
        e["received_at"] = e["ts"]
    straggler_rows = [
        {"job_id": "j1", "node": "n3", "ratio": 1.4, "started_at": t(25)},
        {"job_id": "j2", "node": "n3", "ratio": 1.6, "started_at": t(26)},
        {"job_id": "j1", "node": "n1", "ratio": 1.3, "started_at": t(27)},
        {"job_id": "j0", "node": "n1", "ratio": 1.9, "started_at": t(20)},
    ]
    for s in straggler_rows:
        s.update(kind="hardware", updated_at=s["started_at"], ended_at=None, windows=3)
    samples = [
        {"gpu_uuid": "GPU-n1-1", "node_id": 1, "ts": t(24, h), "energy_mj": e, "power_w": 300.0}
        for h, e in ((0, 1000), (1, 2000), (2, 500), (3, 1500))
    ] + [
        {"gpu_uuid": "GPU-n2-0", "node_id": 2, "ts": t(24, h), "energy_mj": None, "power_w": 250.0}
        for h in (0, 1)
    ]
    gpu_ids = {g["uuid"]: g["id"] for g in gpu_rows}
    for s in samples:
        s["gpu_id"] = gpu_ids[s["gpu_uuid"]]  # samples are stored by key; tests read the uuid
    hourly = [
        {"gpu_uuid": f"GPU-n1-{i}", "hour": t(24, h), "node_id": 1, "samples": 360,
         "span_s": 3590.0, "throttle_reported": 0, "throttled": 0, "xid_hardware": 0,
         "xid_memory": 0, "xid_interconnect": 0, "xid_power_thermal": 0,
         "xid_driver_firmware": 0}
        for i in (0, 1) for h in (0, 1, 2)
    ]  # fmt: skip
    model = {
        "trained_at": datetime(2026, 11, 1, tzinfo=UTC), "trigger": "manual", "status": "ok",
        "params": {"format": PARAMS_FORMAT, "groups": {}, "aft": None,
                   "fleet": {**WEIBULL, "rho_ci": [1.2, 1.4]}},
    }  # fmt: skip
    return {
        "nodes": node_rows, "gpus": gpu_rows, "lifetimes": lifetimes + extra, "evictions": ev,
        "events": event_rows, "stragglers": straggler_rows, "samples": samples,
        "hourly": hourly, "models": [model],
    }  # fmt: skip


TABLES = {
    "nodes": nodes, "gpus": gpus, "lifetimes": gpu_lifetimes, "evictions": evictions,
    "events": events, "stragglers": stragglers, "hourly": gpu_hourly,
    "models": risk_models,
}  # fmt: skip


def seed(db: Database) -> dict[str, list[dict[str, Any]]]:
    rows = _rows()
    with db.write() as conn:
        for name, table in TABLES.items():
            known = set(table.c.keys())
            conn.execute(
                insert(table), [{k: v for k, v in r.items() if k in known} for r in rows[name]]
            )
        write_sample_rows(conn, rows["samples"])
    return rows


@pytest.fixture
def fleet_rows(db: Database) -> dict[str, list[dict[str, Any]]]:
    return seed(db)
