"""Reliability: failure probability trends, verdict counts, evictions, Xids and availability.

FleetWatch does not export MTBF; availability here is the fraction of nodes reporting
(``fleetwatch_node_up``), not of nodes in service. The GPU failure probability panels read the
shard job's per-GPU series (``fleetwatch-shards``); the rest reads the default page.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash

from fleetwatch.dashboards.panels import RATE, layout, single_stat, time_series

__all__ = ["reliability"]


def reliability() -> dash.Dashboard:
    return (
        layout(
            "FleetWatch / Reliability",
            "fleetwatch-reliability",
            "How the fleet's health trends: risk, verdicts, evictions and Xid errors over time.",
        )
        .time("now-7d", "now")
        .with_panel(
            single_stat(
                "Node availability",
                "avg(fleetwatch_node_up)",
                unit="percentunit",
                description="Fraction of known nodes reporting now (MTBF is not exported).",
                w=6,
            )
        )
        .with_panel(
            single_stat(
                "Mean 7-day GPU failure probability",
                'avg(fleetwatch_gpu_failure_probability{horizon="7d"})',
                unit="percentunit",
                w=6,
            )
        )
        .with_panel(single_stat("Risk model version", "max(fleetwatch_risk_model_version)", w=6))
        .with_panel(
            single_stat(
                "Xid events (24 h)",
                "sum(increase(fleetwatch_fleet_xid_events_total[1d]))",
                w=6,
            )
        )
        .with_panel(
            time_series(
                "Failure probability (fleet mean and worst node)",
                [
                    (
                        "avg by (horizon) (fleetwatch_gpu_failure_probability)",
                        "mean GPU {{horizon}}",
                    ),
                    (
                        "max by (horizon) (fleetwatch_node_failure_probability)",
                        "worst node {{horizon}}",
                    ),
                ],
                unit="percentunit",
            )
        )
        .with_panel(
            time_series(
                "Active verdicts by severity",
                [("count by (severity) (fleetwatch_gpu_verdict)", "{{severity}}")],
            )
        )
        .with_panel(
            time_series(
                "Evictions by state",
                [("sum by (state) (fleetwatch_evictions)", "{{state}}")],
            )
        )
        .with_panel(
            time_series(
                "Events by kind",
                [(f"sum by (kind) (rate(fleetwatch_fleet_events_total[{RATE}]))", "{{kind}}")],
                unit="ops",
            )
        )
        .with_panel(
            time_series(
                "Node availability",
                [("avg(fleetwatch_node_up)", "reporting")],
                unit="percentunit",
                w=24,
            )
        )
    )
