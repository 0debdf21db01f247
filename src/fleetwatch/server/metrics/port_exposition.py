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

from sqlalchemy import Row, func, select

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
    node_ports.c.counters,
    node_ports.c.hw_counters,
    node_ports.c.rates,
)


# -- a shard ------------------------------------------------------------------------------------


def render_ports(db: Database, node_names: Mapping[int, str]) -> str:
    """The per-port families of the ports of ``node_names`` (node id to name), ordered by node
    name, device and port within each family."""
    rows = _load_ports(db, list(node_names))
    rows.sort(key=lambda r: (node_names[r.node_id], r.device, r.port))
    state: list[str] = []
    phys: list[str] = []
    rate: list[str] = []
    width: list[str] = []
    totals: list[list[str]] = [[] for _ in PORT_COUNTERS]
    rates: list[list[str]] = [[] for _ in PORT_COUNTERS]
    for row in rows:
        # Device names are [A-Za-z0-9._-]; a netdev may hold any printable but / (as Linux).
        labels = (
            f'node="{escape_label(node_names[row.node_id])}",device="{row.device}",'
            f'port="{row.port}"' + (f',netdev="{escape_label(row.netdev)}"' if row.netdev else "")
        )
        if row.state_code is not None:
            name = f',state="{row.state}"' if row.state else ""
            state.append(f"fleetwatch_port_state{{{labels}{name}}} {row.state_code}\n")
        if row.phys_state_code is not None:
            name = f',phys_state="{row.phys_state}"' if row.phys_state else ""
            phys.append(f"fleetwatch_port_phys_state{{{labels}{name}}} {row.phys_state_code}\n")
        if row.rate_gbps is not None:
            rate.append(
                f"fleetwatch_port_rate_bits_per_second{{{labels}}} {row.rate_gbps * 1e9!r}\n"
            )
        if row.link_width is not None:
            width.append(f"fleetwatch_port_link_width_lanes{{{labels}}} {row.link_width}\n")
        per_s: dict[str, Any] = row.rates or {}
        for i, spec in enumerate(PORT_COUNTERS):
            value = (getattr(row, spec.kind) or {}).get(spec.counter)
            if value is not None:
                totals[i].append(f"{spec.total}{{{labels}}} {value}\n")
            point = (per_s.get(spec.kind) or {}).get(spec.counter)
            if point is not None:
                rates[i].append(f"{spec.rate}{{{labels}}} {point['per_s']!r}\n")
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


def _load_ports(db: Database, node_ids: Sequence[int]) -> list[Row[Any]]:
    rows: list[Row[Any]] = []
    with db.read() as conn:
        for start in range(0, len(node_ids), IDS_PER_QUERY):
            chunk = node_ids[start : start + IDS_PER_QUERY]
            rows.extend(conn.execute(select(*_PORT_COLUMNS).where(node_ports.c.node_id.in_(chunk))))
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
