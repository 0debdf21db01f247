"""Staged collections and how they become batches: grouping, and the spool's atomic combine."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fleetwatch.agent import batching, spool_disk
from fleetwatch.agent.batching import combine_ticks, split_critical, tick_body, ticks_per_push
from fleetwatch.agent.spool import DropReport, SetAside, Spool
from fleetwatch.agent.spool_staging import Combine, NewBatch, StagedTick
from fleetwatch.telemetry import Batch, Event, GpuIdentity, GpuSample, NodeInfo

T0 = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)
NODE = NodeInfo(name="node-1", interval_s=10, push_interval_s=60, boot_id="boot-a")


def _uuid(i: int) -> str:
    return f"GPU-00000000-0000-0000-0000-{i:012d}"


def _tick(
    at: datetime, *, gpus: int = 2, node: NodeInfo = NODE, driver: str = "550", seq: int = 0
) -> StagedTick:
    batch = Batch(
        batch_id="staged",
        node=node,
        gpus=[GpuIdentity(uuid=_uuid(i), index=i, driver_version=driver) for i in range(gpus)],
        samples=[GpuSample(uuid=_uuid(i), ts=at, gpu_temp_c=40.0 + i % 8) for i in range(gpus)],
    )
    return StagedTick(seq, at.timestamp(), gpus, 0, tick_body(batch))


@pytest.mark.parametrize(
    ("interval", "push", "ticks"),
    [(10, 60, 6), (10, 0, 1), (10, 10, 1), (10, 5, 1), (10, 24, 2), (10, 25, 3), (0.5, 60, 120)],
)
def test_ticks_per_push_is_the_push_interval_in_whole_intervals(
    interval: float, push: float, ticks: int
) -> None:
    assert ticks_per_push(interval, push) == ticks


def test_split_critical_keeps_xid_and_lost_gpus_for_at_once() -> None:
    events = [
        Event(kind="xid", xid=79, ts=T0),
        Event(kind="nvml", ts=T0),
        Event(kind="gpu_lost", ts=T0),
    ]
    critical, routine = split_critical(events)
    assert [e.kind for e in critical] == ["xid", "gpu_lost"]
    assert [e.kind for e in routine] == ["nvml"]


def test_combine_ticks_makes_one_batch_declaring_each_gpu_once_as_last_seen() -> None:
    ticks = [
        _tick(T0 + timedelta(seconds=10 * i), gpus=8, driver=f"55{i}", seq=i) for i in range(6)
    ]
    (batch,) = combine_ticks(ticks, node=NODE, carrier="carrier", extra_events=[])
    assert batch.batch_id == "carrier"
    assert len(batch.samples) == 48
    assert len({(s.uuid, s.ts) for s in batch.samples}) == 48
    assert [g.uuid for g in batch.gpus] == [_uuid(i) for i in range(8)]
    assert {g.driver_version for g in batch.gpus} == {"555"}  # the newest tick's identity
    assert batch.node.push_interval_s == 60


def test_combine_ticks_keeps_ticks_of_another_boot_in_their_own_batch() -> None:
    rebooted = NODE.model_copy(update={"boot_id": "boot-b"})
    ticks = [
        _tick(T0, seq=1),
        _tick(T0 + timedelta(seconds=10), seq=2),
        _tick(T0 + timedelta(seconds=20), node=rebooted, seq=3),
    ]
    first, second = combine_ticks(ticks, node=rebooted, carrier="c", extra_events=[])
    assert (first.node.boot_id, len(first.samples)) == ("boot-a", 4)
    assert (second.node.boot_id, len(second.samples)) == ("boot-b", 2)
    assert first.batch_id == "c" and second.batch_id != "c"


def test_combine_ticks_never_puts_two_readings_of_one_gpu_instant_in_a_batch() -> None:
    # A clock stepped back: the server would refuse one batch holding both readings (422).
    ticks = [_tick(T0, seq=1), _tick(T0 + timedelta(seconds=10), seq=2), _tick(T0, seq=3)]
    batches = combine_ticks(ticks, node=NODE, carrier="c", extra_events=[])
    assert [len(b.samples) for b in batches] == [4, 2]
    for batch in batches:
        assert len({(s.uuid, s.ts) for s in batch.samples}) == len(batch.samples)


def test_combine_ticks_splits_batches_larger_than_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ticks = [_tick(T0 + timedelta(seconds=10 * i), seq=i) for i in range(5)]
    monkeypatch.setattr(batching, "MAX_BATCH_BYTES", 2 * len(ticks[0].body) + 10)
    batches = combine_ticks(ticks, node=NODE, carrier="c", extra_events=[])
    assert [len(b.samples) for b in batches] == [4, 4, 2]
    assert sum(len(b.samples) for b in batches) == 10


def test_combine_ticks_sends_reports_even_with_nothing_staged() -> None:
    report = Event(kind="spool_dropped", ts=T0, message="dropped 3 batches")
    (batch,) = combine_ticks([], node=NODE, carrier="c", extra_events=[report])
    assert (batch.batch_id, batch.samples, batch.events) == ("c", [], [report])
    assert combine_ticks([], node=NODE, carrier="c", extra_events=[]) == []


# -- the spool's side ------------------------------------------------------------------------


def _make(carrier: str) -> Combine:
    def make(
        ticks: list[StagedTick], report: DropReport, aside: list[SetAside]
    ) -> Sequence[NewBatch]:
        extra = [Event(kind="spool_dropped", ts=T0, details={"batches": report.batches})]
        batches = combine_ticks(
            ticks, node=NODE, carrier=carrier, extra_events=extra if report else []
        )
        return [NewBatch(b.batch_id, tick_body(b), len(b.samples), len(b.events)) for b in batches]

    return make


def _stage(spool: Spool, tick: StagedTick) -> None:
    assert spool.stage(tick.body, collected=tick.collected, samples=tick.samples, events=0)


def test_spool_keeps_staged_ticks_across_a_restart(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for i in range(3):
        _stage(spool, _tick(T0 + timedelta(seconds=10 * i)))
    spool.close()
    reopened = Spool(tmp_path)
    assert reopened.staged() == (3, T0.timestamp())
    made = reopened.combine_staged(_make("c"), carrier="c")
    assert made is not None and [b.samples for b in made] == [6]
    assert reopened.staged() == (0, None)
    assert reopened.depth()[0] == 1


def test_spool_combine_is_all_or_nothing_when_it_fails_midway(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1024 * 1024)
    spool.put("a", b"x" * (700 * 1024), samples=8, events=0)
    spool.put("b", b"x" * (700 * 1024), samples=8, events=0)  # drops a: a report is due
    for i in range(3):
        _stage(spool, _tick(T0 + timedelta(seconds=10 * i)))

    def crash(ticks: list[StagedTick], report: DropReport, aside: list[SetAside]) -> list[NewBatch]:
        _make("c")(ticks, report, aside)
        raise KeyboardInterrupt  # the process dies after building, before committing

    with pytest.raises(KeyboardInterrupt):
        spool.combine_staged(crash, carrier="c")
    # Nothing moved: the ticks are staged, no batch was added, the report is still due.
    assert spool.staged()[0] == 3
    assert spool.depth()[0] == 1
    made = spool.combine_staged(_make("c"), carrier="c")
    assert made is not None and [(b.batch_id, b.samples) for b in made] == [("c", 6)]
    assert spool.staged()[0] == 0
    assert not spool.take_drop_report()  # carried by batch c
    body = json.loads(next(b.body for b in made))
    assert body["events"][0]["details"] == {"batches": 1}


def test_spool_combine_refuses_to_lose_the_reports(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1024 * 1024)
    spool.put("a", b"x" * (700 * 1024), samples=8, events=0)
    spool.put("b", b"x" * (700 * 1024), samples=8, events=0)
    _stage(spool, _tick(T0))
    with pytest.raises(ValueError, match="carry the reports"):
        spool.combine_staged(_make("not-the-carrier"), carrier="c")
    assert spool.staged()[0] == 1
    assert spool.take_drop_report() == DropReport(1, 8, 0)


def test_spool_stages_on_a_full_disk_by_dropping_the_oldest_routine_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = Spool(tmp_path)
    for i in range(4):
        spool.put(f"r{i}", bytes(8192 + i), samples=8, events=0)
    monkeypatch.setattr(spool_disk, "free_bytes", lambda directory: 0)
    staged = 0
    while spool.counter("dropped_batches") == 0:
        _stage(spool, _tick(T0 + timedelta(seconds=10 * staged), gpus=8))
        staged += 1
        assert staged < 1000, "the disk never filled"
    assert spool.staged()[0] == staged  # the new tick was kept; an old batch gave way
    assert spool.next() is not None and spool.next().batch_id != "r0"  # type: ignore[union-attr]


def test_spool_combine_on_a_full_disk_with_nothing_to_give_way_keeps_the_ticks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = Spool(tmp_path)
    for i in range(3):  # large enough that their batch needs pages of its own
        _stage(spool, _tick(T0 + timedelta(seconds=10 * i), gpus=300))
    monkeypatch.setattr(spool_disk, "free_bytes", lambda directory: 0)
    assert spool.combine_staged(_make("c"), carrier="c") is None
    assert spool.staged()[0] == 3
    assert spool.depth()[0] == 0
    monkeypatch.undo()  # room again: the same ticks combine
    made = spool.combine_staged(_make("c"), carrier="c")
    assert made is not None and [b.samples for b in made] == [900]
