"""Predicted vs actual failures: the risk model in effect at the week's start, scored on the GPUs
in service then, against the failures that followed within the week."""

from __future__ import annotations

from datetime import datetime
from typing import Any

__all__ = ["calibration"]

HORIZON_DAYS = 7.0
MIN_FOR_DECILES = 100


def calibration(
    model: Any | None,
    lifetimes: list[Any],
    start: datetime,
    end: datetime,
    features: dict[str, dict[str, float]] | None = None,
    location_pattern: str | None = None,
) -> dict[str, Any]:
    """Expected = sum of P(fail within 7 d) over GPUs in service at ``start``; actual = those
    GPUs' failures in ``[start, end)``; by decile of predicted risk when there are enough.

    ``model`` is the stored risk model in effect at ``start`` (``version``, ``params``), if any;
    it scores each GPU as the server did (:mod:`fleetwatch.reports.scored_units`): ``features``
    are the GPUs' telemetry covariates before ``start``, ``location_pattern`` the refit's.
    """
    in_service = [
        lt
        for lt in lifetimes
        if lt.installed_at <= start and (lt.removed_at is None or lt.removed_at > start)
    ]
    if model is None or model.params is None or not in_service:
        return {
            "model_version": None,
            "gpus": len(in_service),
            "expected": None,
            "actual": None,
            "deciles": [],
        }
    import numpy as np

    from fleetwatch.models.registry import RiskBundle
    from fleetwatch.reports.scored_units import units_at

    units = units_at(in_service, start, features or {}, location_pattern)
    bundle = RiskBundle.from_params(model.params)
    probability = bundle.score(units, HORIZON_DAYS).probability
    failed = np.array([_failed_by(lt, end) for lt in in_service])
    deciles = []
    if len(in_service) >= MIN_FOR_DECILES:
        order = np.argsort(probability, kind="stable")
        for i, part in enumerate(np.array_split(order, 10)):
            decile = {
                "decile": i + 1,
                "gpus": int(len(part)),
                "mean_p": float(probability[part].mean()),
                "expected": float(probability[part].sum()),
                "actual": int(failed[part].sum()),
            }
            deciles.append(decile)
    return {
        "model_version": int(model.version),
        "horizon_days": HORIZON_DAYS,
        "gpus": len(in_service),
        "expected": float(probability.sum()),
        "actual": int(failed.sum()),
        "deciles": deciles,
    }


def _failed_by(lt: Any, end: datetime) -> bool:
    return bool(lt.end_kind == "failure" and lt.removed_at is not None and lt.removed_at < end)
