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

A rate counter's rule sums the increases between consecutive readings within its window (a reset
counting the reading after it) and compares the sum with a limit. The screen sums them over the
whole window, which holds the rule's and more, so its sum is never the smaller: a counter that
trickles (a few corrected ECC errors an hour, NVLink CRC errors far below 100 a second, as on
many healthy GPUs) is passed over, where "any increase" would send a tenth of a fleet to the
rules every pass.

Input: per judged field (:data:`JUDGED_FIELDS`) one float64 per sample, NaN where not reported
(True/False as 1/0), samples grouped by window; ``starts`` is each window's first sample. Not
screened here: ``gpu_lost`` events (the caller picks the GPUs they name) and ``gpu_silent``
(only with ``expected_gpus``, which the server does not pass).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

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

    zero_fires = _zero_increase_fires(t)
    window_of = np.repeat(np.arange(starts.size), np.diff(np.append(starts, boots.size)))
    for name in _RATE_COUNTERS:
        if zero_fires[name]:
            out |= ~np.isnan(high(name))  # NaN: never reported, never judged
        else:
            out |= _rate_may_fire(name, _increase(columns[name], boots, window_of), t, low)

    # The newest temperature is at most the highest; margin = slowdown - temp only shrinks.
    out |= slowdown - high("gpu_temp_c") <= t.temp_margin_c

    reasons = columns["clocks_event_reasons"]
    reported = ~np.isnan(reasons)
    bits = np.where(reported, reasons, 0.0).astype(np.int64)
    # throttle_fraction > 0 (HealthThresholds checks it): no throttled sample, no verdict.
    out |= anywhere((bits & t.throttle_mask) != 0)
    return out


# A sum that equals the limit must still be picked when the rule, adding the same increases in
# another grouping, lands an ulp above it.
_SLACK = 1.0 + 1e-9


def _increase(
    values: NDArray[np.float64], boots: NDArray[np.float64], window_of: NDArray[np.int64]
) -> NDArray[np.float64]:
    """Per window, the sum of the increases between consecutive reported readings, as
    :func:`~fleetwatch.rules.rates.counter_rates` counts them: after a reset (a reboot between
    the two, or a lower reading) the whole later reading. Pairs of equal times, which the rule
    skips, are counted: every increase is at least 0, so the sum only grows."""
    n = int(window_of[-1]) + 1 if window_of.size else 0
    reported = ~np.isnan(values)
    v, b, w = values[reported], boots[reported], window_of[reported]
    if v.size < 2:
        return np.zeros(n)
    before, after = v[:-1], v[1:]
    rebooted = b[1:] != b[:-1]
    rebooted &= ~np.isnan(b[1:]) & ~np.isnan(b[:-1])  # an unknown boot is no reboot
    reset = rebooted | (after < before)
    step = np.where(reset, after, after - before)
    step = np.where(w[1:] == w[:-1], step, 0.0)  # no pair across two windows
    return np.bincount(w[1:], weights=step, minlength=n).astype(np.float64, copy=False)


def _rate_may_fire(
    name: str,
    increase: NDArray[np.float64],
    t: HealthThresholds,
    low: Callable[[str], NDArray[np.float64]],
) -> NDArray[np.bool_]:
    """Whether the rule of counter ``name`` can fire on a window whose increases sum to at most
    ``increase`` (health_rates: each rule's quantity grows with the increase)."""
    most = increase * _SLACK
    if name == "ecc_sbe_volatile_total":
        return most * 60 / t.sbe_window_s >= t.sbe_per_min
    if name in ("nvlink_crc_flit_errors_total", "nvlink_crc_data_errors_total"):
        return most / t.nvlink_window_s >= t.nvlink_crc_per_s
    if name == "nvlink_replay_errors_total":
        return most >= t.nvlink_replay_limit
    if name == "nvlink_recovery_errors_total":
        return most >= t.nvlink_recovery_limit
    # pcie_replay_total: the limit is ceil(rate of the link's generation x its width), the width
    # the newest reported in the window (16 when none is): never below the lowest rate times the
    # lowest width reported.
    lanes = np.nan_to_num(low("pcie_link_width"), nan=16.0)
    least_limit = np.ceil(min(t.pcie_replay_per_lane_per_min.values()) * lanes)
    return most * 60 / t.pcie_window_s > least_limit
