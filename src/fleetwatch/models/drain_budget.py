"""What a ranking is worth to an operator: drain the k riskiest GPUs each week, count the hits.

Model-agnostic: the input is a sequence of decision points (:class:`WeekRisks`), each with the
units in service, a risk per unit (any score: only its order matters) and each unit's failure
time if it fails at all. Whatever model, baseline or coin produced the risks, the same budget
gives comparable figures.

Definitions, for decision times :math:`t_0 < t_1 < \\dots < t_m` (days), a budget of :math:`k`
drains per decision and a horizon :math:`H` (days):

**Eligible** at :math:`t_i`
    a unit listed at :math:`t_i` that has not been drained at an earlier decision (a drained
    GPU leaves the pool for good: it is not returned within the period) and has not failed by
    then (its failure time :math:`f` is unknown/NaN or :math:`f > t_i`; a unit already failed
    is not eligible).
**Drained** at :math:`t_i`
    the :math:`\\min(k, \\text{eligible})` eligible units with the highest risk; ties go to the
    unit listed first (a stable sort), so a run is reproducible.
**Hit**
    a drain at :math:`t_i` of a unit with :math:`t_i < f \\le t_i + H`: it would have failed
    within the horizon after its drain.
**Period's failures**
    the distinct units listed while eligible at some decision whose failure time lies in
    :math:`(t_0, t_m + H]`; a unit's failure time is read from its first eligible listing. A
    unit never eligible at a decision (installed and failed between two of them) cannot be
    drained and is not known here.
**Precision** :math:`= \\text{hits} / \\text{drains}` (NaN with no drains).
**Recall** :math:`= \\text{hits} / \\text{period's failures}` (NaN with none): every hit is a
    failure of the period caught before it happened, within :math:`H` of its drain, and each
    unit is drained at most once, so this is the share of the period's failures caught.
**Lead time** of a hit :math:`= f - t_i` (days, in :math:`(0, H]`); the **median lead time** is
    the median over the hits (NaN with none).

Budgets are fractions of the fleet (:data:`BUDGET_FRACTIONS`: 0.1 %, 0.5 %, 1 %), turned into
whole GPUs per decision by :func:`budget_k`.

Examples
--------
>>> import numpy as np
>>> week = WeekRisks(0.0, ["a", "b", "c"], np.array([0.9, 0.5, 0.1]),
...                  np.array([3.0, np.nan, 5.0]))
>>> point = simulate_drains([week], k=1, horizon_days=7.0)
>>> point.hits, point.precision, point.recall, point.median_lead_days
(1, 1.0, 0.5, 3.0)
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "BUDGET_FRACTIONS",
    "BudgetPoint",
    "WeekRisks",
    "budget_curve",
    "budget_k",
    "curve_ks",
    "simulate_drains",
]

BUDGET_FRACTIONS = (0.001, 0.005, 0.01)
"""The drain budgets the issue asks about, as fractions of the fleet per week."""


@dataclass(frozen=True)
class WeekRisks:
    """One decision point: the units in service at ``at``, their risk and failure time.

    Parameters
    ----------
    at : float
        Decision time, in days from any fixed origin.
    units : sequence of hashable
        Unit identifiers (serial, UUID), unique within the week.
    risk : ndarray of float
        One finite score per unit; higher drains first.
    failure : ndarray of float
        Each unit's failure time on the same clock as ``at``; NaN if it is not known to fail.
    """

    at: float
    units: Sequence[Hashable]
    risk: NDArray[np.float64]
    failure: NDArray[np.float64]

    def __post_init__(self) -> None:
        n = len(self.units)
        if len(self.risk) != n or len(self.failure) != n:
            raise ValueError(
                f"week at {self.at:g}: {n} units but {len(self.risk)} risks and "
                f"{len(self.failure)} failure times; give one of each per unit"
            )
        if n and not np.isfinite(np.asarray(self.risk, dtype=np.float64)).all():
            raise ValueError(f"week at {self.at:g}: risks must be finite (no NaN or inf)")


@dataclass(frozen=True)
class BudgetPoint:
    """Outcome of one budget :math:`k` over a sequence of weeks (definitions: module doc).

    ``risk_at_k`` is the median, over the decisions that drained anything, of the lowest risk
    drained: the risk threshold that this budget amounts to.
    """

    k: int
    drains: int
    hits: int
    failures: int
    precision: float
    recall: float
    median_lead_days: float
    risk_at_k: float


def budget_k(fleet_size: int, fraction: float) -> int:
    """Drains per decision for a budget of ``fraction`` of a fleet of ``fleet_size``: the
    nearest whole number, at least 1 (0.1 % of 320 GPUs is one drain, not none).

    >>> budget_k(18_000, 0.001), budget_k(320, 0.001), budget_k(320, 0.01)
    (18, 1, 3)
    """
    if fleet_size < 1 or not 0.0 < fraction <= 1.0:
        raise ValueError(
            f"need fleet_size >= 1 and 0 < fraction <= 1, got {fleet_size}, {fraction}"
        )
    return max(1, round(fraction * fleet_size))


def curve_ks(fleet_size: int, max_fraction: float = 0.02, points: int = 25) -> list[int]:
    """A grid of budgets for the curve: about ``points`` values from 1 to ``max_fraction`` of
    the fleet, spaced evenly in log k, plus the budgets of :data:`BUDGET_FRACTIONS`; sorted,
    distinct.

    >>> curve_ks(320, points=4)
    [1, 2, 3, 6]
    """
    top = budget_k(fleet_size, max_fraction)
    grid = np.unique(np.round(np.geomspace(1, top, max(points, 2))).astype(int))
    marked = {budget_k(fleet_size, f) for f in BUDGET_FRACTIONS}
    return sorted({int(k) for k in grid} | marked)


def _eligible(week: WeekRisks) -> NDArray[np.bool_]:
    f = np.asarray(week.failure, dtype=np.float64)
    return np.isnan(f) | (f > week.at)


def _period_failures(weeks: Sequence[WeekRisks], horizon_days: float) -> dict[Hashable, float]:
    first: dict[Hashable, float] = {}
    for week in weeks:
        ok = _eligible(week)
        for unit, f, good in zip(week.units, week.failure, ok, strict=True):
            if good and unit not in first:
                first[unit] = float(f)
    lo, hi = weeks[0].at, weeks[-1].at + horizon_days
    return {u: f for u, f in first.items() if not math.isnan(f) and lo < f <= hi}


def _check(weeks: Sequence[WeekRisks], horizon_days: float) -> None:
    if not weeks:
        raise ValueError("no weeks: give at least one decision point")
    if not horizon_days > 0:
        raise ValueError(f"horizon_days must be > 0, got {horizon_days}")
    times = [w.at for w in weeks]
    if any(b <= a for a, b in zip(times, times[1:], strict=False)):
        raise ValueError("decision times must increase strictly; sort the weeks by 'at'")


class _Ranked:
    """Each week's eligible units, riskiest first (sorted once for every budget)."""

    def __init__(self, weeks: Sequence[WeekRisks]) -> None:
        self.weeks: list[tuple[float, list[Hashable], NDArray[np.float64], NDArray[np.float64]]]
        self.weeks = []
        for week in weeks:
            ok = np.flatnonzero(_eligible(week))
            risk = np.asarray(week.risk, dtype=np.float64)[ok]
            order = ok[np.argsort(-risk, kind="stable")]
            units = [week.units[i] for i in order]
            self.weeks.append(
                (
                    float(week.at),
                    units,
                    np.asarray(week.risk, dtype=np.float64)[order],
                    np.asarray(week.failure, dtype=np.float64)[order],
                )
            )

    def run(self, k: int, horizon_days: float, n_failures: int) -> BudgetPoint:
        drained: set[Hashable] = set()
        drains = hits = 0
        leads: list[float] = []
        lowest: list[float] = []
        for at, units, risk, failure in self.weeks:
            taken = 0
            for j, unit in enumerate(units):
                if taken == k:
                    break
                if unit in drained:
                    continue
                drained.add(unit)
                taken += 1
                lead = failure[j] - at  # NaN (no failure) compares False below
                if 0.0 < lead <= horizon_days:
                    hits += 1
                    leads.append(float(lead))
                last = float(risk[j])
            drains += taken
            if taken:
                lowest.append(last)
        return BudgetPoint(
            k=k,
            drains=drains,
            hits=hits,
            failures=n_failures,
            precision=hits / drains if drains else math.nan,
            recall=hits / n_failures if n_failures else math.nan,
            median_lead_days=float(np.median(leads)) if leads else math.nan,
            risk_at_k=float(np.median(lowest)) if lowest else math.nan,
        )


def simulate_drains(weeks: Sequence[WeekRisks], k: int, horizon_days: float) -> BudgetPoint:
    """Drain the ``k`` riskiest eligible units at each decision; precision, recall, lead time.

    Parameters
    ----------
    weeks : sequence of WeekRisks
        Decision points in increasing time.
    k : int
        Drains per decision (>= 1).
    horizon_days : float
        :math:`H`: a drain is a hit if its unit fails within this many days after it.

    Returns
    -------
    BudgetPoint
        With the definitions of the module docstring.
    """
    return budget_curve(weeks, [k], horizon_days)[0]


def budget_curve(
    weeks: Sequence[WeekRisks], ks: Iterable[int], horizon_days: float
) -> list[BudgetPoint]:
    """:func:`simulate_drains` for each budget of ``ks`` (each run from an empty drained set).

    Raises
    ------
    ValueError
        With no weeks, a horizon <= 0, decision times not increasing, or a budget < 1.
    """
    _check(weeks, horizon_days)
    budgets = [int(k) for k in ks]
    if any(k < 1 for k in budgets):
        raise ValueError(f"every budget must be >= 1 drain, got {budgets}")
    ranked = _Ranked(weeks)
    n_failures = len(_period_failures(weeks, horizon_days))
    return [ranked.run(k, horizon_days, n_failures) for k in budgets]
