"""Fleet health overview: liveness by rack, risk top-N, fatal verdicts, Xid rate, evictions.

Every panel reads FleetWatch's default /metrics page (job ``fleetwatch``) except those that name a
GPU or a rack: "Riskiest GPUs" and the two rack panels read the shard job's per-GPU failure
probabilities and node labels (``fleetwatch-shards``, dashboards/prometheus/prometheus.yml).
Fleet-wide counts come from fleet-level series (``fleetwatch_gpus``,
``fleetwatch_fleet_xid_events_total``), not from summing one series per GPU at every refresh.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash

from fleetwatch.dashboards.panels import (
    RATE,
    bars,
    layout,
    single_stat,
    table_panel,
    time_series,
)

__all__ = ["fleet_health"]

FATAL = 'fleetwatch_gpu_verdict{severity=~"critical|fatal"}'


def fleet_health() -> dash.Dashboard:
    return (
        layout(
            "FleetWatch / Fleet health",
            "fleetwatch-fleet-health",
            "The whole fleet at a glance: which nodes report, which GPUs are judged fatal or "
            "risky, Xid errors, and evictions against the drain budget.",
        )
        .with_row(dash.Row("Fleet"))
        .with_panel(single_stat("Nodes up", 'sum(fleetwatch_nodes{state="up"})'))
        .with_panel(
            single_stat(
                "Nodes unreachable",
                'sum(fleetwatch_nodes{state="unreachable"})',
                description="Silent for 3 of their push intervals.",
            )
        )
        .with_panel(
            single_stat(
                "GPUs",
                "sum(fleetwatch_gpus)",
                description="GPUs that reported within a day, judged by the newest assessment.",
            )
        )
        .with_panel(
            single_stat(
                "GPUs with a critical or fatal verdict",
                f"count(count by (uuid) ({FATAL})) or vector(0)",
            )
        )
        .with_panel(
            single_stat(
                "Draining nodes / budget",
                "sum(fleetwatch_draining_nodes) / sum(fleetwatch_drain_budget_nodes)",
                unit="percentunit",
                description="100 % means new evictions are paged to a person, not drained.",
            )
        )
        .with_panel(
            single_stat(
                "Assessment age",
                "time() - max(fleetwatch_assessment_timestamp_seconds)",
                unit="s",
                description="Seconds since FleetWatch last judged the fleet (normally < 60).",
            )
        )
        .with_panel(
            table_panel(
                "Node state by rack",
                "max by (cluster, row, rack, node) (fleetwatch_node_up "
                "* on (node) group_left (cluster, row, rack) fleetwatch_node_info)",
                description="1 = reporting, 0 = unreachable; racks from fleetwatch_node_info.",
                w=12,
                h=10,
            )
        )
        .with_panel(
            bars(
                "Nodes up per rack",
                [
                    (
                        "sum by (rack) (fleetwatch_node_up "
                        "* on (node) group_left (rack) fleetwatch_node_info)",
                        "{{rack}}",
                    )
                ],
            )
        )
        .with_row(dash.Row("Risk and verdicts"))
        .with_panel(
            table_panel(
                "Riskiest nodes (7-day failure probability)",
                'topk(10, fleetwatch_node_failure_probability{horizon="7d"})',
                unit="percentunit",
            )
        )
        .with_panel(
            table_panel(
                "Riskiest GPUs (1-day failure probability)",
                'topk(10, fleetwatch_gpu_failure_probability{horizon="1d"})',
                unit="percentunit",
            )
        )
        .with_panel(
            table_panel(
                "Critical and fatal verdicts",
                FATAL,
                description="Active rule verdicts; the action column is what FleetWatch advises.",
                w=24,
            )
        )
        .with_panel(
            time_series(
                "Xid rate by code",
                [
                    (
                        f"sum by (xid) (rate(fleetwatch_fleet_xid_events_total[{RATE}]))",
                        "Xid {{xid}}",
                    )
                ],
                unit="ops",
            )
        )
        .with_panel(
            time_series(
                "Ingest batches by outcome",
                [
                    (
                        f"sum by (outcome) (rate(fleetwatch_ingest_batches_total[{RATE}]))",
                        "{{outcome}}",
                    )
                ],
                unit="reqps",
            )
        )
        .with_panel(
            time_series(
                "GPUs at risk of failing within a day",
                [
                    (
                        'sum by (threshold) (fleetwatch_gpus_at_risk{horizon="1d"})',
                        "P >= {{threshold}}",
                    )
                ],
                description="GPUs whose 1-day failure probability is at least the threshold "
                "(1 for a GPU a rule took out of service).",
            )
        )
        .with_panel(
            time_series(
                "GPUs by worst verdict",
                [('sum by (verdict) (fleetwatch_gpus{verdict!="none"})', "{{verdict}}")],
                description="GPUs with an active rule verdict, by the most severe one.",
            )
        )
        .with_row(dash.Row("Evictions"))
        .with_panel(
            time_series(
                "Open evictions by state",
                [
                    (
                        "sum by (state) "
                        '(fleetwatch_evictions{state=~"pending|acked|completed|paged|recommended"})',
                        "{{state}}",
                    )
                ],
            )
        )
        .with_panel(
            time_series(
                "Drain budget",
                [
                    ("sum(fleetwatch_draining_nodes)", "draining"),
                    ("sum(fleetwatch_drain_budget_nodes)", "budget"),
                ],
            )
        )
    )
