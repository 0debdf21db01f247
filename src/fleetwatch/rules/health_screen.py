"""Which GPUs' windows :func:`~fleetwatch.rules.health.judge_health` could give a verdict: a
vectorised screen over the whole fleet, so the rules run only where they might fire.

At 100,000 GPUs the rules cost about 0.3 ms per GPU in Python (30 s a pass), while a healthy
fleet has verdicts on a few hundred. The screen asks, per window and with numpy over every
window at once, a looser question than each rule: the newest reading of a field is at most its
highest reading in the window, a counter that never changes within one boot never increases,
and so on. Each test is implied by its rule's, so a window the screen passes over gets no
verdict from ``judge_health``; one it picks is judged by the rules themselves, which decide.
``tests/unit/rules/test_health_screen.py`` holds the screen to the rules on random windows and
thresholds, and fails when a rule appears that the screen does not know (:data:`SCREENED_RULES`).

Input: per judged field (:data:`JUDGED_FIELDS`) one float64 per sample, NaN where not reported
(True/False as 1/0), samples grouped by window; ``starts`` is each window's first sample. Not
screened here: ``gpu_lost`` events (the caller picks the GPUs they name) and ``gpu_silent``
(only with ``expected_gpus``, which the server does not pass).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from fleetwatch.rules.health_state import FLAG_RULES
from fleetwatch.rules.thresholds import HealthThresholds

__all__ = ["JUDGED_FIELDS", "SCREENED_RULES", "may_fire"]

JUDGED_FIELDS: tuple[str, ...] = (
    "gpu_temp_c",
    "clocks_event_reasons",
    "pcie_link_gen",
    "pcie_link_width",
    "ecc_sbe_volatile_total",
    "ecc_dbe_volatile_total",
    "retired_pages_sbe",
    "retired_pages_dbe",
    "retired_pages_pending",
    "remapped_rows_uncorrectable",
    "remapped_rows_pending",
    "remapped_rows_failure",
    "nvlink_crc_flit_errors_total",
    "nvlink_crc_data_errors_total",
    "nvlink_replay_errors_total",
    "nvlink_recovery_errors_total",
    "pcie_replay_total",
    "gpu_recovery_action",
)
"""Every sample field the health rules read (the judge keeps only these)."""

SCREENED_RULES: frozenset[str] = frozenset(
    {
        "ecc_dbe_volatile",
        *(rule.name for _, _, rule in FLAG_RULES),
        "remapped_rows_uncorrectable",
        "retired_pages_total",
        "retired_pages_dbe",
        "gpu_recovery_action",
        "ecc_sbe_rate",
        "nvlink_crc_rate",
        "nvlink_replay",
        "nvlink_recovery",
        "pcie_replay_rate",
        "temperature_margin",
        "persistent_throttle",
    }
)
"""The rules :func:`may_fire` answers for (``gpu_lost`` and ``gpu_silent``: see the module doc)."""

_RATE_COUNTERS = (
    "ecc_sbe_volatile_total",
    "nvlink_crc_flit_errors_total",
    "nvlink_crc_data_errors_total",
    "nvlink_replay_errors_total",
    "nvlink_recovery_errors_total",
    "pcie_replay_total",
)


def _zero_increase_fires(t: HealthThresholds) -> dict[str, bool]:
    """Per counter: whether its rule fires on a window with no increase at all."""
    return {
        "ecc_sbe_volatile_total": t.sbe_per_min <= 0,
        "nvlink_crc_flit_errors_total": t.nvlink_crc_per_s <= 0,
        "nvlink_crc_data_errors_total": t.nvlink_crc_per_s <= 0,
        "nvlink_replay_errors_total": t.nvlink_replay_limit <= 0,
        "nvlink_recovery_errors_total": t.nvlink_recovery_limit <= 0,
        # per_min > ceil(rate x lanes): rates are > 0 and lanes >= 1, so never on nothing.
        "pcie_replay_total": False,
    }


def may_fire(
    columns: Mapping[str, NDArray[np.float64]],
    boots: NDArray[np.float64],
    starts: NDArray[np.int64],
    slowdown: NDArray[np.float64],
    t: HealthThresholds,
) -> NDArray[np.bool_]:
    """Per window: True unless no rule of :data:`SCREENED_RULES` can fire on it at any ``now``.

    ``columns`` maps each of :data:`JUDGED_FIELDS` to one value per sample (NaN: not
    reported), ``boots`` each sample's boot as a number (NaN: unknown), ``starts`` each
    window's first sample (windows are contiguous, non-empty and in order), ``slowdown`` each
    window's slowdown temperature (:meth:`HealthThresholds.slowdown_for`).
    """
    if not starts.size:
        return np.zeros(0, dtype=bool)

    def high(name: str) -> NDArray[np.float64]:
        return np.fmax.reduceat(columns[name], starts)  # NaN: never reported

    def low(name: str) -> NDArray[np.float64]:
        return np.fmin.reduceat(columns[name], starts)

    def anywhere(mask: NDArray[np.bool_]) -> NDArray[np.bool_]:
        return np.logical_or.reduceat(mask, starts)

    out = high("ecc_dbe_volatile_total") > t.ecc_dbe_volatile_max
    for name, _, _ in FLAG_RULES:
        out |= high(name) == 1.0
    out |= high("remapped_rows_uncorrectable") >= t.remapped_rows_uncorrectable_limit
    dbe = high("retired_pages_dbe")
    out |= high("retired_pages_sbe") + dbe >= t.retired_pages_total_limit
    out |= dbe > t.retired_pages_dbe_max
    recovery = columns["gpu_recovery_action"]
    out |= anywhere((recovery != 0.0) & ~np.isnan(recovery))

    # A counter increases only where it changes, or across a reboot (from a non-zero reading).
    rebooted = np.fmax.reduceat(boots, starts) > np.fmin.reduceat(boots, starts)  # NaN: False
    zero_fires = _zero_increase_fires(t)
    for name in _RATE_COUNTERS:
        top, bottom = high(name), low(name)
        out |= top > bottom  # False for NaN: never reported, never increased
        out |= rebooted & (top > 0)
        if zero_fires[name]:
            out |= ~np.isnan(top)

    # The newest temperature is at most the highest; margin = slowdown - temp only shrinks.
    out |= slowdown - high("gpu_temp_c") <= t.temp_margin_c

    reasons = columns["clocks_event_reasons"]
    reported = ~np.isnan(reasons)
    bits = np.where(reported, reasons, 0.0).astype(np.int64)
    # throttle_fraction > 0 (HealthThresholds checks it): no throttled sample, no verdict.
    out |= anywhere((bits & t.throttle_mask) != 0)
    return out
