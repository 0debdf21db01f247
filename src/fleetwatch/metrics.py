"""The per-GPU Prometheus metric families: what the server exports and the dashboards query.

Per-GPU metrics are named from the canonical fields in base units (Prometheus' convention):
MHz become hertz, mJ joules, MiB bytes, percentages ratios. The server's own families (ingest,
background jobs, leadership) are in :mod:`fleetwatch.server.runtime.metric_families`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GPU_METRICS", "GpuMetric", "THROTTLE_REASONS"]


@dataclass(frozen=True)
class GpuMetric:
    field: str
    name: str
    type: str  # "gauge" or "counter"
    scale: float
    help: str


def _g(field: str, name: str, help: str, scale: float = 1.0) -> GpuMetric:
    return GpuMetric(field, f"fleetwatch_gpu_{name}", "gauge", scale, help)


def _c(field: str, name: str, help: str, scale: float = 1.0) -> GpuMetric:
    return GpuMetric(field, f"fleetwatch_gpu_{name}_total", "counter", scale, help)


GPU_METRICS: tuple[GpuMetric, ...] = (
    _g("gpu_temp_c", "temperature_celsius", "GPU die temperature."),
    _g("memory_temp_c", "memory_temperature_celsius", "HBM temperature."),
    _g("power_w", "power_watts", "Board power draw."),
    _g("power_limit_w", "power_limit_watts", "Enforced power limit."),
    _c("energy_mj", "energy_joules", "Energy consumed since the driver loaded.", 1e-3),
    _g("sm_clock_mhz", "sm_clock_hertz", "SM clock.", 1e6),
    _g("mem_clock_mhz", "memory_clock_hertz", "Memory clock.", 1e6),
    _g("clocks_event_reasons", "clocks_event_reasons", "NVML clocks event reasons bitmask."),
    _c("power_violation_us", "power_violation_seconds", "Time throttled by the power limit.", 1e-6),
    _c("thermal_violation_us", "thermal_violation_seconds", "Time throttled by heat.", 1e-6),
    _g("fan_speed_pct", "fan_speed_ratio", "Fan speed.", 0.01),
    _g("gpu_util_pct", "utilization_ratio", "GPU utilisation.", 0.01),
    _g("mem_copy_util_pct", "memory_copy_utilization_ratio", "Memory copy utilisation.", 0.01),
    _g("fb_used_mib", "framebuffer_used_bytes", "Framebuffer used.", 1048576.0),
    _g("fb_total_mib", "framebuffer_total_bytes", "Framebuffer total.", 1048576.0),
    _g("pcie_link_gen", "pcie_link_generation", "Current PCIe link generation."),
    _g("pcie_link_width", "pcie_link_width_lanes", "Current PCIe link width."),
    _c(
        "ecc_sbe_volatile_total",
        "ecc_sbe_volatile_errors",
        "Single-bit ECC errors since driver load.",
    ),
    _c(
        "ecc_dbe_volatile_total",
        "ecc_dbe_volatile_errors",
        "Double-bit ECC errors since driver load.",
    ),
    _c("ecc_sbe_aggregate_total", "ecc_sbe_aggregate_errors", "Single-bit ECC errors, lifetime."),
    _c("ecc_dbe_aggregate_total", "ecc_dbe_aggregate_errors", "Double-bit ECC errors, lifetime."),
    _c("retired_pages_sbe", "retired_pages_sbe", "Pages retired for single-bit errors."),
    _c("retired_pages_dbe", "retired_pages_dbe", "Pages retired for double-bit errors."),
    _g("retired_pages_pending", "retired_pages_pending", "1 if a page retirement awaits a reset."),
    _c("remapped_rows_correctable", "remapped_rows_correctable", "Rows remapped, correctable."),
    _c(
        "remapped_rows_uncorrectable",
        "remapped_rows_uncorrectable",
        "Rows remapped, uncorrectable.",
    ),
    _g("remapped_rows_pending", "remapped_rows_pending", "1 if a row remap awaits a GPU reset."),
    _g("remapped_rows_failure", "remapped_rows_failure", "1 if a row remap failed."),
    _c("nvlink_crc_flit_errors_total", "nvlink_crc_flit_errors", "NVLink flow-control CRC errors."),
    _c("nvlink_crc_data_errors_total", "nvlink_crc_data_errors", "NVLink data CRC errors."),
    _c("nvlink_replay_errors_total", "nvlink_replay_errors", "NVLink replays."),
    _c("nvlink_recovery_errors_total", "nvlink_recovery_errors", "NVLink recoveries."),
    _c("pcie_replay_total", "pcie_replays", "PCIe replays."),
    _g("gpu_recovery_action", "recovery_action", "Driver's recovery action (0 = none)."),
)

# NVML clocks event reason bits (nvmlClocksEventReason*), exported one gauge per reason.
THROTTLE_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clocks_setting", 0x100),
)
