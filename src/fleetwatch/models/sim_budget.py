"""Drain budgets and job-notice thresholds on the simulator (issue 40 item 3).

Both read a :class:`~fleetwatch.models.sim_backtest.SimBacktestResult`'s ``scores``: every GPU
alive at each evaluation midnight of the held-out period (days after the cutoff), with the
model's 1- and 7-day risks, its age and the days until it fails.

**Weekly drain budget** (:func:`sim_weeks`, :func:`sim_budget`): every 7th evaluation midnight
is a decision; :mod:`~fleetwatch.models.drain_budget` drains the k riskiest GPUs there with
:math:`H` = 7 days. Rankings: ``model`` (its 7-day risk), ``age_only`` (oldest first) and
``random`` (``numpy.random.default_rng(seed)``). Budgets are fractions of the GPUs alive at the
cutoff.

**Job notices** (:func:`node_days`, :func:`notice_curve`): the server gives a running job a
``risk`` notice when :math:`1 - \\prod_g (1 - p_g)` over its node's GPUs (:math:`p_g`: P(failure
within the job's horizon), 24 h by default) reaches the threshold
(``ServerSettings.notice_risk_threshold``), and a ``gpu_out`` / ``drain_pending`` notice when a
rule flags one of the node's GPUs. On the simulator, at each evaluation midnight :math:`d` and
node:

* a **notice** is a node-day whose node risk reaches the threshold :math:`\\theta` (``risk``
  notices; with ``rules=True``, also node-days a rule flags a GPU of: every notice);
* it is **right** if a GPU of the node fails in :math:`(d, d + H]`, :math:`H` the notice
  horizon; **precision** = right / notices;
* the period's **failures** are the GPUs alive at some evaluation that fail in
  :math:`(d_0, d_{last} + H]`; a failure at :math:`f` is **warned** if its node had a notice at
  an evaluation :math:`d` with :math:`0 < f - d \\le H`; **recall** = warned / failures;
  **lead time** = :math:`f` minus the first such :math:`d`, in hours.

:func:`choose_threshold` picks the notice threshold from that curve: the lowest threshold whose
precision reaches a target, over at least ``min_notices`` notices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pandas as pd

from fleetwatch.models.drain_budget import (
    BUDGET_FRACTIONS,
    BudgetPoint,
    WeekRisks,
    budget_curve,
    budget_k,
    curve_ks,
)

__all__ = [
    "NOTICE_THRESHOLDS",
    "RANKINGS",
    "NoticePoint",
    "SimBudget",
    "budget_lines",
    "budget_rows",
    "choose_threshold",
    "node_days",
    "notice_curve",
    "sim_budget",
    "sim_weeks",
]

RANKINGS = ("model", "age_only", "random")
NOTICE_THRESHOLDS = tuple(sorted({float(f"{t:.2g}") for t in np.geomspace(0.005, 0.5, 41)}))
"""The thresholds of the notice curve: 0.005 to 0.5 about 12 % apart (evenly in log), each
rounded to two significant digits so that a chosen one is a plain setting (0.035, not
0.0354)."""
_RISK = {1.0: "risk_1d", 7.0: "risk_7d"}


class _Scored(Protocol):
    """What these functions read of a simulator backtest result."""

    @property
    def scores(self) -> pd.DataFrame: ...

    @property
    def gpu_nodes(self) -> dict[str, str]: ...


def sim_weeks(
    result: _Scored, ranking: str = "model", *, step_days: int = 7, seed: int = 0
) -> list[WeekRisks]:
    """The result's evaluation midnights 0, ``step_days``, ... as decision points (:math:`H` =
    7 days: the model's 7-day risk), ranked by ``ranking`` (one of :data:`RANKINGS`)."""
    if ranking not in RANKINGS:
        raise ValueError(f"ranking must be one of {RANKINGS}, got {ranking!r}")
    scores = result.scores
    rng = np.random.default_rng(seed)
    out = []
    for day in range(0, int(scores["day"].max()) + 1, step_days):
        rows = scores[scores["day"] == day]
        to_fail = rows["days_to_failure"].to_numpy(dtype=np.float64)
        failure = np.where(np.isfinite(to_fail), day + to_fail, np.nan)
        coin = rng.random(len(rows))
        risk = {
            "model": rows["risk_7d"].to_numpy(dtype=np.float64),
            "age_only": rows["age_days"].to_numpy(dtype=np.float64),
            "random": coin,
        }[ranking]
        out.append(WeekRisks(float(day), list(rows["uuid"]), risk, failure))
    return out


@dataclass(frozen=True)
class SimBudget:
    """The weekly budget on the simulator: ``fleet`` GPUs alive at the cutoff, ``marked`` the
    budgets of :data:`~fleetwatch.models.drain_budget.BUDGET_FRACTIONS` in drains a week, and
    each ranking's curve over ``ks`` (the marked budgets among them)."""

    fleet: int
    weeks: int
    marked: tuple[int, ...]
    ks: tuple[int, ...]
    curves: dict[str, list[BudgetPoint]]

    def at(self, ranking: str, k: int) -> BudgetPoint:
        return next(p for p in self.curves[ranking] if p.k == k)


def sim_budget(result: _Scored, *, max_fraction: float = 0.05, seed: int = 0) -> SimBudget:
    """:func:`sim_weeks` of every ranking through :func:`~.drain_budget.budget_curve`, for k
    from 1 to ``max_fraction`` of the fleet (a simulated fleet is small: 0.1 % of 320 GPUs is
    one drain a week, the least there is)."""
    first = result.scores[result.scores["day"] == 0]
    fleet = len(first)
    ks = curve_ks(fleet, max_fraction=max_fraction)
    curves = {r: budget_curve(sim_weeks(result, r, seed=seed), ks, 7.0) for r in RANKINGS}
    return SimBudget(
        fleet=fleet,
        weeks=len(sim_weeks(result, "model")),
        marked=tuple(budget_k(fleet, f) for f in BUDGET_FRACTIONS),
        ks=tuple(ks),
        curves=curves,
    )


def _f(value: float, spec: str = ".3f") -> str:
    return "nan" if math.isnan(value) else format(value, spec)


def budget_lines(budget: SimBudget) -> list[str]:
    """The weekly budget as a Markdown table: each ranking at the three marked budgets."""
    marked = zip(BUDGET_FRACTIONS, budget.marked, strict=True)
    lines = [
        f"weekly drain budget: {budget.fleet} GPUs alive at the cutoff, {budget.weeks} weekly "
        "decisions, H = 7 days; "
        + ", ".join(f"{100 * f:g} % = {k}" for f, k in marked)
        + " drains a week",
        "| ranking | budget | k / week | drains | hits | failures | precision | recall | "
        "median lead (h) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for ranking in RANKINGS:
        for fraction, k in zip(BUDGET_FRACTIONS, budget.marked, strict=True):
            p = budget.at(ranking, k)
            lines.append(
                f"| {ranking} | {100 * fraction:g} % | {k} | {p.drains} | {p.hits} | "
                f"{p.failures} | {_f(p.precision)} | {_f(p.recall)} | "
                f"{_f(24 * p.median_lead_days, '.1f')} |"
            )
    curve = "; ".join(
        f"{p.k}: {_f(p.precision, '.2f')} / {_f(p.recall, '.2f')}" for p in budget.curves["model"]
    )
    lines.append(f"model's curve (k: precision / recall): {curve}")
    return lines


def budget_rows(budget: SimBudget) -> list[dict[str, object]]:
    """Every ranking's curve as rows (``ranking``, ``k``, counts, shares, lead in hours)."""
    return [
        {
            "ranking": ranking,
            "k": p.k,
            "drains": p.drains,
            "hits": p.hits,
            "failures": p.failures,
            "precision": p.precision,
            "recall": p.recall,
            "median_lead_h": 24 * p.median_lead_days,
            "marked": p.k in budget.marked,
        }
        for ranking, curve in budget.curves.items()
        for p in curve
    ]


def node_days(result: _Scored, horizon_days: float = 1.0) -> pd.DataFrame:
    """One row per evaluation midnight and node: ``day``, ``node``, ``risk`` (:math:`1 -
    \\prod (1 - p)` of its GPUs' risk within ``horizon_days``: 1 or 7), ``rule`` (a rule flags
    one of its GPUs) and ``to_failure`` (days until its first GPU failure; inf: none)."""
    if horizon_days not in _RISK:
        raise ValueError(f"horizon_days must be one of {sorted(_RISK)}, got {horizon_days}")
    scores = result.scores
    frame = pd.DataFrame(
        {
            "day": scores["day"].to_numpy(),
            "node": scores["uuid"].map(result.gpu_nodes).to_numpy(),
            # log(1 - p) summed is log of the node's survival: one groupby, no apply
            "log_survive": np.log1p(-scores[_RISK[horizon_days]].to_numpy(dtype=np.float64)),
            "rule": scores["rule"].to_numpy(dtype=bool),
            "to_failure": scores["days_to_failure"].to_numpy(dtype=np.float64),
        }
    )
    grouped = frame.groupby(["day", "node"], sort=True).agg(
        log_survive=("log_survive", "sum"), rule=("rule", "any"), to_failure=("to_failure", "min")
    )
    out = grouped.reset_index()
    out.insert(2, "risk", -np.expm1(out.pop("log_survive").to_numpy()))
    return out


@dataclass(frozen=True)
class NoticePoint:
    """Notices at one threshold over the held-out period (definitions: module doc)."""

    threshold: float
    notices: int
    right: int
    precision: float
    failures: int
    warned: int
    recall: float
    median_lead_h: float


def _failures(result: _Scored, horizon_days: float) -> pd.DataFrame:
    """Each GPU failing in (first day, last day + H]: its node and failure day."""
    s = result.scores
    finite = np.isfinite(s["days_to_failure"].to_numpy(dtype=np.float64))
    rows = s[finite]
    f = rows["day"].to_numpy(dtype=np.float64) + rows["days_to_failure"].to_numpy(np.float64)
    table = pd.DataFrame({"uuid": rows["uuid"].to_numpy(), "failure": f}).drop_duplicates("uuid")
    last = float(s["day"].max())
    table = table[(table["failure"] > 0.0) & (table["failure"] <= last + horizon_days)]
    return table.assign(node=table["uuid"].map(result.gpu_nodes))


def notice_curve(
    result: _Scored,
    thresholds: Sequence[float] = NOTICE_THRESHOLDS,
    *,
    horizon_days: float = 1.0,
    rules: bool = False,
    judged_days: float | None = None,
) -> list[NoticePoint]:
    """Precision, recall and median lead time of notices at each threshold (module doc).

    ``rules=True`` counts the rules' notices too (every notice a job would get); with a
    threshold of ``math.inf`` that is the rules' notices alone. ``judged_days`` replaces
    :math:`H` as the window in which a notice is right and a failure warned (the notice's risk
    is still within ``horizon_days``): 7 judges 24-hour notices as the issue's "right about
    15 % of the time" did, by a failure within 7 days.
    """
    judged = horizon_days if judged_days is None else float(judged_days)
    if not judged > 0:
        raise ValueError(f"judged_days must be > 0, got {judged_days}")
    nd = node_days(result, horizon_days)
    failures = _failures(result, judged)
    right_day = (nd["to_failure"] > 0) & (nd["to_failure"] <= judged)
    days = nd["day"].to_numpy(dtype=np.float64)
    out = []
    for theta in thresholds:
        on = nd["risk"].to_numpy() >= theta
        if rules:
            on |= nd["rule"].to_numpy(dtype=bool)
        notices = int(on.sum())
        right = int((on & right_day.to_numpy()).sum())
        flagged: dict[str, list[float]] = {}
        for node, day in zip(nd["node"].to_numpy()[on], days[on], strict=True):
            flagged.setdefault(str(node), []).append(float(day))
        leads = []
        for node, f in zip(failures["node"], failures["failure"], strict=True):
            before = [d for d in flagged.get(str(node), ()) if 0.0 < f - d <= judged]
            if before:
                leads.append(24.0 * (f - min(before)))
        n_fail = len(failures)
        out.append(
            NoticePoint(
                threshold=float(theta),
                notices=notices,
                right=right,
                precision=right / notices if notices else math.nan,
                failures=n_fail,
                warned=len(leads),
                recall=len(leads) / n_fail if n_fail else math.nan,
                median_lead_h=float(np.median(leads)) if leads else math.nan,
            )
        )
    return out


def choose_threshold(
    curve: Sequence[NoticePoint], target_precision: float, *, min_notices: int = 10
) -> NoticePoint | None:
    """The lowest threshold of ``curve`` whose precision reaches ``target_precision`` over at
    least ``min_notices`` notices (fewer would make the precision a coin toss); None if none
    does."""
    for point in sorted(curve, key=lambda p: p.threshold):
        if point.notices >= min_notices and point.precision >= target_precision:
            return point
    return None
