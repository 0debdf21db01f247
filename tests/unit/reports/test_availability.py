"""The availability figures against an independent minute-by-minute computation
(:mod:`tests.unit.reports.timeline_check`), on hand-made cases, a random fortnight and a
simulated quarter."""

from __future__ import annotations

import statistics
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from tests.unit.reports.timeline_check import MIN, random_period, sampled, sim_quarter

from fleetwatch.reports.availability import (
    Checkpoint,
    FleetPeriod,
    JobRecord,
    Outage,
    Restart,
    SlaTargets,
    StragglerSpan,
    compute_availability,
    merge,
)

T0 = datetime(2026, 11, 23, tzinfo=UTC)
H = timedelta(hours=1)
TARGETS = SlaTargets(availability=0.999, recovery_minutes=15.0)


def test_availability_hand_made_week_planned_excluded_from_workload_figure() -> None:
    p = FleetPeriod(
        since=T0,
        until=T0 + 100 * H,
        nodes={"a": {"sku": "H100"}, "b": {"sku": "H100"}},
        planned={"a": [(T0 + 10 * H, T0 + 20 * H)]},
        # b: 5 h outage, 2 h of it inside... no planned on b; a: outage overlapping its window
        outages=[
            Outage("b", T0 + 50 * H, T0 + 55 * H),
            Outage("a", T0 + 18 * H, T0 + 22 * H),
        ],
    )
    fleet = compute_availability(p, TARGETS)["fleet"]
    assert fleet["node_hours"] == 200
    assert fleet["planned_down_h"] == 10
    assert fleet["unplanned_down_h"] == 5 + 2  # a's outage less the planned hours it overlaps
    assert fleet["infrastructure_availability"] == pytest.approx(183 / 200)
    assert fleet["workload_availability"] == pytest.approx(183 / 190)
    assert fleet["planned_unplanned_ratio"] == pytest.approx(10 / 7)
    assert fleet["failures"] == 2 and fleet["mtbf_h"] == pytest.approx(183 / 2)
    assert fleet["mttr_h"] == pytest.approx((5 + 4) / 2)


def test_availability_nothing_to_compute_is_none_not_zero() -> None:
    p = FleetPeriod(since=T0, until=T0 + H, nodes={})
    out = compute_availability(p, TARGETS)
    assert out["fleet"]["infrastructure_availability"] is None
    assert out["fleet"]["mtbf_h"] is None and out["fleet"]["mttr_h"] is None
    assert out["jobs"]["success_rate"] is None and out["goodput"]["goodput_ratio"] is None
    assert out["sla"]["availability_met"] is None and out["sla"]["recovery_met"] is None
    with pytest.raises(ValueError, match="until"):
        compute_availability(FleetPeriod(since=T0, until=T0, nodes={}), TARGETS)


def test_merge_joins_overlapping_and_touching_intervals() -> None:
    spans = [(T0 + 3 * H, T0 + 4 * H), (T0, T0 + H), (T0 + H, T0 + 2 * H), (T0, T0 + H / 2)]
    assert merge(spans) == [(T0, T0 + 2 * H), (T0 + 3 * H, T0 + 4 * H)]


def _check_against_sampling(p: FleetPeriod, by: str | None) -> None:
    out = compute_availability(p, TARGETS, by=(by,) if by else ())
    ours = out["by"][by] if by else {"all": out["fleet"]}
    theirs = sampled(p, by)
    assert set(ours) == set(theirs)
    for key, g in theirs.items():
        o = ours[key]
        up = g["exp"] - g["planned"] - g["unplanned"]
        assert o["node_hours"] == pytest.approx(g["exp"] / 60, abs=1e-9), key
        assert o["planned_down_h"] == pytest.approx(g["planned"] / 60, abs=1e-9), key
        assert o["unplanned_down_h"] == pytest.approx(g["unplanned"] / 60, abs=1e-9), key
        assert o["infrastructure_availability"] == pytest.approx(up / g["exp"]), key
        assert o["workload_availability"] == pytest.approx(up / (g["exp"] - g["planned"])), key
        assert o["failures"] == g["starts"], key
        assert o["mtbf_h"] == pytest.approx(up / 60 / g["starts"] if g["starts"] else None)
        assert o["repairs"] == len(g["repairs"]), key
        mttr = statistics.fmean(g["repairs"]) / 3600 if g["repairs"] else None
        assert o["mttr_h"] == pytest.approx(mttr), key


def _sampled_goodput(p: FleetPeriod) -> dict[str, float]:
    """GPU-minutes per minute of the period, summed; redone work added as reported."""
    n = int((p.until - p.since) / MIN)

    def mask(a: datetime, b: datetime | None) -> Any:
        out = np.zeros(n, dtype=bool)
        i, j = max(int((a - p.since) / MIN), 0), min(int(((b or p.until) - p.since) / MIN), n)
        out[i:j] = j > i
        return out

    started = {j.job_id: j for j in p.jobs if j.started_at is not None}
    sched = ckpt = restart = wait = 0.0
    for j in started.values():
        assert j.started_at is not None
        sched += j.ranks * mask(j.started_at, j.ended_at).sum()
    for c in p.checkpoints:
        if c.job_id in started:
            end = c.started_at + timedelta(seconds=c.duration_s)
            ckpt += started[c.job_id].ranks * mask(c.started_at, end).sum()
    for r in p.restarts:
        if r.job_id in started:
            if r.interrupted_at is not None:
                restart += started[r.job_id].ranks * mask(r.interrupted_at, r.resumed_at).sum()
            if r.lost_s is not None and p.since <= r.resumed_at < p.until:
                restart += started[r.job_id].ranks * r.lost_s / 60
    for s in p.stragglers:
        if s.job_id in started:
            wait += started[s.job_id].ranks * mask(s.start, s.end).sum() * (1 - 1 / s.ratio)
    return {"sched": sched / 60, "ckpt": ckpt / 60, "restart": restart / 60, "wait": wait / 60}


def _check_jobs_and_goodput(p: FleetPeriod) -> None:
    out = compute_availability(p, TARGETS, by=())
    g = _sampled_goodput(p)
    gp = out["goodput"]
    assert gp["scheduled_gpu_h"] == pytest.approx(g["sched"])
    assert gp["checkpoint_gpu_h"] == pytest.approx(g["ckpt"])
    assert gp["restart_gpu_h"] == pytest.approx(g["restart"])
    assert gp["straggler_gpu_h"] == pytest.approx(g["wait"])
    good = max(g["sched"] - g["ckpt"] - g["restart"] - g["wait"], 0)
    assert gp["goodput_ratio"] == pytest.approx(good / g["sched"])
    ended = [j for j in p.jobs if j.ended_at and p.since <= j.ended_at < p.until]
    ok = sum(j.outcome == "completed" for j in ended)
    bad = sum(j.outcome == "failed" for j in ended)
    jobs = out["jobs"]
    assert (jobs["completed"], jobs["failed"]) == (ok, bad)
    assert jobs["success_rate"] == pytest.approx(ok / (ok + bad))
    assert jobs["interrupted_by_hardware"] == sum(
        j.hardware and j.outcome == "failed" for j in ended
    )
    slow = {s.node for s in p.stragglers if s.kind == "hardware"
            and s.start < p.until and (s.end is None or s.end > p.since)}  # fmt: skip
    assert out["slow_nodes"]["share"] == pytest.approx(len(slow) / len(p.nodes))
    resumed = [(r.resumed_at - r.interrupted_at).total_seconds() / 60 for r in p.restarts
               if r.interrupted_at and p.since <= r.resumed_at < p.until]  # fmt: skip
    ttr = out["time_to_recover"]["job_resumed"]
    assert ttr["count"] == len(resumed) > 0
    assert ttr["mean_min"] == pytest.approx(statistics.fmean(resumed))
    assert ttr["median_min"] == pytest.approx(statistics.median(resumed))
    sla = out["sla"]
    assert sla["recovery_basis"] == "job_resumed"
    assert sla["recovery_met"] == (statistics.fmean(resumed) <= TARGETS.recovery_minutes)
    assert sla["availability_met"] == (out["fleet"]["workload_availability"] >= 0.999)


@pytest.mark.parametrize("by", [None, "sku", "rack"])
def test_availability_matches_minute_sampling_on_a_random_fortnight(by: str | None) -> None:
    p = random_period(np.random.default_rng(1414), nodes=30, days=14)
    assert any(not p.nodes[n].get("rack") for n in p.nodes)  # the "unknown" group is exercised
    _check_against_sampling(p, by)


def test_jobs_goodput_and_recovery_match_sampling_on_a_random_fortnight() -> None:
    _check_jobs_and_goodput(random_period(np.random.default_rng(1415), nodes=30, days=14))


@pytest.mark.parametrize("seed", [91, 92])
def test_availability_matches_minute_sampling_on_a_simulated_quarter(seed: int) -> None:
    p = random_period(np.random.default_rng(seed), nodes=40, days=91)
    _check_against_sampling(p, None)
    _check_against_sampling(p, "sku")
    _check_jobs_and_goodput(p)


def test_goodput_checkpoint_restart_and_straggler_losses_by_hand() -> None:
    job = JobRecord("j", ("a",), 8, T0, T0 + 10 * H, "completed")
    p = FleetPeriod(
        since=T0,
        until=T0 + 10 * H,
        nodes={"a": {}},
        jobs=[job],
        checkpoints=[Checkpoint("j", T0 + H, 360.0)],  # 0.1 h
        restarts=[Restart("j", T0 + 3 * H, T0 + 2.5 * H, 1800.0)],  # 0.5 h down + 0.5 h redone
        stragglers=[StragglerSpan("j", "a", "hardware", T0 + 5 * H, T0 + 7 * H, 2.0)],  # 1 h
    )
    gp = compute_availability(p, TARGETS)["goodput"]
    assert gp["scheduled_gpu_h"] == pytest.approx(80)
    assert gp["checkpoint_gpu_h"] == pytest.approx(0.8)
    assert gp["restart_gpu_h"] == pytest.approx(8.0)
    assert gp["straggler_gpu_h"] == pytest.approx(8.0)
    assert gp["goodput_ratio"] == pytest.approx((80 - 16.8) / 80)


@pytest.mark.parametrize("by", [None, "sku", "rack"])
def test_availability_matches_minute_sampling_on_a_quarter_of_the_simulated_fleet(
    by: str | None,
) -> None:
    p = sim_quarter(seed=14, nodes=48)
    assert any(p.planned.values()) and p.outages and p.stragglers and p.restarts
    _check_against_sampling(p, by)
    if by is None:
        _check_jobs_and_goodput(p)
