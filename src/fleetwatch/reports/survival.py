"""Kaplan–Meier survival of GPU lifetimes by SKU (lifelines), over every lifetime on record."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from sqlalchemy import Row

__all__ = ["km_by_sku"]

_AT_DAYS = (30, 90, 180, 365)
_CURVE_POINTS = 60


def km_by_sku(lifetimes: list[Row[Any]], now: datetime) -> dict[str, Any]:
    """Per SKU: n, failures, median survival (days), S(t) at 30/90/180/365 days and the curve.

    Duration = (removed_at, else ``now``) - installed_at in days; event = ended in a failure.
    """
    from lifelines import KaplanMeierFitter

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
        fitter = KaplanMeierFitter().fit(durations, observed, label=sku)
        curve = fitter.survival_function_[sku]
        step = max(len(curve) // _CURVE_POINTS, 1)
        sampled = curve.iloc[::step]
        median = float(fitter.median_survival_time_)
        result[sku] = {
            "n": len(durations),
            "failures": int(sum(observed)),
            "median_days": median if median != float("inf") else None,
            "survival_at_days": {
                str(t): round(float(fitter.predict(float(t))), 4) for t in _AT_DAYS
            },
            "curve": {
                "days": [round(float(t), 3) for t in sampled.index],
                "survival": [round(float(s), 5) for s in sampled.to_numpy()],
            },
        }
    return result
