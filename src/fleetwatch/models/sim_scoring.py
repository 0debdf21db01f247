"""Scoring the simulator backtest: which GPU-days each method flags, and how it did.

A method flags GPU-days: ``model`` the daily top-``budget`` risks, ``rules`` every GPU with a
verdict against it, ``rules+model`` the rules' flags filled up to the budget with model picks.
A failure is caught within 7 days if flagged on a day in the 7 days before it (lead time: from
the first such flag), within 24 h if flagged at the last evaluation in the day before it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

import numpy as np
import pandas as pd

__all__ = [
    "HORIZONS_DAYS",
    "METHODS",
    "Flags",
    "MethodMetrics",
    "failure_table",
    "flag_days",
    "method_metrics",
    "percentile",
]

METHODS = ("model", "rules", "rules+model")
HORIZONS_DAYS = (1.0, 7.0)
_DAY = timedelta(days=1)
_HOUR = timedelta(hours=1)


class _FailingGpu(Protocol):
    uuid: str
    node: str
    failure: datetime | None
    cause_xid: int | None
    precursors: bool


@dataclass(frozen=True)
class MethodMetrics:
    """How one flagging method did over the evaluation period (NaN where undefined)."""

    method: str
    flagged_gpu_days: int
    precision: float  # flagged GPU-days whose GPU fails within 7 days / flagged GPU-days
    recall_24h: float
    recall_7d: float
    lead_p10_h: float
    lead_p50_h: float
    lead_p90_h: float
    false_flags_per_day: float


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else math.nan


Flags = dict[tuple[str, float], set[tuple[int, str]]]  # (method, H) -> {(day index, uuid)}


def flag_days(ev: pd.DataFrame, budget: int) -> Flags:
    """Each method's flagged GPU-days for each horizon (rules ignore the horizon)."""
    out: Flags = {(m, h): set() for m in METHODS for h in HORIZONS_DAYS}
    for day, rows in ev.groupby("day", sort=True):
        i = int(day)
        ruled = set(rows.loc[rows["rule"], "uuid"])
        for h in HORIZONS_DAYS:
            ranked = rows.sort_values(f"risk_{h:g}d", ascending=False, kind="stable")["uuid"]
            out[("model", h)] |= {(i, u) for u in ranked.iloc[:budget]}
            out[("rules", h)] |= {(i, u) for u in ruled}
            fill = [u for u in ranked if u not in ruled][: max(0, budget - len(ruled))]
            out[("rules+model", h)] |= {(i, u) for u in (*ruled, *fill)}
    return out


def failure_table(
    gpus: Sequence[_FailingGpu],
    cutoff: datetime,
    eval_end: datetime,
    days: Sequence[datetime],
    flags: Flags,
    window: timedelta,
) -> pd.DataFrame:
    """One row per failure in ``(cutoff, eval_end]``: lead time and 24 h catch per method."""
    rows: list[dict[str, object]] = []
    for g in gpus:
        f = g.failure
        if f is None or not cutoff < f <= eval_end:
            continue
        before = [i for i, d in enumerate(days) if f - window <= d < f]
        row: dict[str, object] = {
            "uuid": g.uuid,
            "node": g.node,
            "failure_time": f,
            "cause_xid": g.cause_xid,
            "precursors": g.precursors,
        }
        for m in METHODS:
            hit = [i for i in before if (i, g.uuid) in flags[(m, 7.0)]]
            row[f"lead_h_{m}"] = (f - days[hit[0]]) / _HOUR if hit else math.nan
            last = before[-1] if before else None
            row[f"caught_24h_{m}"] = (
                last is not None and f - days[last] <= _DAY and (last, g.uuid) in flags[(m, 1.0)]
            )
        rows.append(row)
    columns = ["uuid", "node", "failure_time", "cause_xid", "precursors"]
    columns += [f"{p}_{m}" for m in METHODS for p in ("lead_h", "caught_24h")]
    return pd.DataFrame(rows, columns=columns)


def method_metrics(
    method: str,
    ev: pd.DataFrame,
    flagged: set[tuple[int, str]],
    failures: pd.DataFrame,
    n_days: int,
) -> MethodMetrics:
    label = {
        (int(i), str(u)): bool(y)
        for i, u, y in zip(ev["day"], ev["uuid"], ev["label"], strict=True)
    }
    hits = sum(1 for key in flagged if label.get(key, False))
    leads = failures[f"lead_h_{method}"].dropna().to_numpy(dtype=np.float64)
    n_fail = len(failures)
    return MethodMetrics(
        method=method,
        flagged_gpu_days=len(flagged),
        precision=hits / len(flagged) if flagged else math.nan,
        recall_24h=float(failures[f"caught_24h_{method}"].sum()) / n_fail if n_fail else math.nan,
        recall_7d=len(leads) / n_fail if n_fail else math.nan,
        lead_p10_h=percentile(list(leads), 10),
        lead_p50_h=percentile(list(leads), 50),
        lead_p90_h=percentile(list(leads), 90),
        false_flags_per_day=(len(flagged) - hits) / n_days,
    )
