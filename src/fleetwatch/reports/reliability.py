"""Reliability arithmetic shared by the weekly report and its validation on public failure logs.

MTBF = exposure hours / failures; MTTR = mean repair duration; A = MTBF / (MTBF + MTTR).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

__all__ = ["availability", "hours", "mtbf_hours", "mttr_hours", "overlap_hours"]


def hours(start: datetime, end: datetime) -> float:
    return (end - start).total_seconds() / 3600.0


def overlap_hours(
    start: datetime, end: datetime | None, window_start: datetime, window_end: datetime
) -> float:
    """Hours of ``[start, end)`` (open-ended when ``end`` is None) inside the window."""
    lo = max(start, window_start)
    hi = window_end if end is None else min(end, window_end)
    return max(hours(lo, hi), 0.0)


def mtbf_hours(exposure_h: float, failures: int) -> float | None:
    """Mean time between failures: exposure hours / failures; None without a failure."""
    if exposure_h < 0 or failures < 0:
        raise ValueError("exposure_h and failures must be >= 0")
    return exposure_h / failures if failures else None


def mttr_hours(repairs: Iterable[tuple[datetime, datetime]]) -> float | None:
    """Mean time to repair over ``(down, back)`` pairs; None without a repair."""
    durations = [hours(down, back) for down, back in repairs]
    if any(d < 0 for d in durations):
        raise ValueError("a repair ends before it starts")
    return sum(durations) / len(durations) if durations else None


def availability(mtbf_h: float | None, mttr_h: float | None) -> float | None:
    """MTBF / (MTBF + MTTR): 1.0 without a failure, None when failures have no known repair."""
    if mtbf_h is None:
        return 1.0
    if mttr_h is None:
        return None
    return mtbf_h / (mtbf_h + mttr_h) if mtbf_h + mttr_h > 0 else None
