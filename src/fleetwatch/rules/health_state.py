"""State rules: the newest reading of a memory field, or the driver's recovery action, decides.

A later sample with another ``boot_id`` clears a volatile field (DBE since driver load, pending
flags, the recovery action): the GPU was reset. Row-remap failures and retired pages are recorded
on the GPU and survive resets.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from fleetwatch.rules.health_evidence import GpuEvidence, Rule, at_sample
from fleetwatch.rules.thresholds import source_of
from fleetwatch.rules.xid import RECOVERY_ACTIONS

__all__ = ["judge_memory_state", "judge_recovery_action"]

ECC_DBE_VOLATILE = Rule(
    "ecc_dbe_volatile",
    action="reset_gpu",
    severity="critical",
    counts_against_gpu=True,
    source=source_of("ecc_dbe_volatile_max"),
    note="uncorrectable ECC since the driver loaded: reset the GPU",
)
# Flags read as they are: pending ones are volatile (a reset applies the remap or retirement).
FLAG_RULES: tuple[tuple[str, bool, Rule], ...] = (
    (
        "remapped_rows_failure",
        False,
        Rule(
            "row_remap_failure",
            action="drain_inspect",
            severity="critical",
            counts_against_gpu=True,
            source="NVSentinel ROW_REMAP_FAILURE -> CONTACT_SUPPORT; Azure NHC, Meta GCM",
            note="no spare row left: drain, field diagnostics, RMA",
        ),
    ),
    (
        "remapped_rows_pending",
        True,
        Rule(
            "row_remap_pending",
            action="reset_gpu",
            severity="critical",
            counts_against_gpu=True,
            source="NVSentinel DCGM_FR_PENDING_ROW_REMAP -> COMPONENT_RESET; Azure NHC, Meta GCM",
            note="a row remap takes effect at the next GPU reset",
        ),
    ),
    (
        "retired_pages_pending",
        True,
        Rule(
            "retired_pages_pending",
            action="reset_gpu",
            severity="critical",
            counts_against_gpu=True,
            source="Meta GCM gpu_retired_pages.md (any pending -> CRITICAL)",
            note="a page retirement takes effect at the next GPU reset",
        ),
    ),
)
REMAPPED_ROWS_UNCORRECTABLE = Rule(
    "remapped_rows_uncorrectable",
    action="drain_inspect",
    severity="warning",
    counts_against_gpu=True,
    source=source_of("remapped_rows_uncorrectable_limit"),
    note="spare rows running out: plan an RMA",
)
RETIRED_PAGES_TOTAL = Rule(
    "retired_pages_total",
    action="drain_inspect",
    severity="critical",
    counts_against_gpu=True,
    source=source_of("retired_pages_total_limit"),
    note="page retirement table nearly full: RMA",
)
RETIRED_PAGES_DBE = Rule(
    "retired_pages_dbe",
    action="drain_inspect",
    severity="critical",
    counts_against_gpu=True,
    source=source_of("retired_pages_dbe_max"),
    note="DBE page retirements still growing: RMA",
)
# Action and severity come from the driver's code (RECOVERY_ACTIONS), the note names it.
RECOVERY_ACTION = Rule(
    "gpu_recovery_action",
    action="investigate",
    severity="warning",
    counts_against_gpu=True,
    source="NVML GPU_RECOVERY_ACTION / DCGM field 1523: the driver's own verdict",
)


def judge_memory_state(e: GpuEvidence) -> None:
    """ECC, row remapping and page retirement, from the newest readings."""
    t = e.t
    if (got := e.latest("ecc_dbe_volatile_total", volatile=True)) is not None:
        value, at = got
        if value > t.ecc_dbe_volatile_max:
            evidence = at_sample(at, ecc_dbe_volatile_total=value, threshold=t.ecc_dbe_volatile_max)
            e.emit(ECC_DBE_VOLATILE, evidence, last=at.sample.ts)
    for name, volatile, rule in FLAG_RULES:
        if (got := e.latest(name, volatile=volatile)) is not None and got[0] is True:
            at = got[1]
            e.emit(rule, at_sample(at, **{name: True}), last=at.sample.ts)
    if (got := e.latest("remapped_rows_uncorrectable", volatile=False)) is not None:
        value, at = got
        limit = t.remapped_rows_uncorrectable_limit
        if value >= limit:
            evidence = at_sample(at, remapped_rows_uncorrectable=value, threshold=limit)
            e.emit(REMAPPED_ROWS_UNCORRECTABLE, evidence, last=at.sample.ts)
    _retired_pages(e)


def _retired_pages(e: GpuEvidence) -> None:
    t = e.t
    sbe = e.latest("retired_pages_sbe", volatile=False)
    dbe = e.latest("retired_pages_dbe", volatile=False)
    if sbe is not None and dbe is not None:
        total = sbe[0] + dbe[0]
        if total >= t.retired_pages_total_limit:
            at = max(sbe[1], dbe[1], key=lambda b: b.sample.ts)
            evidence = at_sample(
                at,
                retired_pages_sbe=sbe[0],
                retired_pages_dbe=dbe[0],
                total=total,
                threshold=t.retired_pages_total_limit,
            )
            e.emit(RETIRED_PAGES_TOTAL, evidence, last=at.sample.ts)
    if dbe is None or dbe[0] <= t.retired_pages_dbe_max:
        return
    # "Still growing": the count rose within the growth window (retirements are persistent,
    # so the lowest in-window reading against the newest is the growth).
    since = e.now - timedelta(seconds=t.retired_pages_dbe_growth_window_s)
    window = [s for s in e.series if s.sample.ts >= since]
    values = [v for s in window if (v := s.sample.retired_pages_dbe) is not None]
    if values and dbe[0] > min(values):
        evidence = at_sample(
            dbe[1],
            retired_pages_dbe=dbe[0],
            growth=dbe[0] - min(values),
            window_s=t.retired_pages_dbe_growth_window_s,
            threshold=t.retired_pages_dbe_max,
        )
        e.emit(RETIRED_PAGES_DBE, evidence, last=dbe[1].sample.ts)


def judge_recovery_action(e: GpuEvidence) -> None:
    """The driver's recovery action (0 = none), until a reset clears it."""
    if (got := e.latest("gpu_recovery_action", volatile=True)) is None or not got[0]:
        return
    value, at = got
    name, action, severity = RECOVERY_ACTIONS.get(
        value, (f"UNKNOWN_{value}", "investigate", "warning")
    )
    rule = replace(
        RECOVERY_ACTION, action=action, severity=severity, note=f"driver asks for {name}"
    )
    e.emit(rule, at_sample(at, gpu_recovery_action=value, name=name), last=at.sample.ts)
