"""Judge a node's network adapter ports from their events (:mod:`fleetwatch.rules.port_events`).

:func:`judge_port_events` is pure: port events in, :class:`~fleetwatch.rules.host_errors.
HostVerdict` list out (scope node, component ``network``: every GPU of the node talks through
these ports), one verdict per port and rule, time from ``now``.

=================  =======================================================  ===================
rule               when                                                     verdict
=================  =======================================================  ===================
``port_down``      the port's last state event is ``port_down`` (NHC's      critical,
                   check_hw_ib and GPUd's infiniband check fail a node      drain_inspect
                   whose port is not ACTIVE/LinkUp)
``port_flap``      ``link_downed`` rose >= ``port_flap_limit`` times        critical,
                   within ``port_flap_window_s``                            drain_inspect
``port_degraded``  the port's last state event is ``port_degraded``: up     warning,
                   below the rate or width it has shown (NHC check_hw_ib    investigate
                   and GPUd compare the rate with the expected one)
``port_errors``    a counter rose by its limit within an error window,      warning,
                   in the last two windows                                  investigate
``unreadable_``    a port event whose details the rules cannot read         warning,
``port_events``    (stored before ingest checked them): skipped, named      investigate
                   (:mod:`fleetwatch.rules.unreadable`)
=================  =======================================================  ===================

A port that comes back up clears ``port_down`` and ``port_degraded`` (a ``port_up`` or
``port_restored`` after it); a flapping link stays for the lookback, as a reboot does not mend a
cable. Only events of the lookback are read, so a port down for longer is no longer judged: its
node was drained long before.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from fleetwatch.rules.host_errors import HostEventLike, HostVerdict
from fleetwatch.rules.host_evidence import MOST_ERRORS, HostRecord, densest
from fleetwatch.rules.port_events import PORT_KINDS
from fleetwatch.rules.thresholds import HealthThresholds, source_of
from fleetwatch.rules.unreadable import (
    UNREADABLE_PORT,
    Unreadable,
    readable_recent,
    unreadable_verdict,
)

__all__ = ["PORT_KINDS", "is_urgent_port_event", "judge_port_events"]

_STATE_KINDS = frozenset({"port_down", "port_up", "port_degraded", "port_restored"})
_MAX_TIMESTAMPS = 20
_DOWN_SRC = (
    "IBTA Vol. 1 PortInfo (PortState 4 ACTIVE, PortPhysicalState 5 LinkUp); "
    "LBNL NHC check_hw_ib; GPUd infiniband component (port not active -> unhealthy)"
)
_DEGRADED_SRC = "LBNL NHC check_hw_ib (rate below expected fails); GPUd expected port rate"


def is_urgent_port_event(kind: str, details: Mapping[str, Any] | None) -> bool:
    """Whether a port event may take its node out now: a port down, or a flap that reached
    the limit (the ingest marks it critical)."""
    severity = (details or {}).get("severity")
    return kind in ("port_down", "port_flap") and severity in ("critical", "fatal")


def judge_port_events(
    events: Iterable[HostEventLike],
    *,
    now: datetime,
    thresholds: HealthThresholds | None = None,
    lookback: timedelta = timedelta(hours=24),
) -> list[HostVerdict]:
    """Verdicts for the node's port events of the last ``lookback`` (untimed: at ``now``)."""
    t = thresholds or HealthThresholds()
    since = now - lookback
    by_port: dict[str, list[HostRecord]] = defaultdict(list)
    skipped: list[Unreadable] = []
    for e, ts in readable_recent(events, PORT_KINDS, since=since, now=now, skipped=skipped):
        details = e.details or {}
        if "device" not in details:
            continue
        key = f"{details['device']}/{details.get('port')}"
        by_port[key].append(HostRecord(e.kind, ts, None, None, details))
    verdicts: list[HostVerdict] = []
    for key, items in sorted(by_port.items()):
        items.sort(key=lambda r: r.ts)
        verdicts.extend(_state(key, items))
        verdicts.extend(_flaps(key, items, t))
        verdicts.extend(_errors(key, items, t, now))
    if skipped:
        verdicts.append(unreadable_verdict(UNREADABLE_PORT, skipped))
    verdicts.sort(key=lambda v: (v.first_seen, v.rule, str(v.evidence.get("port_key"))))
    return verdicts


def _state(key: str, items: Sequence[HostRecord]) -> list[HostVerdict]:
    states = [r for r in items if r.kind in _STATE_KINDS]
    if not states or states[-1].kind not in ("port_down", "port_degraded"):
        return []
    last = states[-1]
    if last.kind == "port_down":
        return [
            _verdict(
                "port_down",
                [last],
                key,
                severity="critical",
                action="drain_inspect",
                source=_DOWN_SRC,
                evidence={
                    "state": last.details.get("state"),
                    "phys_state": last.details.get("phys_state"),
                    "was_rate_gbps": last.details.get("was_rate_gbps"),
                },
                note="a network port went down: drain the node, check the cable, "
                "transceiver and switch port",
            )
        ]
    return [
        _verdict(
            "port_degraded",
            [last],
            key,
            severity="warning",
            action="investigate",
            source=_DEGRADED_SRC,
            evidence={
                name: last.details.get(name)
                for name in (
                    "rate_gbps",
                    "normal_rate_gbps",
                    "link_width",
                    "normal_width",
                    "link_speed",
                    "rate_fraction",
                )
            },
            note="a network port runs below its normal rate or width: a slow rail holds back "
            "every collective of the job (reseat or replace the cable)",
        )
    ]


def _flaps(key: str, items: Sequence[HostRecord], t: HealthThresholds) -> list[HostVerdict]:
    flaps = [r for r in items if r.kind == "port_flap"]
    burst = densest(
        flaps, timedelta(seconds=t.port_flap_window_s), weight=lambda r: _int(r, "increase")
    )
    # Saturated: a verdict's count is stored and shared as a signed 64-bit integer.
    count = min(sum(_int(r, "increase") for r in burst), MOST_ERRORS)
    if count < t.port_flap_limit:
        return []
    return [
        _verdict(
            "port_flap",
            burst,
            key,
            severity="critical",
            action="drain_inspect",
            source=source_of("port_flap_limit"),
            evidence={
                "link_downed_increase": count,
                "link_downed": burst[-1].details.get("link_downed"),
                "limit": t.port_flap_limit,
                "window_s": t.port_flap_window_s,
            },
            note="the link keeps going down: drain the node, replace the cable or transceiver",
            count=count,
        )
    ]


def _errors(
    key: str, items: Sequence[HostRecord], t: HealthThresholds, now: datetime
) -> list[HostVerdict]:
    recent = now - timedelta(seconds=2 * t.port_error_window_s)
    found = [r for r in items if r.kind == "port_errors" and r.ts >= recent]
    if not found:
        return []
    counters: dict[str, dict[str, Any]] = {}
    for r in found:
        counters[str(r.details.get("counter"))] = {
            name: r.details.get(name) for name in ("increase", "limit", "per_s", "since")
        }
    return [
        _verdict(
            "port_errors",
            found,
            key,
            severity="warning",
            action="investigate",
            source=source_of("port_error_limits"),
            evidence={"counters": counters, "window_s": t.port_error_window_s},
            note="a network port's error counters climb: a marginal cable, transceiver or "
            "congested RoCE fabric (check the switch side too)",
        )
    ]


def _verdict(
    rule: str,
    records: Sequence[HostRecord],
    key: str,
    *,
    severity: Any,
    action: Any,
    source: str,
    evidence: Mapping[str, Any],
    note: str,
    count: int | None = None,
) -> HostVerdict:
    d = records[-1].details
    where = {
        "port_key": key,
        "device": d.get("device"),
        "port": d.get("port"),
        "netdev": d.get("netdev"),
        "link_layer": d.get("link_layer"),
    }
    return HostVerdict(
        rule=rule,
        scope="node",
        component="network",
        action=action,
        severity=severity,
        counts_against_gpu=False,
        source=source,
        count=len(records) if count is None else count,
        first_seen=records[0].ts,
        last_seen=records[-1].ts,
        timestamps=tuple(r.ts for r in records[:_MAX_TIMESTAMPS]),
        evidence={**where, **evidence},
        note=note,
    )


def _int(r: HostRecord, name: str) -> int:
    value = r.details.get(name)
    return value if isinstance(value, int) and value > 0 else 0
