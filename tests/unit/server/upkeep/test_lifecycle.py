"""Lifetimes derived from ingested telemetry, on SQLite and PostgreSQL: installs, replacements,
failures, returns, and a second sync that changes nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, func, insert, select
from tests.factories import make_batch, make_gpu, make_sample

from fleetwatch.rules.xid import XidCatalog
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import gpu_lifetimes, gpus
from fleetwatch.server.ingest.store import store_batch
from fleetwatch.server.upkeep.lifecycle import LifecycleCounts, sync_lifetimes
from fleetwatch.telemetry import Batch

T0 = datetime(2025, 3, 1, 8, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
PCI = "0000:18:00.0"
NOTHING = LifecycleCounts()


@pytest.fixture(scope="module")
def catalog() -> XidCatalog:
    return XidCatalog.load()


def _gpu(serial: str | None, *, node: str = "node-a", index: int = 0) -> dict[str, Any]:
    """A GPU in ``node``'s slot ``index``; the UUID follows the serial, as on real boards."""
    uuid = make_gpu(f"{node}/{serial}", index)["uuid"]
    return make_gpu(node, index, uuid=uuid, serial=serial)


def _report(
    db: Database,
    gpu_list: list[dict[str, Any]],
    *,
    at: datetime,
    ticks: int = 1,
    interval_s: float = 60.0,
    events: list[dict[str, Any]] | None = None,
    node: str = "node-a",
) -> None:
    """One agent batch: ``ticks`` samples per GPU from ``at``, received at the last sample."""
    batch = make_batch(node, gpus=0, start=at, interval_s=interval_s, events=events)
    batch["gpus"] = gpu_list
    times = [at + timedelta(seconds=interval_s * t) for t in range(ticks)]
    batch["samples"] = [make_sample(g["uuid"], ts) for ts in times for g in gpu_list]
    store_batch(
        db, Batch.model_validate_json(json.dumps(batch)), content_sha256="0" * 64, now=times[-1]
    )


def _xid(gpu: dict[str, Any], xid: int, ts: datetime, message: str = "") -> dict[str, Any]:
    return {"kind": "xid", "xid": xid, "ts": ts.isoformat(), "uuid": gpu["uuid"],
            "pci_bus_id": gpu["pci_bus_id"], "message": message or f"Xid {xid}"}  # fmt: skip


def _sync(db: Database, catalog: XidCatalog, now: datetime) -> LifecycleCounts:
    with db.write() as conn:
        return sync_lifetimes(conn, now=now, catalog=catalog, leave_after_s=3600.0)


def _lifetimes(db: Database, serial: str) -> list[Any]:
    with db.read() as conn:
        query = select(gpu_lifetimes).where(gpu_lifetimes.c.serial == serial)
        return list(conn.execute(query.order_by(gpu_lifetimes.c.installed_at, gpu_lifetimes.c.id)))


def _all(db: Database) -> list[tuple[Any, ...]]:
    with db.read() as conn:
        return [tuple(r) for r in conn.execute(select(gpu_lifetimes).order_by(gpu_lifetimes.c.id))]


def test_install_opens_one_lifetime_per_gpu_and_is_idempotent(
    db: Database, catalog: XidCatalog
) -> None:
    a, b, anon = _gpu("A1", index=0), _gpu("B1", index=1), _gpu(None, index=2)
    _report(db, [a, b, anon], at=T0, ticks=3)
    _report(db, [a, b, anon], at=T0 + HOUR)

    assert _sync(db, catalog, T0 + HOUR) == LifecycleCounts(opened=3)
    [row] = _lifetimes(db, "A1")
    assert (row.gpu_uuid, row.source, row.removed_at, row.end_kind) == (
        a["uuid"],
        "observed",
        None,
        None,
    )
    assert row.installed_at == T0  # its first reading (agent clock), before the batch arrived
    assert row.location == f"node-a/{PCI}" and row.sku == "NVIDIA H100 80GB HBM3"
    assert len(_lifetimes(db, anon["uuid"])) == 1  # no serial: keyed by UUID
    before = _all(db)
    assert _sync(db, catalog, T0 + HOUR) == NOTHING
    assert _all(db) == before


def test_swap_after_xid79_is_a_failure_with_evidence(db: Database, catalog: XidCatalog) -> None:
    old, new = _gpu("OLD1"), _gpu("NEW1")
    _report(db, [old], at=T0, ticks=10)
    gone = T0 + timedelta(minutes=9)
    off_bus = _xid(old, 79, gone + timedelta(seconds=20), "GPU has fallen off the bus.")
    _report(db, [old], at=gone + timedelta(seconds=30), events=[off_bus])
    assert _sync(db, catalog, gone + timedelta(minutes=10)).opened == 1
    _report(db, [new], at=T0 + 3 * HOUR, ticks=5)

    counts = _sync(db, catalog, T0 + 3 * HOUR + timedelta(minutes=5))
    assert counts == LifecycleCounts(opened=1, failures=1, replacements=1)
    [ended] = _lifetimes(db, "OLD1")
    assert ended.end_kind == "failure" and ended.removed_at == gone + timedelta(seconds=30)
    assert "Xid 79" in ended.cause and "replaced by NEW1" in ended.cause
    assert ended.evidence["xids"] == [79] and ended.evidence["rule"] == "xid79_off_bus"
    assert ended.evidence["replaced_by"] == "NEW1" and ended.evidence["count"] == 1
    assert ended.evidence["action"] == "reboot_node"
    [newcomer] = _lifetimes(db, "NEW1")
    assert newcomer.removed_at is None and newcomer.location == f"node-a/{PCI}"
    assert _sync(db, catalog, T0 + 4 * HOUR) == NOTHING


def test_swap_without_fatal_xid_is_a_retirement(db: Database, catalog: XidCatalog) -> None:
    old, new, neighbour = _gpu("OLD2"), _gpu("NEW2"), _gpu("N2", index=1)
    _report(db, [old, neighbour], at=T0, ticks=5, events=[_xid(old, 13, T0 + timedelta(minutes=2))])
    _report(db, [new, neighbour], at=T0 + 2 * HOUR, ticks=5)

    counts = _sync(db, catalog, T0 + 2 * HOUR + timedelta(minutes=5))
    assert counts == LifecycleCounts(opened=3, replacements=1)
    [ended] = _lifetimes(db, "OLD2")
    assert ended.end_kind == "retirement" and ended.removed_at == T0 + timedelta(minutes=4)
    assert ended.cause == "replaced by NEW2, no fatal verdict on record"
    assert ended.evidence == {"replaced_by": "NEW2"}
    assert _lifetimes(db, "N2")[0].removed_at is None  # the other slot is untouched


def test_dbe_then_silence_is_a_failure_at_the_xid(db: Database, catalog: XidCatalog) -> None:
    bad, good = _gpu("DBE1", index=0), _gpu("OK1", index=1)
    fault = T0 + timedelta(minutes=29, seconds=10)
    _report(db, [bad, good], at=T0, ticks=30, events=[_xid(bad, 48, fault)])
    _report(db, [good], at=T0 + 3 * HOUR)
    assert _sync(db, catalog, T0 + timedelta(minutes=45)) == LifecycleCounts(opened=2)

    assert _sync(db, catalog, T0 + 3 * HOUR) == LifecycleCounts(failures=1)
    [ended] = _lifetimes(db, "DBE1")
    assert ended.end_kind == "failure" and ended.removed_at == fault
    assert "Xid 48" in ended.cause and ended.evidence["rule"] == "xid48_solo"
    assert "replaced_by" not in ended.evidence
    assert _lifetimes(db, "OK1")[0].end_kind is None
    assert _sync(db, catalog, T0 + 4 * HOUR) == NOTHING


def test_gpu_lost_then_silence_is_a_failure(db: Database, catalog: XidCatalog) -> None:
    lost = _gpu("LOST1")
    at = T0 + timedelta(minutes=4, seconds=30)
    lost_event = {"kind": "gpu_lost", "ts": at.isoformat(), "uuid": lost["uuid"], "message": "lost"}
    _report(db, [lost], at=T0, ticks=5, events=[lost_event])
    assert _sync(db, catalog, T0 + 2 * HOUR) == LifecycleCounts(opened=1, failures=1)
    [ended] = _lifetimes(db, "LOST1")
    assert ended.removed_at == at and ended.evidence["rule"] == "gpu_lost"


def test_dbe_on_a_gpu_that_keeps_reporting_is_no_failure(db: Database, catalog: XidCatalog) -> None:
    gpu = _gpu("RESET1")
    _report(db, [gpu], at=T0, ticks=30, events=[_xid(gpu, 48, T0 + timedelta(minutes=29))])
    for hour in range(1, 4):
        _report(db, [gpu], at=T0 + hour * HOUR, ticks=2)
    assert _sync(db, catalog, T0 + 3 * HOUR + timedelta(minutes=5)) == LifecycleCounts(opened=1)
    # Back in service for hours after the reset: a later silence is not blamed on that DBE.
    assert _sync(db, catalog, T0 + 8 * HOUR) == NOTHING
    assert _lifetimes(db, "RESET1")[0].end_kind is None


def test_application_xid13_alone_is_no_failure(db: Database, catalog: XidCatalog) -> None:
    gpu = _gpu("APP1")
    _report(db, [gpu], at=T0, ticks=10, events=[_xid(gpu, 13, T0 + timedelta(minutes=9))])
    assert _sync(db, catalog, T0 + 5 * HOUR) == LifecycleCounts(opened=1)
    assert _lifetimes(db, "APP1")[0].removed_at is None


def test_repeated_xid13_counts_against_the_gpu_but_is_no_failure(
    db: Database, catalog: XidCatalog
) -> None:
    gpu = _gpu("APP2")
    repeat = [_xid(gpu, 13, T0 + timedelta(minutes=m)) for m in (2, 6, 9)]  # xid13_repeat: warning
    _report(db, [gpu], at=T0, ticks=10, events=repeat)
    assert _sync(db, catalog, T0 + 5 * HOUR) == LifecycleCounts(opened=1)
    assert _lifetimes(db, "APP2")[0].removed_at is None


def test_failed_gpu_back_from_repair_gets_a_new_lifetime(db: Database, catalog: XidCatalog) -> None:
    gpu = _gpu("RMA1")
    fault = T0 + timedelta(minutes=9)
    _report(db, [gpu], at=T0, ticks=10, events=[_xid(gpu, 79, fault)])
    assert _sync(db, catalog, T0 + 2 * HOUR) == LifecycleCounts(opened=1, failures=1)
    back = T0 + timedelta(days=3)
    _report(db, [gpu], at=back, ticks=5)

    assert _sync(db, catalog, back + timedelta(minutes=5)) == LifecycleCounts(returned=1)
    first, second = _lifetimes(db, "RMA1")
    assert first.end_kind == "failure" and first.removed_at == fault
    assert second.installed_at == back and second.removed_at is None
    assert second.source == "observed" and second.gpu_uuid == gpu["uuid"]
    assert _sync(db, catalog, back + HOUR) == NOTHING


def test_import_rows_are_never_touched(db: Database, catalog: XidCatalog) -> None:
    kept, back = _gpu("IMP1", index=0), _gpu("IMP2", index=1)
    with db.write() as conn:
        # One statement per row: an executemany takes its columns from the first row only.
        conn.execute(
            insert(gpu_lifetimes).values(
                serial="IMP1", installed_at=T0 - 400 * DAY, source="import"
            )
        )
        conn.execute(insert(gpu_lifetimes).values(serial="IMP2", installed_at=T0 - 400 * DAY,
                                                  source="import", removed_at=T0 - 30 * DAY,
                                                  end_kind="failure", cause="DBE"))  # fmt: skip
    imported = _all(db)
    _report(db, [kept, back], at=T0, ticks=5, events=[_xid(kept, 79, T0 + timedelta(minutes=4))])

    assert _sync(db, catalog, T0 + 3 * HOUR) == LifecycleCounts(returned=1)
    assert (
        _all(db)[:2] == imported
    )  # the open import row is not failed, the closed one not reopened
    returned = _lifetimes(db, "IMP2")[-1]
    assert returned.source == "observed" and returned.installed_at == T0
    assert _sync(db, catalog, T0 + 4 * HOUR) == NOTHING


def test_sync_query_count_does_not_grow_with_the_fleet(db: Database, catalog: XidCatalog) -> None:
    def fleet(nodes: range) -> None:
        for n in nodes:
            node = f"node-{n:03d}"
            _report(db, [_gpu(f"S{n}-{i}", node=node, index=i) for i in range(8)], at=T0, node=node)

    def queries(now: datetime) -> tuple[int, LifecycleCounts]:
        seen: list[str] = []
        listen = lambda *args: seen.append(args[2])  # noqa: E731
        event.listen(db.engine, "before_cursor_execute", listen)
        try:
            counts = _sync(db, catalog, now)
        finally:
            event.remove(db.engine, "before_cursor_execute", listen)
        return len(seen), counts

    fleet(range(2))
    small, counts = queries(T0)
    assert counts.opened == 16
    fleet(range(2, 40))
    large, counts = queries(T0)
    assert counts.opened == 38 * 8
    assert large <= small
    with db.read() as conn:
        assert conn.execute(select(func.count()).select_from(gpus)).scalar_one() == 40 * 8
