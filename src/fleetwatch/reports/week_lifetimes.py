"""The week's failures, slot refills and drains, read off its lifetimes and evictions."""

from __future__ import annotations

import bisect
from collections import defaultdict
from datetime import datetime
from typing import Any

from fleetwatch.reports.rows import CONFIRM_WINDOW, WeekData

__all__ = ["drains", "failures", "installs", "near", "replaced_at", "replacements", "within"]


def within(ts: datetime | None, start: datetime, end: datetime) -> bool:
    return ts is not None and start <= ts < end


def failures(d: WeekData) -> list[Any]:
    """Lifetimes that ended in a failure during the week."""
    return [
        lt
        for lt in d.lifetimes
        if lt.end_kind == "failure" and within(lt.removed_at, d.start, d.end)
    ]


def installs(d: WeekData) -> dict[str, list[datetime]]:
    """Install times by location (the slot), sorted."""
    by_slot: dict[str, list[datetime]] = defaultdict(list)
    for lt in d.lifetimes:
        if lt.location:
            by_slot[lt.location].append(lt.installed_at)
    for times in by_slot.values():
        times.sort()
    return by_slot


def replaced_at(slots: dict[str, list[datetime]], lt: Any, end: datetime) -> datetime | None:
    """When the failed GPU's slot got its next GPU, if before ``end``."""
    times = slots.get(lt.location, []) if lt.location else []
    i = bisect.bisect_left(times, lt.removed_at)
    return times[i] if i < len(times) and times[i] < end else None


def replacements(d: WeekData, failed: list[Any]) -> list[tuple[datetime, datetime]]:
    """(failed, replacement installed) for failures whose slot got a new GPU before week end."""
    slots = installs(d)
    pairs = []
    for lt in failed:
        back = replaced_at(slots, lt, d.end)
        if back is not None:
            pairs.append((lt.removed_at, back))
    return pairs


def drains(d: WeekData) -> list[Any]:
    """Evictions whose drain was performed (not a dry run) during the week."""
    return [e for e in d.evictions if not e.dry_run and within(e.completed_at, d.start, d.end)]


def near(ts: datetime, times: list[datetime]) -> bool:
    """Whether sorted ``times`` has one within :data:`CONFIRM_WINDOW` of ``ts``."""
    i = bisect.bisect_left(times, ts - CONFIRM_WINDOW)
    return i < len(times) and times[i] <= ts + CONFIRM_WINDOW
