"""Wear-out onset: a SKU (or the fleet) whose Weibull shape crossed 1 between model versions."""

from __future__ import annotations

from typing import Any

from fleetwatch.models.registry import FLEET, RiskBundle

__all__ = ["wear_out_onsets"]


def wear_out_onsets(previous: RiskBundle | None, current: RiskBundle) -> list[dict[str, Any]]:
    """Groups (or the fleet) that entered wear-out between two versions.

    An onset is a shape that was :math:`\\rho \\le 1` in ``previous`` and is :math:`\\rho > 1`
    now with the lower 95% bound above 1, so noise around 1 does not raise one. Each comes with
    its numbers as evidence. No previous version, or a group new in ``current``, gives none.
    """
    if previous is None:
        return []
    before = previous.weibulls
    onsets = []
    for name, fit in current.weibulls.items():
        old = before.get(name)
        if old is None or old.rho > 1.0 or fit.rho <= 1.0 or fit.rho_ci[0] <= 1.0:
            continue
        stats = current.metrics.get("groups", {}).get(name) if name != FLEET else None
        if name == FLEET:
            stats = current.metrics.get("fleet")
        onsets.append(
            {
                "group": name,
                "previous_rho": old.rho,
                "previous_rho_ci": list(old.rho_ci),
                "rho": fit.rho,
                "rho_ci": list(fit.rho_ci),
                "lambda": fit.lam,
                "n": None if stats is None else stats.get("n"),
                "events": None if stats is None else stats.get("events"),
                "mtbf_days": None if stats is None else stats.get("mtbf_days"),
            }
        )
    return onsets
