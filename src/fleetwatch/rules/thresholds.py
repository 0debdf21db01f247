"""Defaults for the telemetry health rules (:mod:`.health`), each citing where it comes from.

Every field carries its source in ``metadata["source"]`` (from
``shared/reference/health-signals.md``), so a verdict can quote the default it applied and the
tool that uses it. Where no anchor publishes a number the source says "FleetWatch choice" and why.

A fleet overrides any subset from a mapping, e.g. the ``[health]`` table of a TOML file::

    [health]
    nvlink_crc_per_s = 50
    slowdown_temp_c = 85
    [health.slowdown_temp_by_sku]
    "A10" = 98

Unknown keys, wrong types and out-of-range values raise :class:`ValueError` naming the key, so a
typo cannot silently leave a default in force.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

__all__ = ["HealthThresholds", "source_of"]


def _src(default: Any, source: str) -> Any:
    return field(default=default, metadata={"source": source})


def _src_map(default: Mapping[Any, float], source: str) -> Any:
    frozen = MappingProxyType(dict(default))
    return field(default_factory=lambda: frozen, metadata={"source": source})


@dataclass(frozen=True)
class HealthThresholds:
    """Thresholds of the health rules. Counts fire at ``>=`` the limit unless the name says max."""

    # Any uncorrectable error since the driver loaded means the GPU must be reset.
    ecc_dbe_volatile_max: int = _src(
        0, "DCGM health MonitorMemVolatileDbes: any volatile DBE -> FAIL; cluster-toolkit gpu-test"
    )
    # DCGM calls the GPU "in a bad state" at 512 uncorrectable remaps (spare rows running out).
    remapped_rows_uncorrectable_limit: int = _src(
        512, "DCGM DCGM_LIMIT_MAX_ROW_REMAP_UNCORRECTABLE (>= 512 -> warn)"
    )
    # Pre-Ampere page retirement: the retirement table holds 64 pages; DCGM fails at 63.
    retired_pages_total_limit: int = _src(
        63, "DCGM DcgmGPUHardwareLimits.h, MonitorMemSbeDbeRetiredPages (SBE+DBE >= 63 -> FAIL)"
    )
    # DBE retirements above 15 only fail while they keep coming (>= 1 in the last week).
    retired_pages_dbe_max: int = _src(
        15, "DCGM MonitorMemSbeDbeRetiredPages (DBE > 15 and still >= 1/week -> FAIL)"
    )
    retired_pages_dbe_growth_window_s: float = _src(
        7 * 86400.0, "DCGM MonitorMemSbeDbeRetiredPages (the 'still >= 1/week' part)"
    )
    # No anchor publishes an SBE-rate limit (DCGM's 10 is a dummy); corrected errors do no harm
    # but a burst is the trend signal Xid 92 reports, so warn on the same order of magnitude.
    sbe_per_min: float = _src(
        10.0, "FleetWatch choice; DCGM_LIMIT_MAX_SBE_RATE=10 is a placeholder (Xid 92 trend)"
    )
    sbe_window_s: float = _src(600.0, "FleetWatch choice (10 min, as GPUd's hw-slowdown window)")
    nvlink_crc_per_s: float = _src(
        100.0, "DCGM DCGM_LIMIT_MAX_NVLINK_CRC_ERROR (>= 100 errors/s over ~1 min -> FAIL)"
    )
    nvlink_window_s: float = _src(60.0, "DCGM MonitorNVLink (last minute)")
    nvlink_replay_limit: int = _src(
        1, "DCGM DCGM_LIMIT_MAX_NVLINK_ERROR, MonitorNVLink (>= 1 replay in last minute)"
    )
    nvlink_recovery_limit: int = _src(
        1, "DCGM DCGM_LIMIT_MAX_NVLINK_ERROR, MonitorNVLink (>= 1 recovery in last minute -> FAIL)"
    )
    # Allowed replays per lane per minute at BER 1e-12; the limit is ceil(rate x lanes).
    pcie_replay_per_lane_per_min: Mapping[int, float] = _src_map(
        {3: 0.48, 4: 0.96, 5: 1.92, 6: 3.84}, "DCGM DcgmHealthWatch.cpp PCIe replay limits"
    )
    pcie_window_s: float = _src(60.0, "DCGM DcgmHealthWatch.cpp (replays per minute)")
    # Lowest slowdown published in the reference (B200/GB200); SKUs with a higher one are listed
    # below (matched as a substring of the product name, longest match first).
    slowdown_temp_c: float = _src(87.0, "GPUd temperature/threshold.go (B200/GB200 ~87 C)")
    slowdown_temp_by_sku: Mapping[str, float] = _src_map(
        {"B200": 87.0, "A10": 98.0},
        "GPUd (B200/GB200 ~87 C); A10 98 C as nvidia-smi -q prints 'GPU Slowdown Temp'",
    )
    temp_margin_c: float = _src(
        2.0, "NVSentinel ADR-042 (margin < per-SKU slowdown offset, -2 C H100/GB200/L40S)"
    )
    # HW slowdown (0x8), SW thermal (0x20), HW thermal (0x40), HW power brake (0x80).
    throttle_mask: int = _src(0x8 | 0x20 | 0x40 | 0x80, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS bits")
    # GPUd counts >= 0.6 slowdown events/min over 10 min; with polled samples the closest
    # equivalent is the share of samples throttled. Half the window is "persistent".
    throttle_fraction: float = _src(0.5, "FleetWatch choice after GPUd hw-slowdown (0.6/min)")
    throttle_window_s: float = _src(600.0, "GPUd hw-slowdown/component.go (10 min window)")
    # A single throttled reading is not persistence; need a few samples before judging.
    throttle_min_samples: int = _src(3, "FleetWatch choice (no verdict from one or two samples)")
    # A GPU the node is expected to carry that sent nothing for this long is suspect.
    gpu_silent_after_s: float = _src(
        600.0, "GKE auto-repair (~10 min NotReady); EKS repairs 10 min after condition"
    )

    # Kernel-log hardware errors outside the GPU (rules.host_errors). Fatal and uncorrected
    # records drain at once with no threshold; these limits are for the repeated lesser ones.
    # A non-fatal SXid is contained by the switch, but the same error coming back means a part
    # that keeps failing: NVSentinel escalates any error repeated 5 times in 24 h.
    sxid_non_fatal_limit: int = _src(
        5, "NVSentinel health-events-analyzer values.yaml (same error 5x/24 h -> CONTACT_SUPPORT)"
    )
    sxid_window_s: float = _src(86400.0, "NVSentinel health-events-analyzer (24 h window)")
    # A corrected AER record is a TLP or DLLP the link had to resend or re-receive, the event
    # DCGM counts as a PCIe replay: its limit at Gen4 x16 is ceil(0.96 x 16) = 16 per minute.
    aer_corrected_limit: int = _src(
        16, "DCGM DcgmHealthWatch.cpp PCIe replay limit, Gen4 x16: ceil(0.96/lane/min x 16)"
    )
    aer_corrected_window_s: float = _src(60.0, "DCGM DcgmHealthWatch.cpp (replays per minute)")
    # Corrected DIMM errors, counted per DIMM label (the EDAC count, not the lines): mcelog's
    # default trigger for a DIMM that is wearing out. No anchor in the reference thresholds
    # host memory; GPU DRAM limits (Azure NHC, Meta GCM) are orders of magnitude too high.
    edac_corrected_limit: int = _src(
        10, "mcelog mcelog.conf default memory-ce-threshold = 10 / 24h (per DIMM)"
    )
    edac_corrected_window_s: float = _src(86400.0, "mcelog memory-ce-threshold (24 h)")

    # Network adapter ports (rules.port_health, rules.port_events). A link that went down once is
    # judged from its state, with no threshold; these are for the repeated and the gradual.
    # A port whose link_downed counter rose this many times within the window is flapping:
    # NVSentinel counts each link_downed increase as a fatal NIC event and escalates a port at
    # 3 degradation events in 1 h; azurehpc-health-checks' check_ib_link_flapping also drains a
    # node for repeated link-down lines within its lookback.
    port_flap_limit: int = _src(
        3, "NVSentinel nic-health-monitor link-counter-detection (3 events/1 h on a port)"
    )
    port_flap_window_s: float = _src(3600.0, "NVSentinel nic-health-monitor (1 h window)")
    # Error counters' increases per window, per port, at which a port is erroring. The IB
    # counters follow NVSentinel's symbol_error limit (> 120 per hour is fatal there) and the
    # infiniband-diags ibcheckerrs default threshold file (10 for LinkErrorRecovery, PortRcvErrors,
    # LocalLinkIntegrity, ExcessiveBufferOverrun; 100 for PortRcvRemotePhysicalErrors). The RoCE
    # retransmission counters (NVIDIA "Understanding mlx5 ethtool/rdma counters": each counts a
    # retransmitted or timed-out RDMA request) have no published limit: FleetWatch choice, set
    # where a lossless fabric is clearly not lossless (one per ~4 s for an hour).
    port_error_limits: Mapping[str, float] = _src_map(
        {
            "symbol_error": 120,
            "link_error_recovery": 10,
            "port_rcv_errors": 10,
            "port_rcv_remote_physical_errors": 100,
            "local_link_integrity_errors": 10,
            "excessive_buffer_overrun_errors": 10,
            "roce_adp_retrans": 1000,
            "roce_slow_restart": 100,
            "local_ack_timeout_err": 1000,
            "out_of_sequence": 1000,
        },
        "NVSentinel symbol_error > 120/h; infiniband-diags ibcheckerrs default thresholds; "
        "RoCE retransmission counters: FleetWatch choice",
    )
    port_error_window_s: float = _src(3600.0, "NVSentinel nic-health-monitor (per hour)")

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Mapping):
                for key, item in value.items():
                    _check_number(f"{f.name}.{key}", item, allow_zero=False)
            else:
                _check_number(f.name, value, allow_zero=True)
        if not 0 < self.throttle_fraction <= 1:
            raise ValueError(f"throttle_fraction must be in (0, 1], got {self.throttle_fraction}")
        windows = (
            "sbe_window_s",
            "nvlink_window_s",
            "pcie_window_s",
            "throttle_window_s",
            "sxid_window_s",
            "aer_corrected_window_s",
            "edac_corrected_window_s",
            "port_flap_window_s",
            "port_error_window_s",
        )
        for name in windows:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")

    def slowdown_for(self, gpu_name: str | None) -> tuple[float, str | None]:
        """The slowdown temperature for a GPU product name, and the SKU key that set it (None:
        the fleet default). The longest SKU key contained in the name wins."""
        if gpu_name:
            matches = [k for k in self.slowdown_temp_by_sku if k.lower() in gpu_name.lower()]
            if matches:
                sku = max(matches, key=len)
                return self.slowdown_temp_by_sku[sku], sku
        return self.slowdown_temp_c, None

    @classmethod
    def from_mapping(cls, overrides: Mapping[str, Any] | None = None) -> HealthThresholds:
        """The defaults with ``overrides`` applied (keys are field names)."""
        return cls().with_overrides(overrides or {})

    def with_overrides(self, overrides: Mapping[str, Any]) -> HealthThresholds:
        known = {f.name: f for f in fields(self)}
        changes: dict[str, Any] = {}
        for key, value in overrides.items():
            if key not in known:
                raise ValueError(f"unknown health threshold {key!r}; known: {sorted(known)}")
            default = getattr(self, key)
            if isinstance(default, Mapping):
                if not isinstance(value, Mapping):
                    raise ValueError(f"{key} must be a table")
                # A table extends the defaults (a fleet adds its SKUs, keeps the rest).
                keyed = {_map_key(key, k, default): v for k, v in value.items()}
                changes[key] = MappingProxyType({**default, **keyed})
            elif isinstance(default, int) and not isinstance(value, int):
                raise ValueError(f"{key} must be an integer, got {value!r}")
            else:
                changes[key] = value
        return replace(self, **changes)


def source_of(name: str) -> str:
    """The cited source of the default of threshold ``name``."""
    for f in fields(HealthThresholds):
        if f.name == name:
            return str(f.metadata["source"])
    raise KeyError(name)


def _map_key(name: str, key: Any, default: Mapping[Any, Any]) -> Any:
    # TOML table keys are strings; the PCIe table is keyed by link generation.
    if default and all(isinstance(k, int) for k in default):
        try:
            return int(key)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: key {key!r} must be a PCIe generation number") from None
    return str(key)


def _check_number(name: str, value: Any, *, allow_zero: bool) -> None:
    # bool is an int subclass; "true" as a threshold is always a mistake.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be a finite number {'>=' if allow_zero else '>'} 0")
