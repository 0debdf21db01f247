"""Stragglers: per-job step-time slowdown of each node, and each node's slowness score.

The slowdown ratios are on FleetWatch's default /metrics page (the straggler alert reads them);
the slowness scores are per-node detail, on the shard pages (job ``fleetwatch-shards``).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash

from fleetwatch.dashboards.panels import layout, table_panel, time_series

__all__ = ["stragglers"]


def stragglers() -> dash.Dashboard:
    return (
        layout(
            "FleetWatch / Stragglers",
            "fleetwatch-stragglers",
            "Nodes that slow synchronous jobs down: a node's median step time over its job's "
            "median (1.25 and above for 5 minutes alerts).",
        )
        .with_panel(
            time_series(
                "Step slowdown ratio by node and job",
                [("fleetwatch_node_step_slowdown_ratio", "{{node}} / {{job}}")],
                description="Jobs judged in the last 10 minutes; 1 = as fast as the job median.",
                w=24,
            )
        )
        .with_panel(
            table_panel(
                "Slowest nodes now",
                "topk(10, max by (node, job) (fleetwatch_node_step_slowdown_ratio))",
            )
        )
        .with_panel(
            table_panel(
                "Slowness score (all jobs)",
                "sort_desc(fleetwatch_node_slowness_score)",
                description="Exponentially weighted step-time ratio of the node across jobs.",
            )
        )
        .with_panel(
            time_series(
                "Slowness score history",
                [("fleetwatch_node_slowness_score", "{{node}}")],
                w=24,
            )
        )
    )
