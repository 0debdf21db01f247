"""The durable spool: order, priority, acknowledgement, bound, drop accounting, restarts."""

from __future__ import annotations

from pathlib import Path

from fleetwatch.agent.spool import Spool


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
