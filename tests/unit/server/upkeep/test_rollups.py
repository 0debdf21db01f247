"""Hourly rollups from ingested telemetry, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from tests.factories import gpu_uuid, make_batch, make_sample
from tests.unit.server.conftest import Push

from fleetwatch.models.telemetry_features import GPU_CATEGORIES, HourRollup, window_features
from fleetwatch.rules.xid_catalog import XidCatalog
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import gpu_hourly
from fleetwatch.server.upkeep.rollups import (
    RollupJob,
    fleet_window_features,
    refresh_rollups,
    roll_up_hours,
)

CATALOG = XidCatalog.load()
NOW = datetime.now(UTC).replace(minute=30, second=0, microsecond=0) - timedelta(hours=1)
HOUR = NOW.replace(minute=0)
WEEK = timedelta(days=7)


def _push_hour(push: Push, *, sbe_step: int, temp: float, throttled_every: int) -> None:
    """One GPU, 30 samples a minute apart from HOUR, an SBE counter climbing by ``sbe_step``."""
    batch = make_batch("node-a", gpus=1, ticks=1, start=HOUR)
    uuid = gpu_uuid("node-a", 0)
    batch["samples"] = [
        make_sample(
            uuid,
            HOUR + timedelta(minutes=m),
            gpu_temp_c=temp + (m % 5),
            ecc_sbe_aggregate_total=1000 + sbe_step * m,
            clocks_event_reasons=0x40 if m % throttled_every == 0 else 0,
            remapped_rows_correctable=3,
            remapped_rows_uncorrectable=1,
        )
        for m in range(30)
    ]
    batch["events"] = [
        {"kind": "xid", "ts": (HOUR + timedelta(minutes=5)).isoformat(), "xid": 48,
         "pci_bus_id": batch["gpus"][0]["pci_bus_id"], "message": "NVRM: Xid 48, DBE"},
        {"kind": "xid", "ts": (HOUR + timedelta(minutes=6)).isoformat(), "xid": 13,
         "pci_bus_id": batch["gpus"][0]["pci_bus_id"], "message": "NVRM: Xid 13, app"},
    ]  # fmt: skip
    assert push(batch).status_code == 200


def test_an_hour_of_samples_rolls_up_into_one_row(push: Push, db: Database) -> None:
    _push_hour(push, sbe_step=2, temp=60.0, throttled_every=3)
    with db.write() as conn:
        written = roll_up_hours(conn, start=HOUR, end=HOUR + timedelta(hours=1), catalog=CATALOG)
    assert written == 1
    with db.read() as conn:
        row = conn.execute(select(gpu_hourly)).one()._mapping
    assert row["samples"] == 30
    assert row["span_s"] == pytest.approx(29 * 60)
    assert row["sbe_errors"] == pytest.approx(2 * 29)
    assert row["temp_max_c"] == 64.0
    assert row["throttle_reported"] == 30 and row["throttled"] == 10
    assert row["remapped_rows"] == 4
    # Xid 48 is a memory error against the GPU; Xid 13 is the application's and is not counted.
    assert row["xid_memory"] == 1
    assert sum(row[f"xid_{c}"] for c in ("hardware", "interconnect", "driver_firmware")) == 0
    # NVLink was never reported beyond the CRC flit counter at 0: a known zero increase.
    assert row["nvlink_errors"] == 0.0
    assert row["pcie_replays"] == 0.0


def test_recomputing_replaces_instead_of_duplicating(push: Push, db: Database) -> None:
    _push_hour(push, sbe_step=1, temp=50.0, throttled_every=2)
    with db.write() as conn:
        _, mark = refresh_rollups(conn, now=NOW, catalog=CATALOG, backfill_hours=3)
        refresh_rollups(conn, now=NOW, catalog=CATALOG, after_id=mark)
    with db.read() as conn:
        rows = conn.execute(select(gpu_hourly.c.hour)).all()
    assert [r.hour for r in rows] == [HOUR]


def test_sql_window_features_equal_the_python_ones(push: Push, db: Database) -> None:
    _push_hour(push, sbe_step=5, temp=70.0, throttled_every=4)
    with db.write() as conn:
        roll_up_hours(conn, start=HOUR, end=HOUR + timedelta(hours=1), catalog=CATALOG)
    with db.read() as conn:
        sql = fleet_window_features(conn, window=WEEK, since=HOUR - WEEK)
        rollups = [HourRollup.from_row(r._mapping) for r in conn.execute(select(gpu_hourly))]
    python = window_features(rollups)
    uuid = gpu_uuid("node-a", 0)
    assert set(sql[uuid]) == set(python)
    for name, value in python.items():
        assert sql[uuid][name] == pytest.approx(value), name
    assert python["sbe_per_day"] == pytest.approx(5 * 29 / (29 * 60) * 86400)


def test_window_excludes_rollups_before_since(push: Push, db: Database) -> None:
    _push_hour(push, sbe_step=1, temp=50.0, throttled_every=2)
    with db.write() as conn:
        roll_up_hours(conn, start=HOUR, end=HOUR + timedelta(hours=1), catalog=CATALOG)
        assert fleet_window_features(conn, window=WEEK, since=HOUR + timedelta(hours=1)) == {}


def test_late_samples_hours_back_are_rolled_up_by_their_ids(push: Push, db: Database) -> None:
    """An agent emptying its spool: samples from 30 hours ago arrive after newer ones."""
    _push_hour(push, sbe_step=1, temp=50.0, throttled_every=2)
    with db.write() as conn:
        _, mark = refresh_rollups(conn, now=NOW, catalog=CATALOG)
    late = HOUR - timedelta(hours=30)
    batch = make_batch("node-a", gpus=1, ticks=3, start=late + timedelta(minutes=5))
    assert push(batch).status_code == 200
    with db.write() as conn:
        refresh_rollups(conn, now=NOW, catalog=CATALOG, after_id=mark)
        hours = {r.hour for r in conn.execute(select(gpu_hourly.c.hour))}
    assert hours == {HOUR, late}


def test_a_new_leader_rolls_up_late_samples_that_came_after_the_last_pass(
    push: Push, db: Database
) -> None:
    """The newest sample id of the last pass is kept in the database, not in the job: a job
    started afresh (a new leader) still rolls up samples from 30 hours ago that arrived since."""
    _push_hour(push, sbe_step=1, temp=50.0, throttled_every=2)
    RollupJob(db, CATALOG)(now=NOW)
    late = HOUR - timedelta(hours=30)
    batch = make_batch("node-a", gpus=1, ticks=3, start=late + timedelta(minutes=5))
    assert push(batch).status_code == 200
    RollupJob(db, CATALOG)(now=NOW)
    with db.read() as conn:
        hours = {r.hour for r in conn.execute(select(gpu_hourly.c.hour))}
    assert hours == {HOUR, late}


def test_each_gpu_is_described_over_its_own_trailing_window(db: Database) -> None:
    """A GPU whose newest data is 10 days old keeps its covariates from then; a live GPU's
    window ends at its newest hour and leaves out what is older than the window."""
    old = HOUR - timedelta(days=10)

    def rollup(uuid: str, hour: datetime, memory_xids: int) -> dict[str, object]:
        row = HourRollup(uuid, hour, samples=10, span_s=3000.0, temp_p95_c=60.0,
                         xids={"memory": memory_xids}).as_row()  # fmt: skip
        return {**{f"xid_{c}": 0 for c in GPU_CATEGORIES}, **row, "node_id": 1}

    with db.write() as conn:
        conn.execute(gpu_hourly.insert(), [
            rollup("GPU-live", old, 5), rollup("GPU-live", HOUR, 1), rollup("GPU-stale", old, 3),
        ])  # fmt: skip
        features = fleet_window_features(conn, window=WEEK, since=HOUR - timedelta(days=30))
    assert features["GPU-live"]["xid_memory"] == 1.0
    assert features["GPU-stale"]["xid_memory"] == 3.0
