"""Judge one GPU's recent telemetry: memory, interconnect, thermal and recovery-action rules.

:func:`judge_health` is pure: samples in, :class:`HealthVerdict` list out, time from ``now``.

Input: one GPU's samples, oldest first, each a :class:`BootSample` ``(boot_id, sample)`` or a
bare :class:`~fleetwatch.telemetry.GpuSample` (boot unknown). A boot id change means volatile
counters restarted (rates use :func:`~fleetwatch.rules.rates.counter_rates`) and the GPU was reset.

Verdicts describe the evidence *now*; none is sticky:

- state rules read the newest sample that reports the field; a later sample with another
  ``boot_id`` clears the volatile ones (DBE since driver load, pending flags, recovery action);
- rate rules sum counter increases in a trailing window ending at ``now``: a quiet one clears;
- a field that is absent (``None``) neither fires nor clears: the older reading stands.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from fleetwatch.rules.rates import CounterReading, counter_rates
from fleetwatch.rules.thresholds import HealthThresholds, source_of
from fleetwatch.rules.xid import RECOVERY_ACTIONS
from fleetwatch.rules.xid_catalog import Action, Severity
from fleetwatch.telemetry import Event, GpuSample

__all__ = ["BootSample", "HealthVerdict", "judge_health", "judge_missing_gpus"]


class BootSample(NamedTuple):
    """A sample with the ``boot_id`` of the node when it was taken (``None``: unknown)."""

    boot_id: str | None
    sample: GpuSample


@dataclass(frozen=True)
class HealthVerdict:
    """One decision about one GPU from its telemetry (vocabulary shared with ``XidVerdict``)."""

    gpu: str  # UUID
    rule: str
    action: Action
    severity: Severity
    counts_against_gpu: bool
    source: str  # where the threshold applied comes from
    evidence: Mapping[str, Any] = field(default_factory=dict)  # values, times, rates, threshold
    first_seen: datetime | None = None
    last_seen: datetime | None = None
    note: str = ""


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
    j = _Judge(series, thresholds, now)
    j.state_rules()
    j.rate_rules()
    j.temperature(gpu_name)
    j.throttling()
    j.lost(events)
    if expected_gpus is not None and j.uuid in expected_gpus:
        j.silent()
    return j.out


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
        HealthVerdict(
            uuid, "gpu_missing", "reboot_node", "critical", True,
            "NVIDIA Xid catalog 79 (RESTART_BM); NVSentinel detects off-bus without Xid",
            {"reporting": sorted(reporting), "last_seen": seen.get(uuid), "now": now},
            last_seen=seen.get(uuid),
            note="GPU fallen off the bus: drain the node, then reboot; inspect if it returns",
        )
        for uuid in sorted(set(expected_uuids) - reporting)
    ]  # fmt: skip


# (field, rule, action, volatile, source, note). Pending flags are volatile: a reset applies the
# remap or retirement. A remap failure is not: it is recorded on the GPU and survives resets.
_FLAG_RULES: tuple[tuple[str, str, Action, bool, str, str], ...] = (
    ("remapped_rows_failure", "row_remap_failure", "drain_inspect", False,
     "NVSentinel ROW_REMAP_FAILURE -> CONTACT_SUPPORT; Azure NHC, Meta GCM",
     "no spare row left: drain, field diagnostics, RMA"),
    ("remapped_rows_pending", "row_remap_pending", "reset_gpu", True,
     "NVSentinel DCGM_FR_PENDING_ROW_REMAP -> COMPONENT_RESET; Azure NHC, Meta GCM",
     "a row remap takes effect at the next GPU reset"),
    ("retired_pages_pending", "retired_pages_pending", "reset_gpu", True,
     "Meta GCM gpu_retired_pages.md (any pending -> CRITICAL)",
     "a page retirement takes effect at the next GPU reset"),
)  # fmt: skip


class _Judge:
    def __init__(self, series: list[BootSample], t: HealthThresholds, now: datetime) -> None:
        self.series, self.t, self.now = series, t, now
        self.uuid = series[-1].sample.uuid
        self.out: list[HealthVerdict] = []

    def emit(
        self, rule: str, action: Action, severity: Severity, counts: bool, source: str,
        evidence: dict[str, Any], first: datetime | None = None, last: datetime | None = None,
        note: str = "",
    ) -> None:  # fmt: skip
        self.out.append(
            HealthVerdict(self.uuid, rule, action, severity, counts, source, evidence,
                          first, last, note)
        )  # fmt: skip

    def latest(self, name: str, *, volatile: bool) -> tuple[Any, BootSample] | None:
        """Newest present value of ``name``; None if absent throughout or, for a volatile field,
        reset since (a later sample from another boot)."""
        for i in range(len(self.series) - 1, -1, -1):
            value = getattr(self.series[i].sample, name)
            if value is None:
                continue
            if volatile and self._rebooted_after(i):
                return None
            return value, self.series[i]
        return None

    def _rebooted_after(self, i: int) -> bool:
        boot = self.series[i].boot_id
        return boot is not None and any(
            s.boot_id is not None and s.boot_id != boot for s in self.series[i + 1 :]
        )

    def state_rules(self) -> None:
        t = self.t
        if (got := self.latest("ecc_dbe_volatile_total", volatile=True)) is not None:
            value, at = got
            if value > t.ecc_dbe_volatile_max:
                self.emit(
                    "ecc_dbe_volatile", "reset_gpu", "critical", True,
                    source_of("ecc_dbe_volatile_max"),
                    _ev(at, ecc_dbe_volatile_total=value, threshold=t.ecc_dbe_volatile_max),
                    last=at.sample.ts,
                    note="uncorrectable ECC since the driver loaded: reset the GPU",
                )  # fmt: skip
        for name, rule, action, volatile, source, note in _FLAG_RULES:
            if (got := self.latest(name, volatile=volatile)) is not None and got[0] is True:
                at = got[1]
                self.emit(rule, action, "critical", True, source, _ev(at, **{name: True}),
                          last=at.sample.ts, note=note)  # fmt: skip
        if (got := self.latest("remapped_rows_uncorrectable", volatile=False)) is not None:
            value, at = got
            if value >= t.remapped_rows_uncorrectable_limit:
                self.emit(
                    "remapped_rows_uncorrectable", "drain_inspect", "warning", True,
                    source_of("remapped_rows_uncorrectable_limit"),
                    _ev(at, remapped_rows_uncorrectable=value,
                        threshold=t.remapped_rows_uncorrectable_limit),
                    last=at.sample.ts, note="spare rows running out: plan an RMA",
                )  # fmt: skip
        self._retired_pages()
        if (got := self.latest("gpu_recovery_action", volatile=True)) is not None and got[0]:
            value, at = got
            name, action, severity = RECOVERY_ACTIONS.get(
                value, (f"UNKNOWN_{value}", "investigate", "warning")
            )
            self.emit(
                "gpu_recovery_action", action, severity, True,
                "NVML GPU_RECOVERY_ACTION / DCGM field 1523: the driver's own verdict",
                _ev(at, gpu_recovery_action=value, name=name), last=at.sample.ts,
                note=f"driver asks for {name}",
            )  # fmt: skip

    def _retired_pages(self) -> None:
        t = self.t
        sbe = self.latest("retired_pages_sbe", volatile=False)
        dbe = self.latest("retired_pages_dbe", volatile=False)
        if sbe is not None and dbe is not None:
            total = sbe[0] + dbe[0]
            if total >= t.retired_pages_total_limit:
                at = max(sbe[1], dbe[1], key=lambda b: b.sample.ts)
                self.emit(
                    "retired_pages_total", "drain_inspect", "critical", True,
                    source_of("retired_pages_total_limit"),
                    _ev(at, retired_pages_sbe=sbe[0], retired_pages_dbe=dbe[0], total=total,
                        threshold=t.retired_pages_total_limit),
                    last=at.sample.ts, note="page retirement table nearly full: RMA",
                )  # fmt: skip
        if dbe is None or dbe[0] <= t.retired_pages_dbe_max:
            return
        # "Still growing": the count rose within the growth window (retirements are persistent,
        # so the lowest in-window reading against the newest is the growth).
        since = self.now - timedelta(seconds=t.retired_pages_dbe_growth_window_s)
        window = [s for s in self.series if s.sample.ts >= since]
        values = [v for s in window if (v := s.sample.retired_pages_dbe) is not None]
        if values and dbe[0] > min(values):
            self.emit(
                "retired_pages_dbe", "drain_inspect", "critical", True,
                source_of("retired_pages_dbe_max"),
                _ev(dbe[1], retired_pages_dbe=dbe[0], growth=dbe[0] - min(values),
                    window_s=t.retired_pages_dbe_growth_window_s,
                    threshold=t.retired_pages_dbe_max),
                last=dbe[1].sample.ts, note="DBE page retirements still growing: RMA",
            )  # fmt: skip

    def window(self, name: str, window_s: float) -> dict[str, Any] | None:
        """Increase of counter ``name`` over the ``window_s`` before now, via counter_rates (a
        reset counts the post-reset value only, never a negative or full-counter jump). None
        when the field was never reported in the window."""
        since = self.now - timedelta(seconds=window_s)
        readings = [
            CounterReading(s.sample.ts, s.boot_id, getattr(s.sample, name)) for s in self.series
        ]
        in_window = [r for r in counter_rates(readings) if r["ts"] > since]
        if not in_window:
            return None
        increase = sum(r["increase"] for r in in_window)
        return {
            "increase": increase, "window_s": window_s, "per_s": increase / window_s,
            "from": in_window[0]["ts"], "to": in_window[-1]["ts"],
            "resets": sum(1 for r in in_window if r["reset"]),
            "first_increase": next((r["ts"] for r in in_window if r["increase"] > 0), None),
        }  # fmt: skip

    def rate_rule(
        self, rule: str, name: str, w: dict[str, Any] | None, fires: bool, threshold: Any,
        threshold_name: str, action: Action, severity: Severity, counts: bool, note: str,
    ) -> None:  # fmt: skip
        if w is None or not fires:
            return
        self.emit(
            rule, action, severity, counts, source_of(threshold_name),
            {"field": name, **w, "threshold": threshold, "threshold_name": threshold_name},
            first=w["first_increase"], last=w["to"], note=note,
        )  # fmt: skip

    def rate_rules(self) -> None:
        t = self.t
        w = self.window("ecc_sbe_volatile_total", t.sbe_window_s)
        per_min = w["increase"] * 60 / w["window_s"] if w else 0.0
        self.rate_rule(
            "ecc_sbe_rate", "ecc_sbe_volatile_total", w, per_min >= t.sbe_per_min,
            t.sbe_per_min, "sbe_per_min", "investigate", "warning", False,
            "corrected ECC burst: a trend to watch (Xid 92), no harm by itself",
        )  # fmt: skip
        for name in ("nvlink_crc_flit_errors_total", "nvlink_crc_data_errors_total"):
            w = self.window(name, t.nvlink_window_s)
            self.rate_rule(
                "nvlink_crc_rate", name, w, bool(w and w["per_s"] >= t.nvlink_crc_per_s),
                t.nvlink_crc_per_s, "nvlink_crc_per_s", "drain_inspect", "critical", True,
                "NVLink CRC errors at DCGM's FAIL rate: reseat / inspect the link",
            )  # fmt: skip
        w = self.window("nvlink_replay_errors_total", t.nvlink_window_s)
        self.rate_rule(
            "nvlink_replay", "nvlink_replay_errors_total", w,
            bool(w and w["increase"] >= t.nvlink_replay_limit), t.nvlink_replay_limit,
            "nvlink_replay_limit", "investigate", "warning", True,
            "DCGM fails on one replay a minute; NVRx only when >15 of 30 minutes have one",
        )  # fmt: skip
        w = self.window("nvlink_recovery_errors_total", t.nvlink_window_s)
        self.rate_rule(
            "nvlink_recovery", "nvlink_recovery_errors_total", w,
            bool(w and w["increase"] >= t.nvlink_recovery_limit), t.nvlink_recovery_limit,
            "nvlink_recovery_limit", "drain_inspect", "critical", True,
            "NVLink link recovered (retrained) in the last window",
        )  # fmt: skip
        self._pcie()

    def _pcie(self) -> None:
        t = self.t
        w = self.window("pcie_replay_total", t.pcie_window_s)
        gen = self.latest("pcie_link_gen", volatile=False)
        if w is None or gen is None:
            return  # without the generation there is no published limit to apply
        table = t.pcie_replay_per_lane_per_min
        # Gens outside the table take the nearest one (Gen1/2 the Gen3 rate: stricter, not laxer
        # than a modern link should be).
        nearest = min(table, key=lambda g: (abs(g - gen[0]), g))
        width = self.latest("pcie_link_width", volatile=False)
        # Width unknown: assume x16, the most replays allowed, so absence cannot cause a verdict.
        lanes = width[0] if width is not None else 16
        limit = math.ceil(table[nearest] * lanes)
        per_min = w["increase"] * 60 / w["window_s"]  # not per_s * 60: float error at the limit
        w |= {"link_gen": gen[0], "link_width": lanes, "per_lane_per_min": table[nearest]}
        self.rate_rule(
            "pcie_replay_rate", "pcie_replay_total", w, per_min > limit, limit,
            "pcie_replay_per_lane_per_min", "investigate", "warning", True,
            f"more than ceil({table[nearest]} x {lanes}) = {limit} PCIe replays/min: reseat, "
            "check riser/cable",
        )  # fmt: skip

    def temperature(self, gpu_name: str | None) -> None:
        got = self.latest("gpu_temp_c", volatile=False)
        if got is None:
            return
        slowdown, sku = self.t.slowdown_temp_c, None
        if gpu_name:
            matches = [k for k in self.t.slowdown_temp_by_sku if k.lower() in gpu_name.lower()]
            if matches:
                sku = max(matches, key=len)
                slowdown = self.t.slowdown_temp_by_sku[sku]
        margin = slowdown - got[0]
        if margin <= self.t.temp_margin_c:
            self.emit(
                "temperature_margin", "investigate", "warning", False, source_of("temp_margin_c"),
                _ev(got[1], gpu_temp_c=got[0], slowdown_temp_c=slowdown, sku=sku,
                    margin_c=margin, threshold=self.t.temp_margin_c),
                last=got[1].sample.ts,
                note="near HW slowdown: check cooling (airflow, fans, inlet) before the GPU",
            )  # fmt: skip

    def throttling(self) -> None:
        t = self.t
        since = self.now - timedelta(seconds=t.throttle_window_s)
        seen = [
            (s.sample.ts, r)
            for s in self.series
            if s.sample.ts > since and (r := s.sample.clocks_event_reasons) is not None
        ]
        if len(seen) < t.throttle_min_samples:
            return
        hit = [(ts, r & t.throttle_mask) for ts, r in seen if r & t.throttle_mask]
        fraction = len(hit) / len(seen)
        if fraction < t.throttle_fraction:
            return
        bits = {f"0x{b:x}": sum(1 for _, r in hit if r & b) for b in (0x8, 0x20, 0x40, 0x80)}
        self.emit(
            "persistent_throttle", "investigate", "warning", False,
            source_of("throttle_fraction"),
            {"samples": len(seen), "throttled": len(hit), "fraction": fraction,
             "bits": {k: v for k, v in bits.items() if v}, "window_s": t.throttle_window_s,
             "threshold": t.throttle_fraction},
            first=hit[0][0], last=hit[-1][0],
            note="HW slowdown / thermal / power brake most of the window: cooling or PSU first",
        )  # fmt: skip

    def lost(self, events: Iterable[Event]) -> None:
        lost = [e for e in events if e.kind == "gpu_lost" and e.uuid == self.uuid]
        for e in sorted(lost, key=lambda e: e.ts)[-1:]:
            before = [s for s in self.series if s.sample.ts <= e.ts]
            after = [s for s in self.series if s.sample.ts > e.ts]
            boot = before[-1].boot_id if before else None
            # A sample from another boot after the loss: the node rebooted and the GPU is back.
            if boot is not None and any(s.boot_id not in (None, boot) for s in after):
                return
            self.emit(
                "gpu_lost", "reboot_node", "critical", True,
                "NVIDIA Xid catalog 79 (RESTART_BM); NVSentinel NVS#155 (off-bus text without Xid)",
                {"event_ts": e.ts, "message": e.message, "boot_id": boot},
                first=e.ts, last=e.ts,
                note="GPU fallen off the bus: drain the node, then reboot",
            )  # fmt: skip

    def silent(self) -> None:
        newest = self.series[-1].sample.ts
        quiet = (self.now - newest).total_seconds()
        if quiet >= self.t.gpu_silent_after_s:
            self.emit(
                "gpu_silent", "investigate", "warning", False, source_of("gpu_silent_after_s"),
                {"last_sample": newest, "silent_s": quiet,
                 "threshold": self.t.gpu_silent_after_s},
                last=newest,
                note="no samples: agent down or GPU gone; judge_missing_gpus tells them apart",
            )  # fmt: skip


def _ev(at: BootSample, **values: Any) -> dict[str, Any]:
    return {**values, "ts": at.sample.ts, "boot_id": at.boot_id}
