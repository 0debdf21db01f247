"""Port events: what changed between a network port's stored reading and its new one.

The server keeps only the newest reading of each port (``node_ports``), so the history the port
rules need (:mod:`fleetwatch.rules.port_health`) is kept as events, derived here on ingest from
each transition and stored in ``events`` with the GPU and kernel-log events:

=================  =====================================================  ===========
kind               when                                                   severity
=================  =====================================================  ===========
``port_down``      a port that was up (logical ACTIVE, physical LinkUp)   critical
                   is no longer
``port_up``        a port that was down is up at its normal rate          info
``port_degraded``  a port is up below its normal rate or width (from      warning
                   down, or while up)
``port_restored``  a degraded port is back at its normal rate and width   info
``port_flap``      ``link_downed`` rose (not across a reset); critical    warning or
                   once the increases within ``port_flap_window_s``       critical
                   reach ``port_flap_limit``
``port_errors``    an error counter rose by its limit within the current  warning
                   ``port_error_window_s`` (once per counter and window)
=================  =====================================================  ===========

A port's **normal** rate and width are the highest it has shown while up, remembered with it
(``node_ports.health``, with the error window's start and base counters), so an HDR port at
200 Gb/s is normal and an NDR port that came back at 200 is degraded. The IB spec's port states:
logical 4 is ACTIVE, physical 5 is LinkUp (IBTA Vol. 1, PortInfo PortState/PortPhysicalState).
A state the reading does not carry is unknown, never down.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from fleetwatch.rules.thresholds import HealthThresholds

__all__ = ["PORT_KINDS", "PortChange", "derive_port_events", "link_up"]

PORT_KINDS = frozenset(
    {"port_down", "port_up", "port_degraded", "port_restored", "port_flap", "port_errors"}
)
_ACTIVE, _LINK_UP = 4, 5  # IBTA PortInfo: PortState ACTIVE, PortPhysicalState LinkUp
_COUNTER_KINDS = ("counters", "hw_counters")

# Recent flaps of one port: (device, port, since) -> the sum of link_downed increases of its
# port_flap events since then (the caller reads them from the events table).
RecentFlaps = Callable[[str, int, datetime], int]


@dataclass(frozen=True)
class PortChange:
    """The events one reading makes, and what the port remembers after it."""

    events: list[dict[str, Any]]
    health: dict[str, Any]


def link_up(reading: Mapping[str, Any]) -> bool | None:
    """Whether the port's link is up: logically ACTIVE and physically LinkUp; None when the
    reading carries neither state."""
    logical = _is(reading, "state", "state_code", "ACTIVE", _ACTIVE)
    physical = _is(reading, "phys_state", "phys_state_code", "LinkUp", _LINK_UP)
    if logical is None and physical is None:
        return None
    return logical is not False and physical is not False


def _is(reading: Mapping[str, Any], name: str, code: str, want: str, want_code: int) -> bool | None:
    if reading.get(code) is not None:
        return bool(reading[code] == want_code)
    if reading.get(name) is not None:
        return str(reading[name]).upper() == want.upper()
    return None


def derive_port_events(
    before: Mapping[str, Any] | None,
    after: Mapping[str, Any],
    *,
    thresholds: HealthThresholds,
    recent_flaps: RecentFlaps,
) -> PortChange:
    """The events between the stored row ``before`` (None: a port seen for the first time) and
    the new row ``after`` (a ``node_ports`` row with its ``rates`` since ``before``)."""
    memory = dict((before or {}).get("health") or {})
    ts: datetime = after["ts"]
    out: list[dict[str, Any]] = []
    was_up = link_up(before) if before is not None else None
    is_up = link_up(after)
    was_degraded = bool(memory.get("degraded")) and was_up is True
    degraded = _degraded(after, memory) if is_up else {}

    def event(kind: str, severity: str, message: str, **details: Any) -> None:
        out.append(
            {
                "kind": kind,
                "ts": ts,
                "message": message,
                "details": {**_identity(after), "severity": severity, **details},
            }
        )

    where = _where(after)
    if was_up is True and is_up is False:
        event(
            "port_down",
            "critical",
            f"{where} link down: {after.get('state')} / {after.get('phys_state')}",
            state=after.get("state"),
            phys_state=after.get("phys_state"),
            was_state=before.get("state") if before else None,
            was_rate_gbps=before.get("rate_gbps") if before else None,
        )
    if is_up and degraded and (was_up is False or not was_degraded):
        event(
            "port_degraded",
            "warning",
            f"{where} up below its normal rate or width",
            was_up=was_up,
            **degraded,
        )
    elif is_up and not degraded and was_up is False:
        event("port_up", "info", f"{where} link up", rate_gbps=after.get("rate_gbps"))
    elif is_up and not degraded and was_degraded:
        event("port_restored", "info", f"{where} back at its normal rate", **_link(after))

    flaps = _increase(after, "counters", "link_downed")
    if flaps:
        window = timedelta(seconds=thresholds.port_flap_window_s)
        recent = recent_flaps(after["device"], after["port"], ts - window) + flaps
        flapping = recent >= thresholds.port_flap_limit
        event(
            "port_flap",
            "critical" if flapping else "warning",
            f"{where} link_downed +{flaps} ({recent} within {window})",
            link_downed=(after.get("counters") or {}).get("link_downed"),
            increase=flaps,
            in_window=recent,
            limit=thresholds.port_flap_limit,
            window_s=thresholds.port_flap_window_s,
        )

    out.extend(_error_events(after, memory, thresholds, _identity(after), where))
    if is_up:
        memory["degraded"] = bool(degraded)
        for key, field_name in (("normal_rate_gbps", "rate_gbps"), ("normal_width", "link_width")):
            value = after.get(field_name)
            if value is not None and (memory.get(key) is None or value > memory[key]):
                memory[key] = value
    return PortChange(out, memory)


def _degraded(after: Mapping[str, Any], memory: Mapping[str, Any]) -> dict[str, Any]:
    """Rate and width against the port's normal, when either is below it (else empty)."""
    rate, normal_rate = after.get("rate_gbps"), memory.get("normal_rate_gbps")
    width, normal_width = after.get("link_width"), memory.get("normal_width")
    slow = rate is not None and normal_rate is not None and rate < normal_rate
    narrow = width is not None and normal_width is not None and width < normal_width
    if not (slow or narrow):
        return {}
    return {
        **_link(after),
        "normal_rate_gbps": normal_rate,
        "normal_width": normal_width,
        "rate_fraction": round(rate / normal_rate, 4) if slow and rate is not None else None,
    }


def _error_events(
    after: Mapping[str, Any],
    memory: dict[str, Any],
    t: HealthThresholds,
    identity: Mapping[str, Any],
    where: str,
) -> list[dict[str, Any]]:
    """``port_errors`` for each limited counter that rose by its limit within the current window.

    Windows are tumbling: a window starts at a port's first reading, after ``port_error_window_s``
    and across a reboot, and its base is the counters then. A burst split across two windows may
    be missed by up to half: the price of keeping no history but the base.
    """
    ts: datetime = after["ts"]
    current = _limited(after, t)
    start = memory.get("errors_from")
    started = datetime.fromisoformat(start) if isinstance(start, str) else None
    window = timedelta(seconds=t.port_error_window_s)
    rebooted = memory.get("errors_boot") != after.get("boot_id")
    if started is None or ts - started >= window or ts < started or rebooted:
        memory.update(
            errors_from=ts.isoformat(),
            errors_boot=after.get("boot_id"),
            errors_base=current,
            errors_reported=[],
        )
        return []
    base: Mapping[str, int] = memory.get("errors_base") or {}
    reported: list[str] = list(memory.get("errors_reported") or [])
    out = []
    for name, value in current.items():
        if name not in base or name in reported:
            continue
        increase = value - base[name] if value >= base[name] else value
        limit = t.port_error_limits[name]
        if increase >= limit:
            reported.append(name)
            out.append(
                {
                    "kind": "port_errors",
                    "ts": ts,
                    "message": f"{where} {name} +{increase} since {start} (limit {limit:g})",
                    "details": {
                        **identity,
                        "severity": "warning",
                        "counter": name,
                        "increase": increase,
                        "limit": limit,
                        "window_s": t.port_error_window_s,
                        "since": start,
                        "per_s": round(increase / max((ts - started).total_seconds(), 1.0), 6),
                    },
                }
            )
    memory["errors_reported"] = reported
    return out


def _limited(after: Mapping[str, Any], t: HealthThresholds) -> dict[str, int]:
    """The port's counters that have an error limit, by name."""
    out: dict[str, int] = {}
    for kind in _COUNTER_KINDS:
        for name, value in (after.get(kind) or {}).items():
            if name in t.port_error_limits and isinstance(value, int):
                out[name] = value
    return out


def _increase(after: Mapping[str, Any], kind: str, name: str) -> int:
    """The counter's increase since the reading before; 0 across a reset (a reboot retrains
    the link: that is not a flap) or without a reading before."""
    rate = ((after.get("rates") or {}).get(kind) or {}).get(name)
    if not rate or rate.get("reset"):
        return 0
    return int(rate.get("increase") or 0)


def _identity(reading: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "device": reading["device"],
        "port": reading["port"],
        "netdev": reading.get("netdev"),
        "link_layer": reading.get("link_layer"),
    }


def _link(reading: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "rate_gbps": reading.get("rate_gbps"),
        "link_width": reading.get("link_width"),
        "link_speed": reading.get("link_speed"),
    }


def _where(reading: Mapping[str, Any]) -> str:
    netdev = reading.get("netdev")
    return f"{reading['device']} port {reading['port']}" + (f" ({netdev})" if netdev else "")
