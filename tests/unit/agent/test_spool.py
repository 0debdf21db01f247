"""The durable spool: order, priority, acknowledgement, bound, drop accounting, restarts."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from fleetwatch.agent import spool_disk
from fleetwatch.agent.spool import DropReport, SetAside, Spool


def test_spool_returns_critical_first_then_oldest(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put("a", b"A", samples=1, events=0)
    spool.put("b", b"B", samples=1, events=0)
    spool.put("x", b"X", samples=0, events=1, critical=True)
    order = []
    while (batch := spool.next()) is not None:
        order.append(batch.batch_id)
        spool.ack(batch.seq)
    assert order == ["x", "a", "b"]
    assert spool.depth() == (0, 0)


def test_spool_keeps_unacknowledged_batches_across_restart(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put("a", b"body-a", samples=8, events=0)
    spool.put("b", b"body-b", samples=8, events=0)
    first = spool.next()
    assert first is not None
    spool.ack(first.seq)
    spool.close()
    reopened = Spool(tmp_path)
    batch = reopened.next()
    assert batch is not None and (batch.batch_id, batch.body) == ("b", b"body-b")
    assert reopened.depth() == (1, 6)


def test_spool_drops_oldest_routine_batches_past_its_bound_and_counts_them(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path, max_bytes=1024 * 1024)
    chunk = b"x" * (300 * 1024)
    spool.put("critical", chunk, samples=0, events=1, critical=True)
    for i in range(5):
        spool.put(f"r{i}", chunk, samples=8, events=0)
    batches, size = spool.depth()
    assert size <= 1024 * 1024 and batches == 3
    kept = []
    while (batch := spool.next()) is not None:
        kept.append(batch.batch_id)
        spool.ack(batch.seq)
    assert kept == ["critical", "r3", "r4"]
    assert spool.counter("dropped_batches") == 3
    report = spool.take_drop_report()
    assert (report.batches, report.samples, report.events) == (3, 24, 0)
    assert not spool.take_drop_report()  # taken once
    spool.restore_drop_report(report)
    assert spool.take_drop_report() == report


def test_spool_keeps_a_drop_report_whose_carrier_batch_is_dropped_too(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1024 * 1024)
    big = b"x" * (700 * 1024)
    spool.put("a", big, samples=8, events=0)
    spool.put("b", big, samples=8, events=0)  # drops a
    report = spool.take_drop_report()
    assert (report.batches, report.samples) == (1, 8)
    spool.put("c", big, samples=8, events=1, carries=report)  # drops b
    spool.put("d", big, samples=8, events=0)  # drops c, and with it the report it carried
    final = spool.take_drop_report()
    assert (final.batches, final.samples, final.events) == (3, 24, 1)


# -- a full disk ---------------------------------------------------------------------------
# The spool caps its SQLite file at the disk's free space beyond a reserve; with the free space
# read as 0 the cap freezes at the pages in use, and SQLite answers SQLITE_FULL exactly as on a
# full disk (tests/faults/test_agent_full_disk.py does it on a real full tmpfs).


def _disk_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spool_disk, "free_bytes", lambda directory: 0)


def _kept(spool: Spool) -> list[str]:
    kept = []
    skip = 0
    while (batch := spool.next(skip)) is not None:
        kept.append(batch.batch_id)
        skip += 1
    return kept


def test_spool_on_a_full_disk_drops_the_oldest_routine_batches_and_counts_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = Spool(tmp_path)
    body = os.urandom(8192)
    spool.put("critical", body, samples=0, events=1, critical=True)
    for i in range(6):
        assert spool.put(f"r{i}", body, samples=8, events=0)
    _disk_is_full(monkeypatch)
    for i in range(6, 10):
        assert spool.put(f"r{i}", body, samples=8, events=0)  # stored: older ones gave way
    kept = _kept(spool)
    dropped = spool.counter("dropped_batches")
    assert kept[0] == "critical"
    routine = kept[1:]
    # The newest are kept, the oldest dropped, and every drop is counted.
    assert routine == [f"r{i}" for i in range(10 - len(routine), 10)]
    assert dropped == 10 - len(routine) > 0
    report = spool.take_drop_report()
    assert (report.batches, report.samples, report.events) == (dropped, 8 * dropped, 0)


def test_spool_on_a_full_disk_keeps_critical_batches_over_a_new_routine_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = Spool(tmp_path)
    body = os.urandom(8192)
    spool.put("c1", body, samples=0, events=1, critical=True)
    spool.put("c2", body, samples=0, events=1, critical=True)
    _disk_is_full(monkeypatch)
    carried = DropReport(batches=2, samples=16, events=0)
    assert not spool.put("r", body, samples=8, events=0, carries=carried)
    assert _kept(spool) == ["c1", "c2"]
    assert spool.counter("dropped_batches") == 1
    # The new batch is counted, and the report it carried is due again.
    report = spool.take_drop_report()
    assert (report.batches, report.samples, report.events) == (3, 24, 0)
    # A new critical batch gives way to no routine one (none left): the oldest critical goes.
    assert spool.put("c3", body, samples=0, events=1, critical=True)
    assert _kept(spool) == ["c2", "c3"]


def test_spool_on_a_full_disk_still_acknowledges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = Spool(tmp_path)
    for i in range(3):
        spool.put(f"r{i}", os.urandom(8192), samples=8, events=0)
    _disk_is_full(monkeypatch)
    while (batch := spool.next()) is not None:
        spool.ack(batch.seq)
    assert spool.depth() == (0, 0)


# -- batches leaving without reaching the server --------------------------------------------


def _set_aside(batch_id: str) -> SetAside:
    return SetAside(batch_id, 1.0e9, 500, 5, 600.0, 8, 1, "internal error")


def test_spool_set_aside_counts_the_batch_and_keeps_what_it_carried(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put("poisoned", b"P", samples=8, events=1, carries=DropReport(2, 16, 0))
    batch = spool.next()
    assert batch is not None
    spool.set_aside(batch.seq, _set_aside("poisoned"))
    assert spool.depth() == (0, 0)
    assert spool.counter("set_aside_batches") == 1
    assert spool.counter("set_aside_samples") == 8
    assert spool.take_drop_report() == DropReport(2, 16, 0)  # the carried report is due again
    (report,) = spool.take_set_aside_reports("carrier-1")
    assert report == _set_aside("poisoned")


def test_spool_set_aside_reports_leave_only_when_their_carrier_is_acknowledged(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path, max_bytes=1024 * 1024)
    spool.put("poisoned", b"P", samples=8, events=0)
    first = spool.next()
    assert first is not None
    spool.set_aside(first.seq, _set_aside("poisoned"))
    assert len(spool.take_set_aside_reports("carrier-1")) == 1
    assert spool.take_set_aside_reports("carrier-2") == []  # claimed once
    big = b"x" * (700 * 1024)
    spool.put("carrier-1", big, samples=8, events=1)
    spool.put("other", big, samples=8, events=0)  # past the bound: drops carrier-1
    assert len(spool.take_set_aside_reports("carrier-3")) == 1  # due again
    spool.release_set_aside_reports("carrier-3")  # carrier-3 was never spooled
    spool.close()
    reopened = Spool(tmp_path, max_bytes=1024 * 1024)
    assert len(reopened.take_set_aside_reports("carrier-4")) == 1
    reopened.put("carrier-4", b"C", samples=0, events=1, critical=True)
    carrier = reopened.next()
    assert carrier is not None and carrier.batch_id == "carrier-4"
    reopened.ack(carrier.seq)
    assert reopened.take_set_aside_reports("carrier-5") == []  # the server has it


def test_spool_reopened_releases_reports_claimed_by_a_batch_never_written(
    tmp_path: Path,
) -> None:
    spool = Spool(tmp_path)
    spool.put("poisoned", b"P", samples=8, events=0)
    first = spool.next()
    assert first is not None
    spool.set_aside(first.seq, _set_aside("poisoned"))
    assert len(spool.take_set_aside_reports("lost-in-a-crash")) == 1
    spool.close()
    assert len(Spool(tmp_path).take_set_aside_reports("next")) == 1


def test_spool_reject_keeps_the_drop_report_the_batch_carried(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put("refused", b"R", samples=8, events=1, carries=DropReport(3, 24, 0))
    batch = spool.next()
    assert batch is not None
    spool.reject(batch.seq)
    assert spool.depth() == (0, 0)
    assert spool.take_drop_report() == DropReport(3, 24, 0)
    assert spool.counter("set_aside_batches") == 0


def test_spool_reads_an_io_error_as_a_full_disk_only_when_the_disk_has_no_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    io_error = sqlite3.OperationalError("disk I/O error")
    io_error.sqlite_errorcode = sqlite3.SQLITE_IOERR_WRITE  # type: ignore[attr-defined]
    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode = sqlite3.SQLITE_FULL  # type: ignore[attr-defined]
    assert spool_disk.is_disk_full(full, tmp_path, 1024)
    assert not spool_disk.is_disk_full(io_error, tmp_path, 1024)  # the disk has room: real I/O
    _disk_is_full(monkeypatch)
    assert spool_disk.is_disk_full(io_error, tmp_path, 1024)  # ENOSPC surfacing as an I/O error
    locked = sqlite3.OperationalError("database is locked")
    locked.sqlite_errorcode = sqlite3.SQLITE_BUSY  # type: ignore[attr-defined]
    assert not spool_disk.is_disk_full(locked, tmp_path, 1024)
