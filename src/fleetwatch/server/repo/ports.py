"""Network adapter ports: the newest reading of each, and its counters' rates since the one before.

A batch may carry several readings of one port (one per collection since the last push). They are
taken in time order after the stored one; each reading's rates are counted from the reading
before it, with counter resets handled as for GPU counters (:mod:`fleetwatch.rules.rates`: a
counter that dropped, or a changed boot id, counts from zero). A reading no newer than the stored
one (a replay, a clock stepped back) changes nothing.

Each new reading is also compared with the one before it (:mod:`fleetwatch.rules.port_events`):
a link gone down or come back, a flap, a rate below the port's normal, an error counter over its
limit become ``events`` rows for the port rules, and what the port remembers (its normal rate,
its error window) is kept in the row's ``health``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, insert, select, update

from fleetwatch.rules.port_events import derive_port_events, link_up
from fleetwatch.rules.port_health import is_urgent_port_event
from fleetwatch.rules.rates import CounterReading, counter_rates
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.server.db.tables import events, node_ports, nodes

__all__ = [
    "COUNTER_KINDS",
    "PortsStored",
    "list_ports",
    "port_evidence",
    "port_readings",
    "store_ports",
]

COUNTER_KINDS = ("counters", "hw_counters")
_STATE = (
    "link_layer",
    "node_guid",
    "netdev",
    "state",
    "state_code",
    "phys_state",
    "phys_state_code",
    "rate_gbps",
    "link_width",
    "link_speed",
    *COUNTER_KINDS,
)
_Key = tuple[str, int]


def port_readings(ports: Iterable[Any] | None) -> list[dict[str, Any]]:
    """A batch's ports as plain dicts (absent fields left out): the server's structs already
    hold dicts; tools and tests may pass the wire's ``PortSample`` models."""
    return [p if isinstance(p, dict) else p.model_dump(exclude_none=True) for p in ports or ()]


@dataclass(frozen=True)
class PortsStored:
    """What storing a batch's ports did: ports updated, and the port events it derived."""

    ports: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def urgent(self) -> bool:
        """A port went down or flapped past its limit: judge and plan now."""
        return any(is_urgent_port_event(e["kind"], e["details"]) for e in self.events)


def store_ports(
    conn: Connection,
    readings: Sequence[dict[str, Any]],
    *,
    node_id: int,
    boot_id: str | None,
    now: datetime | None = None,
    thresholds: HealthThresholds | None = None,
    batch_id: str | None = None,
) -> PortsStored:
    """Keep the newest reading of each port of ``node_id`` and store the events between it and
    the reading before."""
    if not readings:
        return PortsStored()
    t = thresholds or HealthThresholds()
    stored = {
        (row.device, row.port): row._asdict()
        for row in conn.execute(select(node_ports).where(node_ports.c.node_id == node_id))
    }
    newest: dict[_Key, dict[str, Any]] = {}
    derived: list[dict[str, Any]] = []

    def recent_flaps(device: str, port: int, since: datetime) -> int:
        mine = [
            e["details"]["increase"]
            for e in derived
            if e["kind"] == "port_flap"
            and (e["details"]["device"], e["details"]["port"]) == (device, port)
            and e["ts"] >= since
        ]
        return int(sum(mine)) + _stored_flaps(conn, node_id, device, port, since)

    for reading in sorted(readings, key=lambda r: r["ts"]):
        key = (reading["device"], reading["port"])
        before = newest.get(key) or stored.get(key)
        if before is not None and reading["ts"] <= before["ts"]:
            continue
        row = _row(reading, before, node_id=node_id, boot_id=boot_id)
        change = derive_port_events(before, row, thresholds=t, recent_flaps=recent_flaps)
        row["health"] = change.health
        derived.extend(change.events)
        newest[key] = row
    for key, row in newest.items():
        if key in stored:
            conn.execute(
                update(node_ports)
                .where(
                    and_(
                        node_ports.c.node_id == node_id,
                        node_ports.c.device == key[0],
                        node_ports.c.port == key[1],
                    )
                )
                .values(row)
            )
        else:
            conn.execute(insert(node_ports).values(row))
    if derived:
        received = now or max(e["ts"] for e in derived)
        conn.execute(
            insert(events),
            [
                {
                    "node_id": node_id,
                    "kind": e["kind"],
                    "ts": e["ts"],
                    "received_at": received,
                    "message": e["message"],
                    "details": e["details"],
                    "batch_id": batch_id,
                }
                for e in derived
            ],
        )
    return PortsStored(len(newest), derived)


def _stored_flaps(conn: Connection, node_id: int, device: str, port: int, since: datetime) -> int:
    """link_downed increases of the port's stored port_flap events since ``since`` (read only
    when the port flapped: rare)."""
    rows = conn.execute(
        select(events.c.details).where(
            events.c.node_id == node_id,
            events.c.kind == "port_flap",
            events.c.ts >= since,
        )
    )
    total = 0
    for (details,) in rows:
        if details and (details.get("device"), details.get("port")) == (device, port):
            increase = details.get("increase")
            total += increase if isinstance(increase, int) else 0
    return total


def _row(
    reading: dict[str, Any], before: dict[str, Any] | None, *, node_id: int, boot_id: str | None
) -> dict[str, Any]:
    row = {name: reading.get(name) for name in _STATE}
    row.update(node_id=node_id, device=reading["device"], port=reading["port"], ts=reading["ts"])
    row["boot_id"] = boot_id
    row["rates"], row["rates_since"] = None, None
    if before is not None:
        rates = {
            kind: _rates(before, row, kind)
            for kind in COUNTER_KINDS
            if before.get(kind) and row.get(kind)
        }
        if any(rates.values()):
            row["rates"], row["rates_since"] = rates, before["ts"]
    return row


def _rates(before: dict[str, Any], after: dict[str, Any], kind: str) -> dict[str, Any]:
    """Per-second rate of each counter both readings have (a counter one lacks has none)."""
    out = {}
    for name, value in after[kind].items():
        previous = before[kind].get(name)
        if previous is None:
            continue
        pair = [
            CounterReading(before["ts"], before["boot_id"], previous),
            CounterReading(after["ts"], after["boot_id"], value),
        ]
        for point in counter_rates(pair):
            out[name] = {k: point[k] for k in ("per_s", "increase", "reset")}
    return out


def list_ports(conn: Connection, *, node_id: int) -> list[dict[str, Any]]:
    """The node's ports as the API's ``PortPublic`` validates them: health flattened."""
    rows = conn.execute(
        select(node_ports)
        .where(node_ports.c.node_id == node_id)
        .order_by(node_ports.c.device, node_ports.c.port)
    )
    out = []
    for row in rows:
        values = row._asdict()
        health = values.pop("health", None) or {}
        for name in ("normal_rate_gbps", "normal_width", "degraded"):
            values[name] = health.get(name)
        out.append(values)
    return out


# What slows a link without breaking it, or broke it for a while: a straggler's explanation.
_SLOW_KINDS = ("port_down", "port_degraded", "port_flap", "port_errors")
_EVIDENCE_LOOKBACK = timedelta(hours=1)  # events this long before a straggler's onset count
_EVIDENCE_EVENTS = 10  # the newest events per port quoted
_EVENT_FIELDS = (
    "severity",
    "rate_gbps",
    "normal_rate_gbps",
    "link_width",
    "normal_width",
    "counter",
    "increase",
    "limit",
    "state",
)


def port_evidence(
    conn: Connection, node: str, onset: datetime, until: datetime
) -> dict[str, Any] | None:
    """The node's ports that explain a slow node: those now down (after having been up) or
    below their normal rate or width, and those with a port event (down, degraded, flap,
    errors) from an hour before ``onset`` to ``until``. None when no port of the node does."""
    node_id = conn.execute(select(nodes.c.id).where(nodes.c.name == node)).scalar()
    if node_id is None:
        return None
    found: dict[tuple[Any, Any], dict[str, Any]] = {}

    def entry(device: Any, port: Any, netdev: Any, link_layer: Any) -> dict[str, Any]:
        return found.setdefault(
            (device, port),
            {"device": device, "port": port, "netdev": netdev, "link_layer": link_layer},
        )

    for row in conn.execute(select(node_ports).where(node_ports.c.node_id == node_id)):
        health = row.health or {}
        was_up = health.get("normal_rate_gbps") is not None
        down = was_up and link_up(row._asdict()) is False
        if down or health.get("degraded"):
            entry(row.device, row.port, row.netdev, row.link_layer)["now"] = {
                "state": row.state,
                "phys_state": row.phys_state,
                "rate_gbps": row.rate_gbps,
                "normal_rate_gbps": health.get("normal_rate_gbps"),
                "link_width": row.link_width,
                "normal_width": health.get("normal_width"),
            }
    rows = conn.execute(
        select(events.c.kind, events.c.ts, events.c.details)
        .where(
            events.c.node_id == node_id,
            events.c.kind.in_(_SLOW_KINDS),
            events.c.ts >= onset - _EVIDENCE_LOOKBACK,
            events.c.ts <= until,
        )
        .order_by(events.c.ts)
    )
    for kind, ts, details in rows:
        d = details or {}
        item = entry(d.get("device"), d.get("port"), d.get("netdev"), d.get("link_layer"))
        quoted = {"kind": kind, "ts": ts.isoformat()}
        quoted.update({k: d[k] for k in _EVENT_FIELDS if d.get(k) is not None})
        item.setdefault("events", []).append(quoted)
    for item in found.values():
        if "events" in item:
            item["events"] = item["events"][-_EVIDENCE_EVENTS:]
    if not found:
        return None
    return {"ports": [found[key] for key in sorted(found, key=str)]}
