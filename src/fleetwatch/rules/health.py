"""Judge one GPU's recent telemetry: memory, interconnect, thermal and recovery-action rules.

:func:`judge_health` is pure: samples in, :class:`HealthVerdict` list out, time from ``now``.

Input: one GPU's samples, oldest first, each a :class:`BootSample` ``(boot_id, sample)`` or a
bare :class:`~fleetwatch.telemetry.GpuSample` (boot unknown). A boot id change means volatile
counters restarted (rates use :func:`~fleetwatch.rules.rates.counter_rates`) and the GPU was reset.

Verdicts describe the evidence *now*; none is sticky:

- state rules (:mod:`.health_state`) read the newest sample that reports the field; a later sample
  with another ``boot_id`` clears the volatile ones (DBE since driver load, pending flags,
  recovery action);
- rate rules (:mod:`.health_rates`) sum counter increases in a trailing window ending at ``now``:
  a quiet one clears;
- a field that is absent (``None``) neither fires nor clears: the older reading stands.

The thermal rules and the GPU's presence (lost from the bus, silent, missing) are judged here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from fleetwatch.rules.health_evidence import (
    BootSample,
    GpuEvidence,
    HealthVerdict,
    Rule,
    at_sample,
)
from fleetwatch.rules.health_rates import judge_rates
from fleetwatch.rules.health_state import judge_memory_state, judge_recovery_action
from fleetwatch.rules.thresholds import HealthThresholds, source_of
from fleetwatch.telemetry import Event, GpuSample

__all__ = ["BootSample", "HealthVerdict", "judge_health", "judge_missing_gpus"]

TEMPERATURE_MARGIN = Rule(
    "temperature_margin",
    action="investigate",
    severity="warning",
    counts_against_gpu=False,
    source=source_of("temp_margin_c"),
    note="near HW slowdown: check cooling (airflow, fans, inlet) before the GPU",
)
PERSISTENT_THROTTLE = Rule(
    "persistent_throttle",
    action="investigate",
    severity="warning",
    counts_against_gpu=False,
    source=source_of("throttle_fraction"),
    note="HW slowdown / thermal / power brake most of the window: cooling or PSU first",
)
GPU_LOST = Rule(
    "gpu_lost",
    action="reboot_node",
    severity="critical",
    counts_against_gpu=True,
    source="NVIDIA Xid catalog 79 (RESTART_BM); NVSentinel NVS#155 (off-bus text without Xid)",
    note="GPU fallen off the bus: drain the node, then reboot",
)
GPU_SILENT = Rule(
    "gpu_silent",
    action="investigate",
    severity="warning",
    counts_against_gpu=False,
    source=source_of("gpu_silent_after_s"),
    note="no samples: agent down or GPU gone; judge_missing_gpus tells them apart",
)
GPU_MISSING = Rule(
    "gpu_missing",
    action="reboot_node",
    severity="critical",
    counts_against_gpu=True,
    source="NVIDIA Xid catalog 79 (RESTART_BM); NVSentinel detects off-bus without Xid",
    note="GPU fallen off the bus: drain the node, then reboot; inspect if it returns",
)


def judge_health(
    samples: Sequence[BootSample | GpuSample],
    *,
    events: Iterable[Event] = (),
    thresholds: HealthThresholds,
    now: datetime,
    expected_gpus: Collection[str] | None = None,
    gpu_name: str | None = None,
) -> list[HealthVerdict]:
    """Verdicts for one GPU's samples (oldest first) as of ``now``.

    ``events`` may hold ``gpu_lost`` events; one for this GPU with no reboot after it is an
    off-the-bus verdict. ``expected_gpus`` (UUIDs the node should carry): when given and this GPU
    is in it, a newest sample older than ``gpu_silent_after_s`` is a ``gpu_silent`` verdict.
    ``gpu_name`` (product name) selects the per-SKU slowdown temperature.
    """
    series = [s if isinstance(s, BootSample) else BootSample(None, s) for s in samples]
    series = [s for s in series if s.sample.ts <= now]
    if not series:
        return []
    e = GpuEvidence(series, thresholds, now)
    judge_memory_state(e)
    judge_recovery_action(e)
    judge_rates(e)
    _temperature(e, gpu_name)
    _throttling(e)
    _lost(e, events)
    if expected_gpus is not None and e.uuid in expected_gpus:
        _silent(e)
    return e.out


def judge_missing_gpus(
    expected_uuids: Collection[str],
    reporting_uuids: Collection[str],
    *,
    now: datetime,
    last_seen: Mapping[str, datetime] | None = None,
) -> list[HealthVerdict]:
    """A verdict for each GPU the node carried but no longer reports while it reports others.

    A node that reports nothing is down or unreachable, a node problem rather than a GPU one, so
    an empty ``reporting_uuids`` gives no verdicts.
    """
    if not reporting_uuids:
        return []
    reporting = set(reporting_uuids)
    seen = last_seen or {}
    return [
        GPU_MISSING.verdict(
            uuid,
            {"reporting": sorted(reporting), "last_seen": seen.get(uuid), "now": now},
            last=seen.get(uuid),
        )
        for uuid in sorted(set(expected_uuids) - reporting)
    ]


def _temperature(e: GpuEvidence, gpu_name: str | None) -> None:
    got = e.latest("gpu_temp_c", volatile=False)
    if got is None:
        return
    slowdown, sku = e.t.slowdown_for(gpu_name)
    temp, at = got
    margin = slowdown - temp
    if margin <= e.t.temp_margin_c:
        evidence = at_sample(
            at,
            gpu_temp_c=temp,
            slowdown_temp_c=slowdown,
            sku=sku,
            margin_c=margin,
            threshold=e.t.temp_margin_c,
        )
        e.emit(TEMPERATURE_MARGIN, evidence, last=at.sample.ts)


def _throttling(e: GpuEvidence) -> None:
    t = e.t
    since = e.now - timedelta(seconds=t.throttle_window_s)
    seen = [
        (s.sample.ts, r)
        for s in e.series
        if s.sample.ts > since and (r := s.sample.clocks_event_reasons) is not None
    ]
    if len(seen) < t.throttle_min_samples:
        return
    hit = [(ts, r & t.throttle_mask) for ts, r in seen if r & t.throttle_mask]
    fraction = len(hit) / len(seen)
    if fraction < t.throttle_fraction:
        return
    bits = {f"0x{b:x}": sum(1 for _, r in hit if r & b) for b in (0x8, 0x20, 0x40, 0x80)}
    evidence = {
        "samples": len(seen),
        "throttled": len(hit),
        "fraction": fraction,
        "bits": {k: v for k, v in bits.items() if v},
        "window_s": t.throttle_window_s,
        "threshold": t.throttle_fraction,
    }
    e.emit(PERSISTENT_THROTTLE, evidence, first=hit[0][0], last=hit[-1][0])


def _lost(e: GpuEvidence, events: Iterable[Event]) -> None:
    lost = [ev for ev in events if ev.kind == "gpu_lost" and ev.uuid == e.uuid]
    for ev in sorted(lost, key=lambda ev: ev.ts)[-1:]:
        before = [s for s in e.series if s.sample.ts <= ev.ts]
        after = [s for s in e.series if s.sample.ts > ev.ts]
        boot = before[-1].boot_id if before else None
        # A sample from another boot after the loss: the node rebooted and the GPU is back.
        if boot is not None and any(s.boot_id not in (None, boot) for s in after):
            return
        evidence = {"event_ts": ev.ts, "message": ev.message, "boot_id": boot}
        e.emit(GPU_LOST, evidence, first=ev.ts, last=ev.ts)


def _silent(e: GpuEvidence) -> None:
    newest = e.series[-1].sample.ts
    quiet = (e.now - newest).total_seconds()
    if quiet >= e.t.gpu_silent_after_s:
        evidence = {"last_sample": newest, "silent_s": quiet, "threshold": e.t.gpu_silent_after_s}
        e.emit(GPU_SILENT, evidence, last=newest)
