"""The rollups job's incremental passes store what one full recompute of the same data stores,
on SQLite and PostgreSQL (where the passes read the samples packed, the recompute as rows): late
samples, samples out of order, Xids arriving after their hour was rolled up, counters too large
for float64, temperatures float32 cannot hold, fields not reported, and passes with nothing
new."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import delete, select
from tests.factories import gpu_uuid, make_batch, make_sample
from tests.unit.server.conftest import Push

from fleetwatch.rules.xid_catalog import XidCatalog
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import gpu_hourly
from fleetwatch.server.upkeep import rollups as rollups_module
from fleetwatch.server.upkeep.recent_rollups import RecentHours
from fleetwatch.server.upkeep.rollups import RollupJob, refresh_rollups

CATALOG = XidCatalog.load()
# Half past an hour, a few hours ago: every time below is within the ingest's accepted past.
NOW = datetime.now(UTC).replace(minute=30, second=0, microsecond=0) - timedelta(hours=3)
HOUR = NOW.replace(minute=0)


def _batch(
    node: str,
    start: datetime,
    ticks: int,
    *,
    step_s: float = 60.0,
    values: Callable[[int, int], dict[str, Any]] = lambda i, t: {},
    events: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Two GPUs of ``node``, ``ticks`` samples each from ``start``; ``values(index, tick)``."""
    batch = make_batch(node, gpus=2, start=start, events=events)
    batch["samples"] = [
        make_sample(
            gpu_uuid(node, i),
            start + timedelta(seconds=step_s * t),
            **{
                "gpu_temp_c": 50.0 + (3 * t + i) % 7,
                "ecc_sbe_aggregate_total": 10 + t // 3,
                "clocks_event_reasons": 0x40 if t % 4 == 0 else 0,
                "nvlink_replay_errors_total": t % 5,
                **values(i, t),
            },
        )  # fmt: skip
        for t in range(ticks)
        for i in range(2)
    ]
    return batch


def _xid(node: str, at: datetime, xid: int) -> dict[str, Any]:
    return {"kind": "xid", "ts": at.isoformat(), "xid": xid, "uuid": gpu_uuid(node, 0),
            "message": f"NVRM: Xid {xid}"}  # fmt: skip


def _stored(db: Database) -> list[dict[str, Any]]:
    with db.read() as conn:
        rows = conn.execute(select(gpu_hourly).order_by(gpu_hourly.c.hour, gpu_hourly.c.gpu_uuid))
        return [dict(row._mapping) for row in rows]


def _recomputed(db: Database, now: datetime) -> list[dict[str, Any]]:
    """gpu_hourly as one full recompute from every stored sample makes it."""
    with db.write() as conn:
        conn.execute(delete(gpu_hourly))
        refresh_rollups(conn, now=now, catalog=CATALOG, backfill_hours=48)
    return _stored(db)


def test_incremental_passes_store_what_a_full_recompute_stores(
    push: Push, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = RollupJob(db, CATALOG)
    first_passes = []
    original = RollupJob._first_pass

    def counted(self: RollupJob, *args: Any) -> Any:
        first_passes.append(args[1])
        return original(self, *args)

    monkeypatch.setattr(RollupJob, "_first_pass", counted)
    packed_reads = []
    real_read = rollups_module.read_samples

    def spied(*args: Any, **kwargs: Any) -> Any:
        if "chunk" in kwargs:  # the fold's read (the exact recomputes read by GPU)
            packed_reads.append(kwargs.get("since") or kwargs.get("after_id"))
        return real_read(*args, **kwargs)

    monkeypatch.setattr(rollups_module, "read_samples", spied)
    xid48 = _xid("node-a", HOUR + timedelta(minutes=3), 48)
    assert push(_batch("node-a", HOUR, 20, events=[xid48])).status_code == 200
    assert push(_batch("node-b", HOUR + timedelta(minutes=2), 20)).status_code == 200
    job(now=NOW)  # the first pass: a full recompute
    # New samples in the same hour and the next one (the next pass's current hour).
    later = NOW + timedelta(hours=1)
    assert push(_batch("node-a", HOUR + timedelta(minutes=20), 50)).status_code == 200
    assert push(_batch("node-b", HOUR + timedelta(minutes=40), 30)).status_code == 200
    # Temperatures a float32 cannot hold exactly (the packed read sends a real as its decimal),
    # and fields not reported in some samples.
    odd = _batch("node-d", HOUR + timedelta(minutes=10), 12, values=lambda i, t: {
        "gpu_temp_c": 55.3 + 0.7 * t + 0.01 * i,
        "clocks_event_reasons": 0x8 if t % 2 else 1})  # fmt: skip
    for k, sample in enumerate(odd["samples"]):
        if k % 3 == 0:
            del sample["gpu_temp_c"], sample["clocks_event_reasons"], sample["pcie_replay_total"]
    assert push(odd).status_code == 200
    job(now=later)
    # A spool emptying: samples from five hours back (before the hours held), an Xid stored now
    # for an hour already rolled up, node-b samples older than the newest folded ones (an agent
    # clock stepping back), a GPU whose counter float64 cannot sum exactly, a counter reset.
    old = HOUR - timedelta(hours=5)
    assert push(_batch("node-a", old, 10, events=[_xid("node-a", old, 79)])).status_code == 200
    xid74 = _xid("node-a", HOUR + timedelta(minutes=50), 74)
    newer = _batch("node-a", HOUR + timedelta(minutes=75), 5, events=[xid74])
    assert push(newer).status_code == 200
    assert push(_batch("node-b", HOUR + timedelta(minutes=1), 1)).status_code == 200
    huge = _batch("node-c", HOUR + timedelta(minutes=61), 10, values=lambda i, t: {
        "pcie_replay_total": 2**62 + 3 * t, "ecc_sbe_aggregate_total": (5 - t) % 4})  # fmt: skip
    assert push(huge).status_code == 200
    assert push(_batch("node-a", HOUR - timedelta(hours=3), 3)).status_code == 200
    job(now=later)
    # An Xid alone, for an hour rolled up passes ago and no longer held.
    late_xid = _batch("node-a", HOUR - timedelta(hours=3), 0)
    late_xid["events"] = [_xid("node-a", HOUR - timedelta(hours=3, minutes=-1), 48)]
    assert push(late_xid).status_code == 200
    job(now=later)
    job(now=later + timedelta(minutes=5))  # nothing new
    assert len(first_passes) == 1, "later passes are incremental"
    # Every pass folds the blocks it reads as arrays (the same rows, held to the recompute).
    assert len(packed_reads) == 5
    incremental = _stored(db)
    assert len(incremental) > 8
    assert _recomputed(db, later + timedelta(minutes=5)) == incremental


def test_a_pass_by_another_process_makes_the_next_one_start_over(push: Push, db: Database) -> None:
    """Two jobs (two leaders in turn): each notices the other's pass and recomputes, so neither
    folds on top of rows it did not write."""
    one, two = RollupJob(db, CATALOG), RollupJob(db, CATALOG)
    assert push(_batch("node-a", HOUR, 20)).status_code == 200
    one(now=NOW)
    assert push(_batch("node-a", HOUR + timedelta(minutes=20), 5)).status_code == 200
    two(now=NOW)
    assert push(_batch("node-a", HOUR + timedelta(minutes=25), 5)).status_code == 200
    one(now=NOW)
    incremental = _stored(db)
    assert _recomputed(db, NOW) == incremental
    assert [row["samples"] for row in incremental] == [30, 30]


def test_a_rollup_the_database_refuses_costs_that_gpu_hour_alone(
    push: Push, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One GPU-hour row the database refuses (here: samples NULL) is left out; every other row
    of the same write is stored, and the next pass writes through the same path again
    (on PostgreSQL the rows go through a temporary table, which a refusal leaves empty)."""
    assert push(_batch("node-a", HOUR, 20)).status_code == 200
    assert push(_batch("node-b", HOUR, 20)).status_code == 200
    real_rows = RecentHours.rows
    bad = gpu_uuid("node-b", 1)

    def one_bad(self: RecentHours, hour: datetime, slots: Any) -> Any:
        rows, exact = real_rows(self, hour, slots)
        return [{**row, "samples": None} if row["gpu_uuid"] == bad else row for row in rows], exact

    monkeypatch.setattr(RecentHours, "rows", one_bad)
    job = RollupJob(db, CATALOG)
    assert job(now=NOW) == 3
    stored = {row["gpu_uuid"] for row in _stored(db)}
    assert stored == {gpu_uuid("node-a", 0), gpu_uuid("node-a", 1), gpu_uuid("node-b", 0)}
    assert job.guard.errors == 1
    monkeypatch.setattr(RecentHours, "rows", real_rows)
    assert push(_batch("node-b", HOUR + timedelta(minutes=20), 5)).status_code == 200
    job(now=NOW)
    incremental = _stored(db)
    samples = {row["gpu_uuid"]: row["samples"] for row in incremental}
    assert samples == {
        gpu_uuid(n, i): 20 if n == "node-a" else 25 for n in ("node-a", "node-b") for i in (0, 1)
    }
    assert _recomputed(db, NOW) == incremental
