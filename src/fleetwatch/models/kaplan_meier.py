"""Kaplan–Meier survival for reporting (lifelines ``KaplanMeierFitter``), as plain numbers.

Reports and dashboards get arrays and dicts, never lifelines objects: the estimate is the
product-limit :math:`\\hat S(t) = \\prod_{t_i \\le t} (1 - d_i / n_i)` over distinct failure times.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SurvivalCurve", "kaplan_meier"]


@dataclass(frozen=True)
class SurvivalCurve:
    n: int
    failures: int
    median_days: float | None  # None while more than half survive
    survival_at: dict[float, float]  # S(t) at the asked days
    days: list[float]  # the curve, down-sampled to at most ``points`` steps
    survival: list[float]


def kaplan_meier(
    durations_days: Sequence[float],
    failed: Sequence[bool],
    *,
    at_days: Sequence[float] = (),
    points: int = 60,
) -> SurvivalCurve:
    """The product-limit estimate of right-censored lifetimes (``failed`` False = censored)."""
    from lifelines import KaplanMeierFitter

    if len(durations_days) != len(failed) or not durations_days:
        raise ValueError("need as many failure flags as durations, and at least one lifetime")
    fitter = KaplanMeierFitter().fit(list(durations_days), list(failed), label="S")
    curve = fitter.survival_function_["S"]
    step = max(len(curve) // points, 1)
    sampled = curve.iloc[::step]
    median = float(fitter.median_survival_time_)
    return SurvivalCurve(
        n=len(durations_days),
        failures=int(sum(bool(f) for f in failed)),
        median_days=median if median != float("inf") else None,
        survival_at={float(t): float(fitter.predict(float(t))) for t in at_days},
        days=[float(t) for t in sampled.index],
        survival=[float(s) for s in sampled.to_numpy()],
    )
