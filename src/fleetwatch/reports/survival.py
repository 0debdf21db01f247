"""Kaplan–Meier survival of GPU lifetimes by SKU, over every lifetime on record."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from sqlalchemy import Row

from fleetwatch.models.kaplan_meier import kaplan_meier

__all__ = ["km_by_sku"]

_AT_DAYS = (30, 90, 180, 365)
_CURVE_POINTS = 60


def km_by_sku(lifetimes: list[Row[Any]], now: datetime) -> dict[str, Any]:
    """Per SKU: n, failures, median survival (days), S(t) at 30/90/180/365 days and the curve.

    Duration = (removed_at, else ``now``) - installed_at in days; event = ended in a failure.
    """
    groups: dict[str, tuple[list[float], list[bool]]] = defaultdict(lambda: ([], []))
    for lt in lifetimes:
        end = lt.removed_at if lt.removed_at is not None else now
        days = max((end - lt.installed_at).total_seconds() / 86400.0, 1e-6)
        durations, observed = groups[lt.sku or "unknown"]
        durations.append(days)
        observed.append(lt.end_kind == "failure")
    result: dict[str, Any] = {}
    for sku in sorted(groups):
        durations, observed = groups[sku]
        km = kaplan_meier(durations, observed, at_days=_AT_DAYS, points=_CURVE_POINTS)
        result[sku] = {
            "n": km.n,
            "failures": km.failures,
            "median_days": km.median_days,
            "survival_at_days": {str(t): round(km.survival_at[float(t)], 4) for t in _AT_DAYS},
            "curve": {
                "days": [round(t, 3) for t in km.days],
                "survival": [round(v, 5) for v in km.survival],
            },
        }
    return result
