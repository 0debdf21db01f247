"""The stored parameters of a risk bundle's parts, and scoring from them with numpy alone.

:class:`WeibullParams` (scale, shape and its CI) and :class:`AftParams` (coefficients and the
covariate design: imputation medians, which covariates are ``log1p``-transformed, the training
range they are clipped to) round-trip through JSON (``to_params`` / ``from_params``) so a server
scores a stored model version without lifelines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["AftParams", "WeibullParams", "conditional_risk"]


@dataclass(frozen=True)
class WeibullParams:
    lam: float
    rho: float
    rho_ci: tuple[float, float]

    def to_params(self) -> dict[str, Any]:
        return {"lambda": self.lam, "rho": self.rho, "rho_ci": list(self.rho_ci)}

    @classmethod
    def from_params(cls, p: dict[str, Any]) -> WeibullParams:
        lo, hi = p["rho_ci"]
        return cls(lam=float(p["lambda"]), rho=float(p["rho"]), rho_ci=(float(lo), float(hi)))


@dataclass(frozen=True)
class AftParams:
    intercept: float
    rho: float
    features: tuple[str, ...]
    coef: NDArray[np.float64]
    median: NDArray[np.float64]
    """Imputation values, raw scale."""
    mean: NDArray[np.float64]
    """Training means, model scale (for hazard ratios)."""
    log1p: NDArray[np.bool_]
    low: NDArray[np.float64]
    """Training range, model scale; -inf/inf (no clipping) for format-1 params."""
    high: NDArray[np.float64]

    def design(self, raw: NDArray[np.float64]) -> NDArray[np.float64]:
        """Raw covariates (NaN = not reported), one column per feature, as the AFT sees them:
        imputed, log1p where the feature is a count or rate, clipped to the training range."""
        x = np.where(np.isfinite(raw), raw, self.median)
        if self.log1p.any():
            x[:, self.log1p] = np.log1p(np.maximum(x[:, self.log1p], 0.0))
        return np.asarray(np.clip(x, self.low, self.high), dtype=np.float64)

    def to_params(self) -> dict[str, Any]:
        def bounds(a: NDArray[np.float64]) -> list[float | None]:
            return [float(v) if math.isfinite(v) else None for v in a]

        return {
            "intercept": self.intercept,
            "rho": self.rho,
            "features": list(self.features),
            "coef": self.coef.tolist(),
            "median": self.median.tolist(),
            "mean": self.mean.tolist(),
            "log1p": [f for f, on in zip(self.features, self.log1p, strict=True) if on],
            "low": bounds(self.low),
            "high": bounds(self.high),
        }

    @classmethod
    def from_params(cls, p: dict[str, Any]) -> AftParams:
        def arr(key: str) -> NDArray[np.float64]:
            return np.asarray(p[key], dtype=np.float64)

        features = tuple(str(f) for f in p["features"])

        def bounds(key: str, missing: float) -> NDArray[np.float64]:
            got = p.get(key) or [None] * len(features)  # absent in format 1: no clipping
            return np.array([missing if v is None else float(v) for v in got], dtype=np.float64)

        logged = set(p.get("log1p", ()))  # absent in format 1: no transform
        return cls(
            intercept=float(p["intercept"]),
            rho=float(p["rho"]),
            features=features,
            coef=arr("coef"),
            median=arr("median"),
            mean=arr("mean"),
            log1p=np.array([f in logged for f in features], dtype=np.bool_),
            low=bounds("low", -math.inf),
            high=bounds("high", math.inf),
        )


def conditional_risk(
    ages: NDArray[np.float64], horizon: float, log_lam: NDArray[np.float64], rho: Any
) -> NDArray[np.float64]:
    """:math:`1 - S(a+H)/S(a)` from :math:`\\log\\lambda`, in log space: covariates far outside
    the training range give scales that under- or overflow, and age 0 has log 0 = -inf."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        h_now = np.exp(rho * (np.log(ages) - log_lam))
        h_then = np.exp(rho * (np.log(ages + horizon) - log_lam))
        risk = -np.expm1(h_now - h_then)
    # inf - inf: both cumulative hazards beyond float range, the unit is as good as failed.
    risk = np.where(np.isnan(risk), 1.0, risk)
    return np.asarray(np.clip(risk, 0.0, 1.0), dtype=np.float64)
