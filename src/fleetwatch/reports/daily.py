"""The fleet day by day over a period: GPU failures, drains and returns counted on the UTC day
they began or ended, and each day's workload availability, from the same outages, maintenance
windows and definitions as :func:`fleetwatch.reports.availability.compute_availability`.

Only nodes with an outage or planned downtime in the period go through the computation; every
other node was up whenever it was exposed, so it adds its exposure to both sides of the ratio.
That keeps 30 days of a 12,500-node fleet to 30 small computations instead of 30 whole ones.
"""

from __future__ import annotations

import bisect
from dataclasses import replace
from datetime import UTC, date, datetime, time, timedelta

from fleetwatch.charts.trends import DayFigures
from fleetwatch.reports.availability import FleetPeriod, SlaTargets, compute_availability

__all__ = ["daily_figures", "day_starts"]

_DAY = timedelta(days=1)
_ANY_TARGETS = SlaTargets(availability=1.0, recovery_minutes=0.0)  # unused: only "fleet" is read


def day_starts(until: datetime, days: int) -> list[datetime]:
    """Midnights (UTC) of the ``days`` days ending with ``until``'s day, oldest first."""
    last = datetime.combine(until.astimezone(UTC).date(), time(), tzinfo=UTC)
    return [last - _DAY * (days - 1 - i) for i in range(days)]


def _day(at: datetime) -> date:
    return at.astimezone(UTC).date()


def daily_figures(period: FleetPeriod, starts: list[datetime]) -> list[DayFigures]:
    """One :class:`DayFigures` per day starting at ``starts`` (the last may end after
    ``period.until``: it is cut there, today so far)."""
    wanted = {s.date() for s in starts}
    counts = {d: {"failures": 0, "drains": 0, "returns": 0} for d in wanted}
    for outage in period.outages:
        drain = outage.cause.startswith("drain")
        start_day = _day(outage.start)
        if start_day in counts and (drain or outage.cause == "gpu_failure"):
            counts[start_day]["drains" if drain else "failures"] += 1
        if drain and outage.end is not None and _day(outage.end) in counts:
            counts[_day(outage.end)]["returns"] += 1
    joined = sorted(period.joined.get(n, period.since) for n in period.nodes)
    out = []
    for start in starts:
        end = min(start + _DAY, period.until)
        availability = None
        if end > start:
            availability = _availability(period, joined, start, end)
        out.append(DayFigures(start.date(), **counts[start.date()], availability=availability))
    return out


def _exposure_h(joined: list[datetime], start: datetime, end: datetime) -> float:
    """Node-hours of ``[start, end)`` of nodes that joined at ``joined`` (sorted)."""
    before = bisect.bisect_right(joined, start)
    during = joined[before : bisect.bisect_left(joined, end)]
    seconds = before * (end - start).total_seconds()
    seconds += sum((end - j).total_seconds() for j in during)
    return seconds / 3600.0


def _availability(
    period: FleetPeriod, joined: list[datetime], start: datetime, end: datetime
) -> float | None:
    """The day's workload availability: nodes with an outage or planned time that day go
    through the computation; every other node was up whenever exposed."""
    outages = [o for o in period.outages if o.start < end and (o.end is None or o.end >= start)]
    touched = {o.node for o in outages} | {
        n for n, spans in period.planned.items() if any(a < end and b > start for a, b in spans)
    }
    touched &= set(period.nodes)
    mine = sorted(period.joined.get(n, period.since) for n in touched)
    calm_h = _exposure_h(joined, start, end) - _exposure_h(mine, start, end)
    up_h, exposed_h = calm_h, calm_h
    if touched:
        part = replace(
            period,
            since=start,
            until=end,
            nodes={n: {} for n in touched},
            outages=[o for o in outages if o.node in touched],
            jobs=(),
            checkpoints=(),
            restarts=(),
            stragglers=(),
        )
        fleet = compute_availability(part, _ANY_TARGETS, by=())["fleet"]
        up_h += fleet["up_h"]
        exposed_h += fleet["node_hours"] - (fleet["planned_down_h"] or 0.0)
    return up_h / exposed_h if exposed_h > 0 else None
