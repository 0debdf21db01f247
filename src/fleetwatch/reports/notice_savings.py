"""Work saved by drain notices (issue 15) over a period ``[since, until)``, from plain inputs.

Definitions (docs/telling.md's "Work saved by notices" says the same):

* **Failures**: hardware failures in the period (a GPU lifetime ended by a failure, or a drain
  by a rule: :class:`~fleetwatch.reports.job_failures.NodeFailure`) on a node a job ran on at
  the time (the job's start, or first report, to its end, or last report, plus ``after``).
* A failure at ``F`` is **preceded by a notice** when a notice about its node (for any job) was
  opened at ``T`` with ``F - lookback <= T < F`` and not cleared before ``F``; the earliest such
  ``T`` counts. **Lead time** = ``F - T``, p50 / p90 (linear interpolation) over those failures.
* **Interrupted jobs**: jobs that failed in the period, attributed to a node failure at ``F``
  (:mod:`fleetwatch.reports.job_failures`). Their own notice about that node is the one that counts.
  A checkpoint counts at its completion (start + duration).
* **Saved** (GPU-hours, one GPU per rank) = ranks x (last checkpoint completed in ``[T, F]`` -
  last checkpoint completed before ``T``, else the job's start); 0 when the job did not
  checkpoint after the notice; none for a job without a notice.
* **Still lost** = ranks x (``F`` - last checkpoint completed before ``F``, else the job's start).

A figure with nothing to compute it from is ``None``, never 0: no job ran on a failed node, no
notice was ever stored, no interrupted job.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from fleetwatch.reports.job_failures import NodeFailure, attribute_failure, failures_by_node

__all__ = ["NOTICE_LOOKBACK", "JobSpan", "Notice", "notice_savings", "percentile"]

# A notice opened longer than this before a failure is not counted as warning of it.
NOTICE_LOOKBACK = timedelta(days=7)


@dataclass(frozen=True)
class Notice:
    job_id: str
    node: str
    opened_at: datetime
    cleared_at: datetime | None


@dataclass(frozen=True)
class JobSpan:
    job_id: str
    nodes: tuple[str, ...]
    ranks: int
    start: datetime | None  # its reported start, else its first report
    end: datetime | None  # its reported end, else its last report; None while running
    outcome: str | None
    ended_at: datetime | None  # its reported end only


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) with linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _h(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds() / 3600.0


def _first_notice(
    notices: Sequence[Notice], node: str, at: datetime, lookback: timedelta, job_id: str | None
) -> datetime | None:
    """The earliest notice about ``node`` open at ``at`` and opened within ``lookback``."""
    opened = [
        n.opened_at
        for n in notices
        if n.node == node
        and (job_id is None or n.job_id == job_id)
        and at - lookback <= n.opened_at < at
        and (n.cleared_at is None or n.cleared_at >= at)
    ]
    return min(opened, default=None)


def _ran_at(job: JobSpan, node: str, at: datetime, after: timedelta) -> bool:
    if node not in job.nodes or job.start is None or job.start > at:
        return False
    return job.end is None or at <= job.end + after


def _last_before(done: Sequence[datetime], at: datetime, *, inclusive: bool) -> datetime | None:
    i = (bisect.bisect_right if inclusive else bisect.bisect_left)(done, at)
    return done[i - 1] if i else None


def _job_row(
    job: JobSpan,
    failure: NodeFailure,
    notice_at: datetime | None,
    done: Sequence[datetime],
) -> dict[str, Any]:
    f = failure.at
    last = _last_before(done, f, inclusive=True) or job.start
    lost = job.ranks * max(_h(last, f), 0.0) if last is not None else None
    saved: float | None = None
    if notice_at is not None:
        after = _last_before(done, f, inclusive=True)
        if after is None or after < notice_at:
            saved = 0.0
        else:
            base = _last_before(done, notice_at, inclusive=False) or job.start
            saved = job.ranks * max(_h(base, after), 0.0) if base is not None else None
    return {
        "job_id": job.job_id,
        "node": failure.node,
        "failure_at": f.isoformat(),
        "failure_kind": failure.kind,
        "notice_at": notice_at.isoformat() if notice_at else None,
        "ranks": job.ranks,
        "saved_gpu_h": saved,
        "lost_gpu_h": lost,
    }


def _total(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def notice_savings(
    *,
    since: datetime,
    until: datetime,
    failures: Sequence[NodeFailure],
    jobs: Sequence[JobSpan],
    notices: Sequence[Notice],
    notices_known: bool,
    checkpoints_done: Mapping[str, Sequence[datetime]],
    before: timedelta,
    after: timedelta,
    lookback: timedelta = NOTICE_LOOKBACK,
) -> dict[str, Any]:
    """The section's figures. ``notices_known``: whether any notice was ever stored (else the
    notice figures are none); ``checkpoints_done``: each job's checkpoint completion times."""
    in_period = [f for f in failures if since <= f.at < until]
    on_job_nodes = [f for f in in_period if any(_ran_at(j, f.node, f.at, after) for j in jobs)]
    leads = []
    for f in on_job_nodes:
        t = _first_notice(notices, f.node, f.at, lookback, None)
        if t is not None:
            leads.append(_h(t, f.at))
    by_node = failures_by_node(failures)
    rows = []
    for job in jobs:
        ended = job.ended_at
        if job.outcome != "failed" or ended is None or not since <= ended < until:
            continue
        failure = attribute_failure(job.nodes, ended, by_node, before=before, after=after)
        if failure is None:
            continue
        notice_at = (
            _first_notice(notices, failure.node, failure.at, lookback, job.job_id)
            if notices_known
            else None
        )
        done = sorted(checkpoints_done.get(job.job_id, ()))
        rows.append(_job_row(job, failure, notice_at, done))
    counted = bool(on_job_nodes)
    with_notice = len(leads) if counted and notices_known else None
    return {
        "lookback_h": lookback.total_seconds() / 3600.0,
        "failures_on_job_nodes": len(on_job_nodes) if jobs else None,
        "preceded_by_notice": with_notice,
        "share_preceded": with_notice / len(on_job_nodes) if with_notice is not None else None,
        "lead_h": {"p50": percentile(leads, 50), "p90": percentile(leads, 90)},
        "interrupted_jobs": len(rows) if jobs else None,
        "saved_gpu_h": _total([r["saved_gpu_h"] for r in rows]),
        "lost_gpu_h": _total([r["lost_gpu_h"] for r in rows]),
        "jobs": rows,
    }
