"""FleetJudge's in-memory window: thinned past the short windows, and the rules still fire."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fleetwatch.rules.health import BootSample, judge_health
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.rules.xid_catalog import XidCatalog
from fleetwatch.server.judge.judging import FleetJudge
from fleetwatch.telemetry import GpuSample

UUID = "GPU-11111111-2222-3333-4444-555555555555"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _window(seconds: int, step: int, **values: object) -> list[BootSample]:
    return [
        BootSample("boot-1", GpuSample.model_construct(
            uuid=UUID, ts=NOW - timedelta(seconds=seconds - t), **values))
        for t in range(0, seconds + 1, step)
    ]  # fmt: skip


def test_a_ten_second_window_keeps_the_last_minute_whole_and_one_sample_per_step_before() -> None:
    judge = FleetJudge(catalog=XidCatalog.load(), thresholds=HealthThresholds())
    window = _window(900, 10, gpu_temp_c=50.0)
    thinned = judge._thinned(window)
    dense = [s for s in thinned if s.sample.ts >= NOW - judge.dense]
    assert len(dense) == len([s for s in window if s.sample.ts >= NOW - judge.dense])
    gaps = [
        (b.sample.ts - a.sample.ts).total_seconds()
        for a, b in zip(thinned, thinned[1:], strict=False)
        if b.sample.ts < NOW - judge.dense
    ]
    assert gaps and min(gaps) >= judge.sparse_step.total_seconds()
    assert len(thinned) < len(window) / 2
    assert thinned[0] is window[0] and thinned[-1] is window[-1]


def test_persistent_throttling_and_an_sbe_rate_are_still_judged_on_the_thinned_window() -> None:
    judge = FleetJudge(catalog=XidCatalog.load(), thresholds=HealthThresholds())
    window = [
        BootSample("boot-1", GpuSample.model_construct(
            uuid=UUID, ts=NOW - timedelta(seconds=900 - t), clocks_event_reasons=0x40,
            ecc_sbe_volatile_total=t * 2, ecc_sbe_aggregate_total=t * 2, gpu_temp_c=60.0))
        for t in range(0, 901, 10)
    ]  # fmt: skip
    full = {v.rule for v in judge_health(window, thresholds=judge.thresholds, now=NOW)}
    thin = {v.rule for v in judge_health(judge._thinned(window), thresholds=judge.thresholds,
                                         now=NOW)}  # fmt: skip
    assert full == thin
    assert any("throttl" in rule for rule in thin), thin
    assert any("sbe" in rule for rule in thin), thin
