"""The figures operators are held to, over a period ``[since, until)``, from plain inputs.

Definitions (docs/telling.md's "Availability" says the same):

* **Exposure** of a node: ``[max(since, node joined), until)``, in node-hours.
* **Planned downtime**: the node's maintenance windows, clipped to its exposure (given, not
  computed here: :attr:`FleetPeriod.planned`).
* **Unplanned downtime**: the union of the node's outages (:class:`Outage`: a drain until the
  node's return, a GPU failure until its slot is refilled), less any planned time; an outage
  still open runs to ``until``.
* **Up** = exposure - planned - unplanned.
* **Infrastructure availability** = up / exposure: every hour down counts.
* **Workload availability** = up / (exposure - planned): planned downtime is excluded from the
  denominator, so a maintenance window costs nothing here. This is the figure the SLA target
  (``sla_availability``) is held against.
* **Planned : unplanned** = planned hours / unplanned hours (none without unplanned downtime).
  Where no maintenance windows are known at all (``planned_known: false``) both planned hours
  and the ratio are none, and workload availability equals infrastructure availability.
* **Failures** are a node's outage *episodes* (overlapping or touching outages merged) that
  start in the period; **MTBF** = up hours / failures; **MTTR** = mean length of the episodes
  that end in the period (their whole length, also the part before ``since``). By group, a
  node's group is its label's value (``sku``, ``rack``, any label; ``unknown`` when missing).
* **Time to recover**: failure to node back (the same episodes as MTTR), and failure to job
  resumed (restarts that report when the job stopped, resumed in the period).
* **Jobs**: those that ended in the period. Success rate = completed / (completed + failed);
  cancelled jobs are neither. Interrupted by hardware: failed jobs with a failure of one of
  their nodes near their end (:mod:`fleetwatch.reports.job_failures`).
* **Goodput** (GPU-hours, one GPU per rank): scheduled = ranks x the job's time in the period
  (from its reported start; a job that reported no start, or no ranks, is not counted).
  Losses: checkpoint overhead (ranks x checkpoint time); restart and lost work (ranks x
  (interruption to resume + redone work)); waiting on stragglers (ranks x a straggler verdict's
  time x (1 - 1 / ratio): the whole job runs at the slow node's pace). Goodput = scheduled -
  losses (at least 0); losses that overlap are each counted.
* **Slow nodes**: nodes with a hardware straggler verdict open at any time in the period, over
  all nodes.
* **SLA**: availability met when workload availability >= target; recovery met when the mean
  time to recover (job resumed where any job reported it, else node back) <= target minutes.

A figure with nothing to compute it from is ``None``, never 0.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

__all__ = [
    "Checkpoint",
    "FleetPeriod",
    "Interval",
    "JobRecord",
    "Outage",
    "Restart",
    "SlaTargets",
    "StragglerSpan",
    "compute_availability",
    "episodes",
    "merge",
]

Interval = tuple[datetime, datetime]


@dataclass(frozen=True)
class Outage:
    node: str
    start: datetime
    end: datetime | None  # None: still down
    cause: str = "unknown"


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    nodes: tuple[str, ...]
    ranks: int
    started_at: datetime | None
    ended_at: datetime | None
    outcome: str | None  # completed | failed | cancelled; None while running
    hardware: bool = False  # a failed job attributed to a node failure


@dataclass(frozen=True)
class Checkpoint:
    job_id: str
    started_at: datetime
    duration_s: float


@dataclass(frozen=True)
class Restart:
    job_id: str
    resumed_at: datetime
    interrupted_at: datetime | None
    lost_s: float | None  # redone work, seconds; None when unknown


@dataclass(frozen=True)
class StragglerSpan:
    job_id: str
    node: str
    kind: str  # hardware | workload
    start: datetime
    end: datetime | None
    ratio: float


@dataclass(frozen=True)
class SlaTargets:
    availability: float
    recovery_minutes: float


@dataclass
class FleetPeriod:
    """Everything the figures are computed from."""

    since: datetime
    until: datetime
    nodes: Mapping[str, Mapping[str, Any]]  # node -> labels (``sku`` among them when known)
    joined: Mapping[str, datetime] = field(default_factory=dict)  # node -> first seen
    planned: Mapping[str, Sequence[Interval]] = field(default_factory=dict)
    outages: Sequence[Outage] = ()
    jobs: Sequence[JobRecord] = ()
    checkpoints: Sequence[Checkpoint] = ()
    restarts: Sequence[Restart] = ()
    stragglers: Sequence[StragglerSpan] = ()
    # False where no maintenance windows are known: planned hours are then unknown, not 0.
    planned_known: bool = True


def _h(seconds: float) -> float:
    return seconds / 3600.0


def _span(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds()


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of ``intervals`` as sorted, disjoint intervals (touching ones joined).

    An empty interval (``a == b``) is kept: an outage fixed within the clock's resolution is
    still a failure (LANL's log has some), with a repair time of 0."""
    out: list[Interval] = []
    for a, b in sorted(intervals):
        if b < a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _clip(intervals: Iterable[Interval], lo: datetime, hi: datetime) -> list[Interval]:
    return merge((max(a, lo), min(b, hi)) for a, b in intervals)


def _length(intervals: Iterable[Interval]) -> float:
    return sum(_span(a, b) for a, b in intervals)


def _minus(base: list[Interval], cut: list[Interval]) -> list[Interval]:
    """``base`` less ``cut``; both sorted and disjoint."""
    out: list[Interval] = []
    j = 0
    for a, b in base:
        while j < len(cut) and cut[j][1] <= a:
            j += 1
        k, cur = j, a
        while k < len(cut) and cut[k][0] < b:
            if cut[k][0] > cur:
                out.append((cur, cut[k][0]))
            cur = max(cur, cut[k][1])
            k += 1
        if cur < b:
            out.append((cur, b))
    return out


def episodes(outages: Iterable[Outage], until: datetime) -> dict[str, list[Interval]]:
    """Each node's outage episodes: its outages merged, an open one running to ``until``."""
    by_node: dict[str, list[Interval]] = {}
    for o in outages:
        by_node.setdefault(o.node, []).append((o.start, o.end if o.end is not None else until))
    return {n: merge(spans) for n, spans in by_node.items()}


def _stats(values_s: list[float]) -> dict[str, Any]:
    if not values_s:
        return {"count": 0, "mean_min": None, "median_min": None, "max_min": None}
    minutes = [v / 60.0 for v in values_s]
    return {
        "count": len(minutes),
        "mean_min": statistics.fmean(minutes),
        "median_min": statistics.median(minutes),
        "max_min": max(minutes),
    }


@dataclass
class _NodeTime:
    exposure_s: float = 0.0
    planned_s: float = 0.0
    unplanned_s: float = 0.0
    failures: int = 0
    repairs_s: list[float] = field(default_factory=list)


def _node_times(p: FleetPeriod) -> dict[str, _NodeTime]:
    eps = episodes(p.outages, p.until)
    out: dict[str, _NodeTime] = {}
    for node in p.nodes:
        lo = max(p.since, p.joined.get(node, p.since))
        t = out[node] = _NodeTime()
        if lo >= p.until:
            continue
        t.exposure_s = _span(lo, p.until)
        planned = _clip(p.planned.get(node, ()), lo, p.until)
        t.planned_s = _length(planned)
        mine = eps.get(node, [])
        t.unplanned_s = _length(_minus(_clip(mine, lo, p.until), planned))
        t.failures = sum(1 for a, _ in mine if lo <= a < p.until)
        t.repairs_s = [_span(a, b) for a, b in mine if p.since < b < p.until]
    return out


def _availability(times: Iterable[_NodeTime]) -> dict[str, Any]:
    group = list(times)
    exposure = sum(t.exposure_s for t in group)
    planned = sum(t.planned_s for t in group)
    unplanned = sum(t.unplanned_s for t in group)
    up = exposure - planned - unplanned
    failures = sum(t.failures for t in group)
    repairs = [r for t in group for r in t.repairs_s]
    return {
        "nodes": len(group),
        "node_hours": _h(exposure),
        "up_h": _h(up),
        "planned_down_h": _h(planned),
        "unplanned_down_h": _h(unplanned),
        "planned_unplanned_ratio": planned / unplanned if unplanned else None,
        "infrastructure_availability": up / exposure if exposure else None,
        "workload_availability": up / (exposure - planned) if exposure > planned else None,
        "failures": failures,
        "mtbf_h": _h(up) / failures if failures else None,
        "mttr_h": _h(statistics.fmean(repairs)) if repairs else None,
        "repairs": len(repairs),
    }


def _overlap_s(a: datetime, b: datetime | None, lo: datetime, hi: datetime) -> float:
    end = hi if b is None else min(b, hi)
    return max(_span(max(a, lo), end), 0.0)


def _jobs(p: FleetPeriod) -> dict[str, Any]:
    ended = [j for j in p.jobs if j.ended_at is not None and p.since <= j.ended_at < p.until]
    counts = {k: sum(1 for j in ended if j.outcome == k) for k in ("completed", "failed")}
    counts["cancelled"] = sum(1 for j in ended if j.outcome == "cancelled")
    decided = counts["completed"] + counts["failed"]
    hardware = sum(1 for j in ended if j.outcome == "failed" and j.hardware)
    return {
        "ended": len(ended),
        **counts,
        "success_rate": counts["completed"] / decided if decided else None,
        "interrupted_by_hardware": hardware,
        "hardware_share_of_failed": hardware / counts["failed"] if counts["failed"] else None,
    }


def _goodput(p: FleetPeriod) -> dict[str, Any]:
    counted = [j for j in p.jobs if j.started_at is not None and j.ranks > 0]
    ranks = {j.job_id: j.ranks for j in counted}
    scheduled = sum(
        j.ranks * _overlap_s(j.started_at, j.ended_at, p.since, p.until)
        for j in counted
        if j.started_at is not None
    )
    checkpoint = sum(
        ranks[c.job_id]
        * _overlap_s(c.started_at, c.started_at + timedelta(seconds=c.duration_s), p.since, p.until)
        for c in p.checkpoints
        if c.job_id in ranks
    )
    restart, unknown_lost = 0.0, 0
    for r in p.restarts:
        if r.job_id not in ranks:
            continue
        if r.interrupted_at is not None:
            restart += ranks[r.job_id] * _overlap_s(
                r.interrupted_at, r.resumed_at, p.since, p.until
            )
        if p.since <= r.resumed_at < p.until:
            if r.lost_s is None:
                unknown_lost += 1
            else:
                restart += ranks[r.job_id] * r.lost_s
    waiting = sum(
        ranks[s.job_id] * _overlap_s(s.start, s.end, p.since, p.until) * (1 - 1 / s.ratio)
        for s in p.stragglers
        if s.job_id in ranks and s.ratio > 1
    )
    lost = checkpoint + restart + waiting
    good = max(scheduled - lost, 0.0)
    return {
        "scheduled_gpu_h": _h(scheduled),
        "checkpoint_gpu_h": _h(checkpoint),
        "restart_gpu_h": _h(restart),
        "straggler_gpu_h": _h(waiting),
        "lost_gpu_h": _h(lost),
        "goodput_gpu_h": _h(good),
        "goodput_ratio": good / scheduled if scheduled else None,
        "restarts_lost_work_unknown": unknown_lost,
    }


def _slow_nodes(p: FleetPeriod) -> dict[str, Any]:
    slow = {
        s.node
        for s in p.stragglers
        if s.kind == "hardware" and s.start < p.until and (s.end is None or s.end > p.since)
    }
    return {
        "slow_nodes": len(slow),
        "share": len(slow) / len(p.nodes) if p.nodes else None,
    }


def _recovery(p: FleetPeriod, times: Mapping[str, _NodeTime]) -> dict[str, Any]:
    node_back = [r for t in times.values() for r in t.repairs_s]
    resumed = [
        _span(r.interrupted_at, r.resumed_at)
        for r in p.restarts
        if r.interrupted_at is not None and p.since <= r.resumed_at < p.until
    ]
    return {"node_back": _stats(node_back), "job_resumed": _stats(resumed)}


def _sla(fleet: dict[str, Any], recovery: dict[str, Any], targets: SlaTargets) -> dict[str, Any]:
    a = fleet["workload_availability"]
    basis = "job_resumed" if recovery["job_resumed"]["count"] else "node_back"
    mean = recovery[basis]["mean_min"]
    return {
        "availability_target": targets.availability,
        "availability": a,
        "availability_met": None if a is None else a >= targets.availability,
        "recovery_target_min": targets.recovery_minutes,
        "recovery_basis": basis,
        "recovery_mean_min": mean,
        "recovery_met": None if mean is None else mean <= targets.recovery_minutes,
    }


def _label(labels: Mapping[str, Any], key: str) -> str:
    value = labels.get(key)
    return "unknown" if value is None or value == "" else str(value)


def compute_availability(
    p: FleetPeriod, targets: SlaTargets, by: Sequence[str] = ("sku", "rack")
) -> dict[str, Any]:
    """All the figures over ``p``; ``by`` names the node labels to break MTBF and MTTR down by."""
    if p.until <= p.since:
        raise ValueError("until must be after since")
    times = _node_times(p)
    fleet = _availability(times.values())
    fleet["planned_known"] = p.planned_known
    if not p.planned_known:
        fleet["planned_down_h"] = fleet["planned_unplanned_ratio"] = None
    groups: dict[str, dict[str, Any]] = {}
    for key in by:
        members: dict[str, list[_NodeTime]] = {}
        for node, labels in p.nodes.items():
            members.setdefault(_label(labels, key), []).append(times[node])
        groups[key] = {value: _availability(ts) for value, ts in sorted(members.items())}
    recovery = _recovery(p, times)
    return {
        "since": p.since.isoformat(),
        "until": p.until.isoformat(),
        "fleet": fleet,
        "by": groups,
        "jobs": _jobs(p),
        "goodput": _goodput(p),
        "slow_nodes": _slow_nodes(p),
        "time_to_recover": recovery,
        "sla": _sla(fleet, recovery, targets),
    }
