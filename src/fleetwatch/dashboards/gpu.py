"""GPU detail, templated on node and GPU index: thermals, power, clocks, throttling, memory
errors, NVLink, PCIe, risk history and verdicts.

The GPU's series come from the shard pages of /metrics (job ``fleetwatch-shards``), its verdicts
from the default page: a node's shard is found by its labels like any other series.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash

from fleetwatch.dashboards.panels import (
    RATE,
    layout,
    query_variable,
    table_panel,
    time_series,
)

__all__ = ["gpu_detail"]

SEL = 'node="$node", gpu="$gpu"'


def _m(name: str) -> str:
    return f"{name}{{{SEL}}}"


def _rate(name: str) -> str:
    return f"rate({name}{{{SEL}}}[{RATE}])"


def gpu_detail() -> dash.Dashboard:
    return (
        layout(
            "FleetWatch / GPU detail",
            "fleetwatch-gpu-detail",
            "One GPU's telemetry, risk and verdicts. Pick the node and GPU index above.",
        )
        .with_variable(query_variable("node", "Node", "label_values(fleetwatch_gpu_info, node)"))
        .with_variable(
            query_variable("gpu", "GPU", 'label_values(fleetwatch_gpu_info{node="$node"}, gpu)')
        )
        .with_row(dash.Row("Identity and verdicts"))
        .with_panel(table_panel("GPU", _m("fleetwatch_gpu_info"), w=24, h=4))
        .with_panel(
            table_panel(
                "Active verdicts",
                _m("fleetwatch_gpu_verdict"),
                description="Rule verdicts from the newest assessment (empty: healthy).",
                w=24,
                h=5,
            )
        )
        .with_panel(
            time_series(
                "Failure probability",
                [(_m("fleetwatch_gpu_failure_probability"), "{{horizon}}")],
                unit="percentunit",
            )
        )
        .with_panel(
            time_series(
                "Xid events",
                [(f"increase({_m('fleetwatch_xid_events_total')}[1h])", "Xid {{xid}}")],
                description="Per hour.",
            )
        )
        .with_row(dash.Row("Thermals, power, clocks"))
        .with_panel(
            time_series(
                "Temperature",
                [
                    (_m("fleetwatch_gpu_temperature_celsius"), "GPU"),
                    (_m("fleetwatch_gpu_memory_temperature_celsius"), "HBM"),
                ],
                unit="celsius",
            )
        )
        .with_panel(
            time_series(
                "Power",
                [
                    (_m("fleetwatch_gpu_power_watts"), "draw"),
                    (_m("fleetwatch_gpu_power_limit_watts"), "limit"),
                ],
                unit="watt",
            )
        )
        .with_panel(
            time_series(
                "Clocks",
                [
                    (_m("fleetwatch_gpu_sm_clock_hertz"), "SM"),
                    (_m("fleetwatch_gpu_memory_clock_hertz"), "memory"),
                ],
                unit="hertz",
            )
        )
        .with_panel(
            time_series(
                "Utilisation",
                [
                    (_m("fleetwatch_gpu_utilization_ratio"), "GPU"),
                    (
                        f"{_m('fleetwatch_gpu_framebuffer_used_bytes')} / "
                        f"{_m('fleetwatch_gpu_framebuffer_total_bytes')}",
                        "framebuffer",
                    ),
                ],
                unit="percentunit",
            )
        )
        .with_panel(
            time_series(
                "Throttle reasons",
                [(_m("fleetwatch_gpu_clocks_event_active"), "{{reason}}")],
                description="1 while NVML reports the clocks event reason.",
            )
        )
        .with_panel(
            time_series(
                "Time throttled",
                [
                    (_rate("fleetwatch_gpu_power_violation_seconds_total"), "power"),
                    (_rate("fleetwatch_gpu_thermal_violation_seconds_total"), "thermal"),
                ],
                unit="percentunit",
                description="Fraction of wall time the clocks were held down.",
            )
        )
        .with_row(dash.Row("Memory errors"))
        .with_panel(
            time_series(
                "ECC errors (volatile)",
                [
                    (_m("fleetwatch_gpu_ecc_sbe_volatile_errors_total"), "single-bit"),
                    (_m("fleetwatch_gpu_ecc_dbe_volatile_errors_total"), "double-bit"),
                ],
            )
        )
        .with_panel(
            time_series(
                "Remapped rows",
                [
                    (_m("fleetwatch_gpu_remapped_rows_correctable_total"), "correctable"),
                    (_m("fleetwatch_gpu_remapped_rows_uncorrectable_total"), "uncorrectable"),
                    (_m("fleetwatch_gpu_remapped_rows_pending"), "pending"),
                    (_m("fleetwatch_gpu_remapped_rows_failure"), "failure"),
                ],
            )
        )
        .with_row(dash.Row("Interconnect"))
        .with_panel(
            time_series(
                "NVLink errors",
                [
                    (_rate("fleetwatch_gpu_nvlink_crc_flit_errors_total"), "CRC flit"),
                    (_rate("fleetwatch_gpu_nvlink_crc_data_errors_total"), "CRC data"),
                    (_rate("fleetwatch_gpu_nvlink_replay_errors_total"), "replay"),
                    (_rate("fleetwatch_gpu_nvlink_recovery_errors_total"), "recovery"),
                ],
                unit="ops",
            )
        )
        .with_panel(
            time_series(
                "PCIe",
                [
                    (_m("fleetwatch_gpu_pcie_link_generation"), "generation"),
                    (_m("fleetwatch_gpu_pcie_link_width_lanes"), "width"),
                    (_rate("fleetwatch_gpu_pcie_replays_total"), "replays/s"),
                ],
            )
        )
    )
