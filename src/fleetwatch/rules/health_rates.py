"""Rate rules: counter increases in a trailing window ending at ``now`` (a quiet window clears).

Corrected ECC errors, NVLink CRC errors, replays and recoveries, and PCIe replays. Increases come
from :func:`~fleetwatch.rules.rates.counter_rates`, so a counter reset never reads as a burst.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from fleetwatch.rules.health_evidence import GpuEvidence, Rule
from fleetwatch.rules.thresholds import source_of

__all__ = ["judge_rates"]

ECC_SBE_RATE = Rule(
    "ecc_sbe_rate",
    action="investigate",
    severity="warning",
    counts_against_gpu=False,
    source=source_of("sbe_per_min"),
    note="corrected ECC burst: a trend to watch (Xid 92), no harm by itself",
)
NVLINK_CRC_RATE = Rule(
    "nvlink_crc_rate",
    action="drain_inspect",
    severity="critical",
    counts_against_gpu=True,
    source=source_of("nvlink_crc_per_s"),
    note="NVLink CRC errors at DCGM's FAIL rate: reseat / inspect the link",
)
NVLINK_REPLAY = Rule(
    "nvlink_replay",
    action="investigate",
    severity="warning",
    counts_against_gpu=True,
    source=source_of("nvlink_replay_limit"),
    note="DCGM fails on one replay a minute; NVRx only when >15 of 30 minutes have one",
)
NVLINK_RECOVERY = Rule(
    "nvlink_recovery",
    action="drain_inspect",
    severity="critical",
    counts_against_gpu=True,
    source=source_of("nvlink_recovery_limit"),
    note="NVLink link recovered (retrained) in the last window",
)
PCIE_REPLAY_RATE = Rule(
    "pcie_replay_rate",
    action="investigate",
    severity="warning",
    counts_against_gpu=True,
    source=source_of("pcie_replay_per_lane_per_min"),
)


def judge_rates(e: GpuEvidence) -> None:
    """Every rate rule, in a fixed order."""
    t = e.t
    w = e.window("ecc_sbe_volatile_total", t.sbe_window_s)
    per_min = w["increase"] * 60 / w["window_s"] if w else 0.0
    _rate(e, ECC_SBE_RATE, "ecc_sbe_volatile_total", w, per_min >= t.sbe_per_min, "sbe_per_min")
    for name in ("nvlink_crc_flit_errors_total", "nvlink_crc_data_errors_total"):
        w = e.window(name, t.nvlink_window_s)
        fires = bool(w and w["per_s"] >= t.nvlink_crc_per_s)
        _rate(e, NVLINK_CRC_RATE, name, w, fires, "nvlink_crc_per_s")
    w = e.window("nvlink_replay_errors_total", t.nvlink_window_s)
    fires = bool(w and w["increase"] >= t.nvlink_replay_limit)
    _rate(e, NVLINK_REPLAY, "nvlink_replay_errors_total", w, fires, "nvlink_replay_limit")
    w = e.window("nvlink_recovery_errors_total", t.nvlink_window_s)
    fires = bool(w and w["increase"] >= t.nvlink_recovery_limit)
    _rate(e, NVLINK_RECOVERY, "nvlink_recovery_errors_total", w, fires, "nvlink_recovery_limit")
    _pcie(e)


def _rate(
    e: GpuEvidence,
    rule: Rule,
    name: str,
    w: dict[str, Any] | None,
    fires: bool,
    threshold_name: str,
    *,
    threshold: Any = None,
) -> None:
    """A verdict of ``rule`` when ``fires``; the threshold is ``threshold_name``'s unless given."""
    if w is None or not fires:
        return
    if threshold is None:
        threshold = getattr(e.t, threshold_name)
    evidence = {"field": name, **w, "threshold": threshold, "threshold_name": threshold_name}
    e.emit(rule, evidence, first=w["first_increase"], last=w["to"])


def _pcie(e: GpuEvidence) -> None:
    t = e.t
    w = e.window("pcie_replay_total", t.pcie_window_s)
    gen = e.latest("pcie_link_gen", volatile=False)
    if w is None or gen is None:
        return  # without the generation there is no published limit to apply
    table = t.pcie_replay_per_lane_per_min
    # Gens outside the table take the nearest one (Gen1/2 the Gen3 rate: stricter, not laxer
    # than a modern link should be).
    nearest = min(table, key=lambda g: (abs(g - gen[0]), g))
    width = e.latest("pcie_link_width", volatile=False)
    # Width unknown: assume x16, the most replays allowed, so absence cannot cause a verdict.
    lanes = width[0] if width is not None else 16
    limit = math.ceil(table[nearest] * lanes)
    per_min = w["increase"] * 60 / w["window_s"]  # not per_s * 60: float error at the limit
    w |= {"link_gen": gen[0], "link_width": lanes, "per_lane_per_min": table[nearest]}
    note = (
        f"more than ceil({table[nearest]} x {lanes}) = {limit} PCIe replays/min: reseat, "
        "check riser/cable"
    )
    rule = replace(PCIE_REPLAY_RATE, note=note)
    threshold_name = "pcie_replay_per_lane_per_min"
    _rate(e, rule, "pcie_replay_total", w, per_min > limit, threshold_name, threshold=limit)
