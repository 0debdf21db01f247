"""The failure model: Weibull lifetimes whose scale depends on covariates, and each GPU's fate.

A GPU's lifetime ``T`` (days since install) is Weibull with shape ``k`` and scale ``lambda``::

    S(t) = exp(-(t / lambda)^k)                      survival
    h(t) = (k / lambda) * (t / lambda)^(k - 1)       hazard

``k > 1`` is wear-out (the hazard grows with age), ``k < 1`` infant mortality (a bad batch). The
covariates act on the scale, as in an accelerated-failure-time model::

    lambda = lambda_0(k) * s_sku * s_batch * 2^(-dT / h)

with ``dT`` how much hotter the GPU's place runs than the coolest (top of rack, rear of the
baseboard: Titan's cage and node-position effect), ``h`` the rise that halves the life (the
Arrhenius rule of thumb, 10 C; with shape ``k`` the hazard at every age is ``2^(k dT / h)`` times
higher), and ``lambda_0(k)`` such that a reference GPU fails within its first year as if it
failed each month with probability ``p``, ``P(T <= 365) = 1 - (1 - p)^12``::

    lambda_0 = 365 / (-12 ln(1 - p))^(1 / k)

(Anchoring at one year rather than one month keeps the yearly toll the same whatever the shape;
the shape only moves failures earlier or later.)

Nodes are installed before the simulation starts, so the draw is conditional on having survived
to the start (left truncation): with ``a`` the age at start and ``E ~ Exp(1)``::

    T = lambda * ((a / lambda)^k + E)^(1 / k)

since ``P(T > t | T > a) = exp((a / lambda)^k - (t / lambda)^k)``. A lifetime that ends after
the horizon is censored: the GPU survives the simulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fleetwatch.sim.spec import CauseSpec, FailureModel

__all__ = ["DAY", "Fate", "draw_fate", "draw_lifetime_days", "reference_scale_days", "scale_days"]

DAY = 86_400.0
HOUR = 3_600.0


def reference_scale_days(monthly_failure_prob: float, shape: float) -> float:
    """Weibull scale ``lambda_0`` with ``P(T <= 365 days) = 1 - (1 - p) ** 12``.

    Parameters
    ----------
    monthly_failure_prob : float
        ``p``, the reference GPU's average monthly failure probability over its first year,
        in (0, 1).
    shape : float
        Weibull shape ``k``.

    Returns
    -------
    float
        ``365 / (-12 ln(1 - p)) ** (1 / k)``, in days.

    Examples
    --------
    >>> round(reference_scale_days(0.02, 1.0), 1)
    1505.6
    """
    return 365.0 / float((-12.0 * math.log1p(-monthly_failure_prob)) ** (1.0 / shape))


def scale_days(
    reference_days: float,
    *,
    sku_factor: float,
    batch_factor: float,
    offset_c: float,
    halving_c: float,
) -> float:
    """The covariate-adjusted scale ``lambda_0 * s_sku * s_batch * 2 ** (-offset_c / halving_c)``.

    A GPU running ``halving_c`` hotter lives half as long; with shape ``k`` its hazard at every
    age is ``2 ** k`` times higher.
    """
    return reference_days * sku_factor * batch_factor * float(2.0 ** (-offset_c / halving_c))


def draw_lifetime_days(shape: float, scale: float, age_days: float, exp_draw: float) -> float:
    """Lifetime since install, given survival to ``age_days``: ``lambda((a/lambda)^k + E)^(1/k)``.

    Parameters
    ----------
    shape, scale : float
        Weibull ``k`` and ``lambda`` (days).
    age_days : float
        Age at which the GPU is known to be alive (the simulation's start); 0 for a new one.
    exp_draw : float
        A standard exponential variate ``E`` (``-ln U``), drawn by the caller's substream.
    """
    return float(scale * ((age_days / scale) ** shape + exp_draw) ** (1.0 / shape))


@dataclass(frozen=True)
class Fate:
    """What will happen to one GPU, in seconds since the simulation's start."""

    failure_s: float | None  # None: alive at the end of the horizon (censored)
    cause: CauseSpec | None
    precursor_start_s: float | None  # None: no warning (a sudden failure), or no failure
    temp_rise_c: float  # die temperature added by the time of failure (precursor)
    sbe_peak_per_s: float  # single-bit ECC rate reached at failure (memory precursors)
    pcie_peak_per_s: float  # PCIe replay rate reached at failure (bus precursors)
    hang_s: float | None  # the node goes silent this long after the failure, then reboots

    @property
    def fails(self) -> bool:
        return self.failure_s is not None


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    if low <= 0:
        return float(rng.uniform(low, high))
    return float(math.exp(rng.uniform(math.log(low), math.log(high))))


def draw_fate(
    rng: np.random.Generator,
    model: FailureModel,
    *,
    shape: float,
    scale: float,
    install_s: float,
    end_s: float,
) -> tuple[float, Fate]:
    """Draw a GPU's lifetime (days since install) and its fate within ``[0, end_s]``.

    Always makes the same draws in the same order, so that a change of one parameter (or one
    GPU failing or not) never shifts the random numbers another quantity receives.
    """
    lifetime = draw_lifetime_days(shape, scale, max(0.0, -install_s / DAY), rng.exponential())
    weights = np.array([cause.weight for cause in model.causes])
    cause = model.causes[int(rng.choice(len(weights), p=weights / weights.sum()))]
    warned = rng.random() < cause.precursor_prob
    lead_s = rng.uniform(*model.precursor_lead_days) * DAY
    temp_rise = float(rng.uniform(*model.precursor_temp_rise_c))
    sbe_peak = _log_uniform(rng, *model.precursor_sbe_peak_per_hour) / HOUR
    pcie_peak = _log_uniform(rng, *model.precursor_pcie_peak_per_hour) / HOUR
    hangs = rng.random() < cause.node_hang_prob
    hang_s = rng.uniform(*model.hang_hours) * HOUR

    # Microseconds, as the kernel log prints the fatal Xid's time.
    failure_s = round(install_s + lifetime * DAY, 6)
    if failure_s > end_s:
        return lifetime, Fate(None, None, None, 0.0, 0.0, 0.0, None)
    return lifetime, Fate(
        failure_s=failure_s,
        cause=cause,
        precursor_start_s=max(round(failure_s - lead_s, 6), install_s) if warned else None,
        temp_rise_c=temp_rise if warned else 0.0,
        sbe_peak_per_s=sbe_peak if warned and cause.memory_precursors else 0.0,
        pcie_peak_per_s=pcie_peak if warned and cause.pcie_precursors else 0.0,
        hang_s=hang_s if hangs else None,
    )
