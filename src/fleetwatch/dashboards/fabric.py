"""The fabric: network adapter ports (InfiniBand, RoCE) and host errors from the kernel log.

Fleet counts (ports by state, degraded ports, host errors by kind and severity) and the nodes with
a port down or degraded come from the default /metrics page (job ``fleetwatch``); per-port errors,
flaps and retransmissions from the shard pages (``fleetwatch-shards``), where each port has its
series (about one port per GPU: too many for the default page).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash

from fleetwatch.dashboards.panels import RATE, layout, single_stat, table_panel, time_series

__all__ = ["fabric"]

# (family, legend) of the port error counters summed fleet-wide on "Port errors per second".
_ERRORS = (
    ("fleetwatch_port_symbol_errors_total", "symbol errors"),
    ("fleetwatch_port_link_error_recovery_total", "link error recoveries"),
    ("fleetwatch_port_rcv_errors_total", "receive errors"),
    ("fleetwatch_port_xmit_discards_total", "transmit discards"),
)


def fabric() -> dash.Dashboard:
    return (
        layout(
            "FleetWatch / Fabric",
            "fleetwatch-fabric",
            "InfiniBand and RoCE ports: which are down or degraded, their error counters and "
            "link flaps, RoCE retransmissions, and host errors (SXid, PCIe AER, MCE, EDAC).",
        )
        .with_row(dash.Row("Ports"))
        .with_panel(single_stat("Ports active", 'sum(fleetwatch_ports{state="active"})'))
        .with_panel(
            single_stat(
                "Ports down",
                'sum(fleetwatch_ports{state="down"})',
                description="Logical state DOWN, disabled ports included.",
            )
        )
        .with_panel(
            single_stat(
                "Degraded links",
                "sum(fleetwatch_ports_degraded)",
                description="Active ports below the fastest active port of the same link "
                "layer on their node.",
            )
        )
        .with_panel(
            time_series(
                "Ports by state",
                [("sum by (state) (fleetwatch_ports)", "{{state}}")],
                w=12,
            )
        )
        .with_panel(
            table_panel(
                "Nodes with a port down",
                "sort_desc(max by (node) (fleetwatch_node_ports_down))",
                description="Ports DOWN and not disabled (the FleetWatchPortDown alert).",
            )
        )
        .with_panel(
            table_panel(
                "Nodes with a degraded link",
                "sort_desc(max by (node) (fleetwatch_node_ports_degraded))",
            )
        )
        .with_row(dash.Row("Errors and flaps"))
        .with_panel(
            time_series(
                "Port errors per second",
                [(f"sum(rate({name}[{RATE}]))", legend) for name, legend in _ERRORS],
                description="Fleet-wide sums of each error counter's rate.",
                w=12,
            )
        )
        .with_panel(
            table_panel(
                "Ports with the most symbol errors (last hour)",
                "topk(10, sum by (node, device, port) "
                "(increase(fleetwatch_port_symbol_errors_total[1h])))",
            )
        )
        .with_panel(
            time_series(
                "Link flaps per port (link_downed, last hour)",
                [
                    (
                        "topk(10, sum by (node, device, port) "
                        "(increase(fleetwatch_port_link_downed_total[1h])))",
                        "{{node}} {{device}}/{{port}}",
                    )
                ],
                description="3 or more in an hour alerts (FleetWatchLinkFlapping).",
                w=12,
            )
        )
        .with_panel(
            time_series(
                "RoCE retransmissions per second",
                [
                    (
                        "topk(10, sum by (node, device, port) "
                        f"(rate(fleetwatch_port_roce_retransmissions_total[{RATE}])))",
                        "{{node}} {{device}}/{{port}}",
                    )
                ],
                w=12,
            )
        )
        .with_row(dash.Row("Host errors"))
        .with_panel(
            time_series(
                "Host errors by kind and severity (per hour)",
                [
                    (
                        "sum by (kind, severity) "
                        "(increase(fleetwatch_fleet_host_events_total[1h]))",
                        "{{kind}} {{severity}}",
                    )
                ],
                w=12,
            )
        )
        .with_panel(
            table_panel(
                "Host errors by node",
                "sort_desc(sum by (node, kind, severity) (fleetwatch_host_events_total))",
                description="Counted since the database began.",
            )
        )
    )
