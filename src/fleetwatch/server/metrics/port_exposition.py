"""Network adapter ports (InfiniBand, RoCE) on /metrics, from each port's newest reading
(``node_ports``), read from the database per scrape.

On a shard's page, per port of the shard's nodes, labelled ``{node, device, port}`` plus
``netdev`` where the node reported one: ``fleetwatch_port_state`` and
``fleetwatch_port_phys_state`` (the state code as sysfs reads it, its name as a label),
``fleetwatch_port_rate_bits_per_second``, ``fleetwatch_port_link_width_lanes``, the error
counters of :data:`PORT_COUNTERS` as read (``_total``) and their per-second rates since the
reading before (``_per_second``, as the server computed them, resets counted from zero). A value
the port did not report (a counter this adapter lacks, RoCE counters on an InfiniBand port) has
no line, never a 0. About 100,000 ports at 100,000 GPUs: the shards' job, never the default page.

On the default page, fleet counts only (every family always present, so alert rules never meet an
absent series): ``fleetwatch_ports{state}`` (ports by logical state as read, lower-cased; ``active``
and ``down`` exported even at 0) and ``fleetwatch_ports_degraded``; per node, only where
nonzero, ``fleetwatch_node_ports_down{node}`` and ``fleetwatch_node_ports_degraded{node}``.

*Down* is logical state DOWN on a port whose physical state is not ``Disabled`` (a port switched
off on purpose is not a fault). *Degraded* is an ACTIVE port running below the fastest ACTIVE port
of the same link layer on its node: a node's compute adapters are alike (8 x NDR 400 Gb/s on an
HGX node), so one at 200 Gb/s has lost lanes or trained down. The alert
``FleetWatchPortDegraded`` compares each port with its own highest rate instead, from the shards.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, func, literal_column, select

from fleetwatch.server.db.base import Json
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import node_ports
from fleetwatch.server.metrics.fleet_cache import IDS_PER_QUERY
from fleetwatch.server.metrics.text import escape_label, family_header

__all__ = ["PORT_COUNTERS", "PortCounter", "render_port_summary", "render_ports"]


@dataclass(frozen=True)
class PortCounter:
    kind: str  # the column it is read from: "counters" or "hw_counters" (sysfs's two folders)
    counter: str  # the sysfs file name
    total: str  # the counter family, as read
    rate: str  # the per-second rate family
    help: str


PORT_COUNTERS: tuple[PortCounter, ...] = (
    PortCounter(
        "counters",
        "symbol_error",
        "fleetwatch_port_symbol_errors_total",
        "fleetwatch_port_symbol_errors_per_second",
        "Minor link errors detected on one or more physical lanes (symbol_error)",
    ),
    PortCounter(
        "counters",
        "link_downed",
        "fleetwatch_port_link_downed_total",
        "fleetwatch_port_link_downed_per_second",
        "Times the link error recovery failed and the link went down (link_downed)",
    ),
    PortCounter(
        "counters",
        "link_error_recovery",
        "fleetwatch_port_link_error_recovery_total",
        "fleetwatch_port_link_error_recovery_per_second",
        "Times the link recovered from an error by retraining (link_error_recovery)",
    ),
    PortCounter(
        "counters",
        "port_rcv_errors",
        "fleetwatch_port_rcv_errors_total",
        "fleetwatch_port_rcv_errors_per_second",
        "Packets received with an error (port_rcv_errors)",
    ),
    PortCounter(
        "counters",
        "port_xmit_discards",
        "fleetwatch_port_xmit_discards_total",
        "fleetwatch_port_xmit_discards_per_second",
        "Outbound packets discarded, port down or congested (port_xmit_discards)",
    ),
    PortCounter(
        "hw_counters",
        "roce_adp_retrans",
        "fleetwatch_port_roce_retransmissions_total",
        "fleetwatch_port_roce_retransmissions_per_second",
        "RoCE adaptive retransmissions (hw_counters/roce_adp_retrans)",
    ),
)

_STATE_HELP = (
    "Logical port state code as sysfs reads it (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, "
    "5 ACTIVE_DEFER); the state label is its name."
)
_PHYS_STATE_HELP = (
    "Physical port state code as sysfs reads it (2 Polling, 3 Disabled, 5 LinkUp, "
    "6 LinkErrorRecovery, ...); the phys_state label is its name."
)
_PORT_COLUMNS = (
    node_ports.c.node_id,
    node_ports.c.device,
    node_ports.c.port,
    node_ports.c.netdev,
    node_ports.c.state,
    node_ports.c.state_code,
    node_ports.c.phys_state,
    node_ports.c.phys_state_code,
    node_ports.c.rate_gbps,
    node_ports.c.link_width,
)


def _exported_values(dialect: str) -> ColumnElement[Any]:
    """One JSON array per port of only the values exported: for each of PORT_COUNTERS in turn,
    the counter as read and its rate's point (``{per_s, increase, reset}``), null where absent.

    A port's ``counters`` and ``rates`` hold every counter of its adapter (about 20, each rate
    with its increase and reset flag); decoding both whole cost more than rendering the shard's
    ports, and a column per value costs a decode per value. The database copies each value's
    JSON text as stored (PostgreSQL's jsonb ``->``, SQLite's ``->``), so the values are the ones
    a whole decode gives. The names are constants of this module, not input.
    """
    if dialect == "postgresql":
        parts = [
            f"{spec.kind} -> '{spec.counter}', rates -> '{spec.kind}' -> '{spec.counter}'"
            for spec in PORT_COUNTERS
        ]
        return literal_column(f"jsonb_build_array({', '.join(parts)})", Json)
    parts = [
        f"{spec.kind} -> '$.{spec.counter}', rates -> '$.{spec.kind}.{spec.counter}'"
        for spec in PORT_COUNTERS
    ]
    return literal_column(f"json_array({', '.join(parts)})", Json)


# -- a shard ------------------------------------------------------------------------------------


def render_ports(db: Database, node_names: Mapping[int, str]) -> str:
    """The per-port families of the ports of ``node_names`` (node id to name), ordered by node
    name, device and port within each family."""
    rows = _load_ports(db, list(node_names))
    rows.sort(key=lambda r: (node_names[r[0]], r[1], r[2]))
    state: list[str] = []
    phys: list[str] = []
    rate: list[str] = []
    width: list[str] = []
    totals: list[list[str]] = [[] for _ in PORT_COUNTERS]
    rates: list[list[str]] = [[] for _ in PORT_COUNTERS]
    # (total's name + "{", its lines, rate's name + "{", its lines) per counter, in row order.
    outputs = [
        (spec.total + "{", totals[i], spec.rate + "{", rates[i])
        for i, spec in enumerate(PORT_COUNTERS)
    ]
    escaped_nodes = {node_id: escape_label(name) for node_id, name in node_names.items()}
    for row in rows:
        node_id, device, port, netdev, state_name, state_code, phys_name, phys_code = row[:8]
        rate_gbps, link_width = row[8], row[9]
        # Device names are [A-Za-z0-9._-]; a netdev may hold any printable but / (as Linux).
        labels = f'node="{escaped_nodes[node_id]}",device="{device}",port="{port}"' + (
            f',netdev="{escape_label(netdev)}"' if netdev else ""
        )
        closed = labels + "} "
        if state_code is not None:
            name = f',state="{state_name}"' if state_name else ""
            state.append(f"fleetwatch_port_state{{{labels}{name}}} {state_code}\n")
        if phys_code is not None:
            name = f',phys_state="{phys_name}"' if phys_name else ""
            phys.append(f"fleetwatch_port_phys_state{{{labels}{name}}} {phys_code}\n")
        if rate_gbps is not None:
            rate.append(f"fleetwatch_port_rate_bits_per_second{{{closed}{rate_gbps * 1e9!r}\n")
        if link_width is not None:
            width.append(f"fleetwatch_port_link_width_lanes{{{closed}{link_width}\n")
        values = row[10]
        for i, (total_name, total_lines, rate_name, rate_lines) in enumerate(outputs):
            value = values[2 * i]
            if value is not None:
                total_lines.append(f"{total_name}{closed}{value}\n")
            point = values[2 * i + 1]
            if point is not None:
                rate_lines.append(f"{rate_name}{closed}{point['per_s']!r}\n")
    families = [
        ("fleetwatch_port_state", _STATE_HELP, state),
        ("fleetwatch_port_phys_state", _PHYS_STATE_HELP, phys),
        ("fleetwatch_port_rate_bits_per_second", "Link rate the port trained to.", rate),
        ("fleetwatch_port_link_width_lanes", "Lanes in use (4 for 4X).", width),
    ]
    out = [
        family_header(name, "gauge", text) + "".join(lines)
        for name, text, lines in families
        if lines
    ]
    for spec, total_lines, rate_lines in zip(PORT_COUNTERS, totals, rates, strict=True):
        if total_lines:
            out.append(family_header(spec.total, "counter", spec.help + ", as read."))
            out.extend(total_lines)
        if rate_lines:
            out.append(
                family_header(
                    spec.rate, "gauge", spec.help + ", per second since the reading before."
                )
            )
            out.extend(rate_lines)
    return "".join(out)


def _load_ports(db: Database, node_ids: Sequence[int]) -> list[Any]:
    """The ports of ``node_ids``: rows of the columns of _PORT_COLUMNS, then _exported_values."""
    rows: list[Any] = []
    with db.read() as conn:
        query = select(*_PORT_COLUMNS, _exported_values(conn.dialect.name))
        for start in range(0, len(node_ids), IDS_PER_QUERY):
            chunk = node_ids[start : start + IDS_PER_QUERY]
            rows.extend(conn.execute(query.where(node_ports.c.node_id.in_(chunk))).all())
    return rows


# -- the default page ---------------------------------------------------------------------------


def render_port_summary(db: Database, node_names: Mapping[int, str]) -> str:
    """The fleet's port counts, and the nodes with a port down or degraded (``node_names``: node
    id to name, of every node)."""
    # One scan, grouped: a node's ports are nearly all alike, so this is about one row per node
    # (12,500 at 100,000 ports) rather than one per port, and the rest is counted here.
    state = func.upper(node_ports.c.state)
    phys = func.lower(node_ports.c.phys_state)
    layer = func.coalesce(node_ports.c.link_layer, "")
    with db.read() as conn:
        groups = conn.execute(
            select(
                node_ports.c.node_id, state, phys, layer, node_ports.c.rate_gbps, func.count()
            ).group_by(node_ports.c.node_id, state, phys, layer, node_ports.c.rate_gbps)
        ).all()
    states: Counter[str] = Counter({"active": 0, "down": 0})
    down: Counter[int] = Counter()
    fastest: dict[tuple[int, str], float] = {}
    for node_id, name, phys_name, link_layer, rate, n in groups:
        if name is not None:
            states[name.lower()] += n
        if name == "DOWN" and phys_name != "disabled":
            down[node_id] += n
        if name == "ACTIVE" and rate is not None:
            key = (node_id, link_layer)
            fastest[key] = max(rate, fastest.get(key, rate))
    degraded: Counter[int] = Counter()
    for node_id, name, _phys, link_layer, rate, n in groups:
        if name == "ACTIVE" and rate is not None and rate < fastest[(node_id, link_layer)]:
            degraded[node_id] += n
    return "".join(
        [
            family_header(
                "fleetwatch_ports",
                "gauge",
                "Network adapter ports by logical state as read (active, down, init, armed, ...).",
            ),
            *(
                f'fleetwatch_ports{{state="{escape_label(s)}"}} {n}\n'
                for s, n in sorted(states.items())
            ),
            family_header(
                "fleetwatch_ports_degraded",
                "gauge",
                "Active ports running below the fastest active port of the same link layer on "
                "their node.",
            ),
            f"fleetwatch_ports_degraded {degraded.total()}\n",
            _per_node(
                "fleetwatch_node_ports_down",
                "Ports of the node whose logical state is DOWN and that are not disabled "
                "(only nodes with one).",
                down,
                node_names,
            ),
            _per_node(
                "fleetwatch_node_ports_degraded",
                "Active ports of the node below its fastest of the same link layer "
                "(only nodes with one).",
                degraded,
                node_names,
            ),
        ]
    )


def _per_node(
    name: str, help_text: str, counts: Counter[int], node_names: Mapping[int, str]
) -> str:
    lines = sorted(
        (node_names[node_id], n) for node_id, n in counts.items() if n and node_id in node_names
    )
    if not lines:
        return ""
    return family_header(name, "gauge", help_text) + "".join(
        f'{name}{{node="{escape_label(node)}"}} {n}\n' for node, n in lines
    )
