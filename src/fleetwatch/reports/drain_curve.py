"""What the risk model's ranking was worth this week: drain the k riskiest GPUs at its start.

The server keeps no past risk scores (its fleet snapshot is replaced on every pass), so the
report recomputes the ranking the server would have made at the week's start from what it
stores: the risk model in effect then (the newest good one trained by the start, as
:mod:`.calibration` reads it), each GPU in service at the start with its age and SKU, and its
telemetry covariates over the model's window before the start, from the hourly rollups
(``gpu_hourly``) and its location's parts (:mod:`.scored_units`); a GPU without rollups there
is scored on median covariates, as the server scores it. One decision at the week's start,
horizon the week (7 days), then :func:`fleetwatch.models.drain_budget.budget_curve`: for each
k, the k highest P(failure within 7 days) are drained; precision = drained GPUs that failed in
the week / k; recall = the week's failures among GPUs in service at the start that were
drained; lead time = failure - start.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

__all__ = ["HORIZON_DAYS", "MAX_FRACTION", "drain_curve"]

HORIZON_DAYS = 7.0
MAX_FRACTION = 0.05  # the curve runs from 1 drain to 5 % of the GPUs in service


def _none_if_nan(value: float) -> float | None:
    return None if math.isnan(value) else value


def _point(p: Any) -> dict[str, Any]:
    lead = p.median_lead_days
    return {
        "k": p.k,
        "drains": p.drains,
        "hits": p.hits,
        "precision": _none_if_nan(p.precision),
        "recall": _none_if_nan(p.recall),
        "median_lead_h": None if math.isnan(lead) else 24.0 * lead,
    }


def drain_curve(
    model: Any | None,
    lifetimes: list[Any],
    start: datetime,
    features: dict[str, dict[str, float]] | None = None,
    location_pattern: str | None = None,
) -> dict[str, Any]:
    """The week's drain-budget curve (module doc); empty ``curve`` without a model or GPUs.

    ``model``: ``version`` and ``params`` of the model in effect at ``start``; ``features``:
    GPU UUID to its covariates over the model's window before ``start``;
    ``location_pattern``: the refit's, for the ``loc_*`` covariates
    (:mod:`fleetwatch.reports.scored_units`).
    """
    in_service = [
        lt
        for lt in lifetimes
        if lt.installed_at <= start and (lt.removed_at is None or lt.removed_at > start)
    ]
    features = features or {}
    if model is None or model.params is None or not in_service:
        return {
            "model_version": None,
            "horizon_days": HORIZON_DAYS,
            "gpus": len(in_service),
            "with_telemetry": 0,
            "failures": None,
            "budgets": [],
            "curve": [],
        }
    import numpy as np

    from fleetwatch.models.drain_budget import (
        BUDGET_FRACTIONS,
        WeekRisks,
        budget_curve,
        budget_k,
        curve_ks,
    )
    from fleetwatch.models.registry import RiskBundle
    from fleetwatch.reports.scored_units import units_at

    day = 86400.0
    units = units_at(in_service, start, features, location_pattern)
    risk = RiskBundle.from_params(model.params).probability(units, HORIZON_DAYS)
    failure = np.array(
        [
            (lt.removed_at - start).total_seconds() / day
            if lt.end_kind == "failure" and lt.removed_at is not None
            else np.nan
            for lt in in_service
        ],
        dtype=np.float64,
    )
    week = WeekRisks(0.0, list(range(len(in_service))), risk, failure)
    n = len(in_service)
    marked = [budget_k(n, f) for f in BUDGET_FRACTIONS]
    curve = budget_curve([week], curve_ks(n, max_fraction=MAX_FRACTION), HORIZON_DAYS)
    by_k = {p.k: p for p in curve}
    return {
        "model_version": int(model.version),
        "horizon_days": HORIZON_DAYS,
        "gpus": n,
        "with_telemetry": sum(1 for lt in in_service if features.get(lt.gpu_uuid or "")),
        "failures": curve[0].failures,
        "budgets": [
            {"fraction": f, **_point(by_k[k])}
            for f, k in zip(BUDGET_FRACTIONS, marked, strict=True)
        ],
        "curve": [_point(p) for p in curve],
    }
