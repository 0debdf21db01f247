"""The fleet's active alert conditions, each under the dedup key that makes it one alert.

====================================  =========================================================
``gpu:<uuid>:<rule>``                 a GPU verdict of severity >= warning counted against it,
                                      or a host verdict about that GPU (its PCIe path)
``node:<name>:<rule>``                a host verdict about the node (NVSwitch, CPU, memory)
``node:<name>:unreachable``           nothing from the node for its unreachable deadline
``node:<name>:straggler``             an open hardware straggler on the node
``node:<name>:repeat_offender``       an open hardware eviction of a node that came within
                                      ``repeat_offender_days`` of its return (``repeat_of``)
``fleet:drain_budget``                an eviction is ``paged``: the drain budget is exhausted
``fleet:silence``                     more than ``unreachable_storm_pct`` of the nodes are
                                      unreachable at once (kind ``fleet_silence``)
``fleet:wear_out:<group>``            a wear-out onset within ``alert_wear_out_hold_s``
``node:<name>:unreadable_*_events``   events of the node the rules skipped, unreadable (kind
``node:<name>:unjudged_evidence``     ``unreadable_evidence``); a rule family that failed on
                                      the node (judge.node_parts): each names what it skipped
====================================  =========================================================

A node is unreachable only after its intervals of silence since this process started listening
too (:mod:`fleetwatch.server.concepts.liveness`). A node in a maintenance window is never
unreachable, and after one only after its intervals since the window's end; inside a window, a
verdict the planned work causes by itself (a GPU lost or missing, a port down) and a straggler
are no alert either, while a hardware fault still is (:mod:`fleetwatch.server.concepts.planned`).

During a fleet-wide silence (:mod:`fleetwatch.server.judge.silence`) no node is an unreachable
condition of its own: the one ``fleet:silence`` condition stands for them all.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, select

from fleetwatch.config import ServerSettings
from fleetwatch.rules.unreadable import UNREADABLE_RULES
from fleetwatch.rules.xid_catalog import SEVERITY_RANK
from fleetwatch.server.concepts.liveness import node_state
from fleetwatch.server.concepts.planned import Planned, caused_by_maintenance
from fleetwatch.server.db.tables import events, evictions, gpus, nodes, stragglers
from fleetwatch.server.judge.assessment import FleetAssessment
from fleetwatch.server.judge.node_parts import UNJUDGED
from fleetwatch.server.judge.silence import FleetSilence, NodeClock, fleet_silence, node_clocks
from fleetwatch.server.repo.evictions import OPEN_STATES

__all__ = ["UNREADABLE_KIND", "Condition", "derive_conditions", "gpu_conditions", "node_clusters"]

# Evidence a node sent that went unjudged: its own alert kind, for whoever fixes the sender (a
# subscription can take or leave it), not the hardware kinds on-call acts on.
UNREADABLE_KIND = "unreadable_evidence"
_UNREADABLE = UNREADABLE_RULES | {UNJUDGED}


@dataclass(frozen=True)
class Condition:
    dedup_key: str
    kind: str
    severity: str
    summary: str
    action: str | None
    evidence: dict[str, Any]
    node: str | None = None
    gpu_uuid: str | None = None
    serial: str | None = None
    slot: str | None = None
    cluster: str | None = None


# The one label the conditions need, read as text: not every node's labels parsed from JSON.
_CLUSTER = nodes.c.labels["cluster"].as_string().label("cluster")


def node_clusters(conn: Connection, names: Collection[str] | None = None) -> dict[str, str | None]:
    """The ``cluster`` label of each node of ``names``, or of every node (None: it has none)."""
    query = select(nodes.c.name, _CLUSTER)
    if names is not None:
        query = query.where(nodes.c.name.in_(list(names)))
    return {row.name: row.cluster for row in conn.execute(query)}


def derive_conditions(
    conn: Connection,
    assessment: FleetAssessment | None,
    *,
    now: datetime,
    settings: ServerSettings,
    heard_since: datetime | None = None,
    planned: Planned | None = None,
    silence: FleetSilence | None = None,
    clocks: Sequence[NodeClock] | None = None,
) -> dict[str, Condition]:
    """Every condition active at ``now``, by dedup key (a node is unreachable only after its
    intervals of silence since ``heard_since`` too: see :mod:`fleetwatch.server.concepts.liveness`;
    ``silence``: the fleet's at ``now``, and ``clocks``: every node's, read here when not
    given)."""
    found: dict[str, Condition] = {}
    planned = planned or Planned()
    factor = settings.unreachable_after_intervals
    if silence is None:
        silence = fleet_silence(conn, settings, now=now, heard_since=heard_since, planned=planned)
    node_rows = node_clocks(conn) if clocks is None else clocks
    clusters = node_clusters(conn)
    found.update(gpu_conditions(conn, assessment, planned, clusters))
    if silence.storm:
        found["fleet:silence"] = _fleet_silence(silence)
    for clock in node_rows:
        if planned.covers(clock.name) or silence.storm:
            continue
        heard = planned.listen_from(clock.name, heard_since)
        state = node_state(clock.last_seen, clock.interval_s, factor, now, heard, silence.lag_s)
        if state == "unreachable":
            silent = (now - clock.last_seen).total_seconds()
            key = f"node:{clock.name}:unreachable"
            found[key] = Condition(
                key,
                "unreachable",
                "critical",
                f"node {clock.name} unreachable: nothing received for {silent:.0f} s",
                "investigate",
                {
                    "rule": "node_unreachable",
                    "last_seen": _iso(clock.last_seen),
                    "interval_s": clock.interval_s,
                    "silent_s": round(silent, 1),
                },
                clock.name,
                cluster=clusters.get(clock.name),
            )
    open_stragglers = conn.execute(
        select(stragglers).where(stragglers.c.ended_at.is_(None), stragglers.c.kind == "hardware")
    )
    for row in open_stragglers:
        key = f"node:{row.node}:straggler"
        if key in found or planned.covers(row.node):  # slow during planned work: no news
            continue
        found[key] = Condition(
            key,
            "straggler",
            "warning",
            f"node {row.node} is a hardware straggler in job {row.job_id}: steps "
            f"{row.ratio:.2f}x the job median",
            "drain_inspect",
            {
                "rule": "straggler",
                "job_id": row.job_id,
                "ratio": row.ratio,
                "windows": row.windows,
                "since": _iso(row.started_at),
                **(row.evidence or {}),
            },
            row.node,
            cluster=clusters.get(row.node),
        )
    found.update(_repeat_offenders(conn, clusters, settings))
    paged = list(
        conn.execute(select(evictions.c.node).where(evictions.c.state == "paged")).scalars()
    )
    if paged:
        latest = conn.execute(
            select(events.c.message, events.c.details)
            .where(events.c.kind == "drain_budget_exhausted", events.c.node_id.is_(None))
            .order_by(events.c.ts.desc())
            .limit(1)
        ).first()
        found["fleet:drain_budget"] = Condition(
            "fleet:drain_budget",
            "drain_budget",
            "critical",
            latest.message
            if latest and latest.message
            else f"fleet drain budget exhausted: {len(paged)} evictions wait for a person",
            "investigate",
            {
                "rule": "drain_budget_exhausted",
                "paged_nodes": sorted(paged)[:100],
                **((latest.details or {}) if latest else {}),
            },
        )
    onsets = conn.execute(
        select(events.c.ts, events.c.message, events.c.details)
        .where(
            events.c.kind == "wear_out_onset",
            events.c.node_id.is_(None),
            events.c.ts >= now - timedelta(seconds=settings.alert_wear_out_hold_s),
        )
        .order_by(events.c.ts)
    )
    for onset in onsets:
        group = str((onset.details or {}).get("group", "fleet"))
        key = f"fleet:wear_out:{group}"
        found[key] = Condition(
            key,
            "wear_out",
            "warning",
            onset.message or f"wear-out onset in {group}",
            "investigate",
            {"rule": "wear_out_onset", "at": _iso(onset.ts), **(onset.details or {})},
        )
    return found


def gpu_conditions(
    conn: Connection,
    assessment: FleetAssessment | None,
    planned: Planned,
    clusters: Mapping[str, str | None],
    only: Collection[str] | None = None,
) -> dict[str, Condition]:
    """The conditions of the GPU verdicts (and host verdicts about a GPU or its node) in
    ``assessment``, of the nodes ``only`` when given (the urgent lane's), by dedup key."""
    found: dict[str, Condition] = {}
    if assessment is None:
        return found
    wanted = None if only is None else frozenset(only)
    alerting = [
        (gpu, v)
        for gpu in assessment.gpus
        if wanted is None or gpu.node in wanted
        for v in gpu.verdicts
        if (v.counts_against_gpu or v.kind == "host")
        and SEVERITY_RANK[v.severity] >= SEVERITY_RANK["warning"]
        and not (planned.covers(gpu.node) and caused_by_maintenance(v))
    ]
    slots = _slots(conn, sorted({gpu.uuid for gpu, _ in alerting}))
    for gpu, v in alerting:
        key = f"gpu:{gpu.uuid}:{v.rule}"
        if v.evidence.get("scope") == "node":
            # Given to each GPU of the node (judging), it is one fault: one alert.
            key = f"node:{gpu.node}:{v.rule}"
            if key in found:
                continue
        what = v.note or (f"Xid {', '.join(map(str, v.xids))}" if v.xids else v.rule)
        found[key] = Condition(
            key,
            UNREADABLE_KIND if v.rule in _UNREADABLE else v.kind,
            v.severity,
            f"{v.rule} on {gpu.node} GPU {gpu.index} (serial {gpu.serial or '?'}): {what}",
            v.action,
            {
                "rule": v.rule,
                "gpu_index": gpu.index,
                "sku": gpu.sku,
                "xids": list(v.xids),
                "source": v.source,
                "first_seen": _iso(v.first_seen),
                "last_seen": _iso(v.last_seen),
                "takes_gpu_out": v.takes_gpu_out,
                **dict(v.evidence),
            },
            gpu.node,
            gpu.uuid,
            gpu.serial,
            slots.get(gpu.uuid),
            clusters.get(gpu.node),
        )
    return found


def _fleet_silence(silence: FleetSilence) -> Condition:
    share = silence.share_pct
    return Condition(
        "fleet:silence",
        "fleet_silence",
        "critical",
        f"fleet-wide silence: {len(silence.silent)} of {silence.counted} nodes ({share:.1f} %) "
        f"unreachable at once, over {silence.threshold_pct:g} %: check the server's ingest, the "
        "network, or the agents' path to the server; no unreachable evictions meanwhile",
        "investigate",
        {
            "rule": "fleet_silence",
            "unreachable_nodes": len(silence.silent),
            "counted_nodes": silence.counted,
            "share_pct": round(share, 2),
            "threshold_pct": silence.threshold_pct,
            "sample_nodes": sorted(silence.silent)[:20],
        },
    )


def _repeat_offenders(
    conn: Connection, clusters: dict[str, str | None], settings: ServerSettings
) -> dict[str, Condition]:
    """Open evictions marked ``repeat_of``: the node failed again soon after a return."""
    previous = evictions.alias("previous")
    rows = conn.execute(
        select(
            evictions.c.id,
            evictions.c.node,
            evictions.c.reason,
            evictions.c.created_at,
            evictions.c.repeat_of,
            previous.c.returned_at,
            previous.c.reason.label("previous_reason"),
        )
        .join(previous, previous.c.id == evictions.c.repeat_of)
        .where(evictions.c.state.in_(OPEN_STATES))
        .order_by(evictions.c.id)
    )
    found = {}
    for row in rows:
        key = f"node:{row.node}:repeat_offender"
        back_for = (row.created_at - row.returned_at).total_seconds() / 86400.0
        found[key] = Condition(
            key,
            "repeat_offender",
            "warning",
            f"node {row.node} is a repeat offender: evicted again {back_for:.1f} days after its "
            f"return (within {settings.repeat_offender_days:g}): {row.reason}",
            "drain_inspect",
            {
                "rule": "repeat_offender",
                "eviction_id": row.id,
                "repeat_of": row.repeat_of,
                "returned_at": _iso(row.returned_at),
                "evicted_again_at": _iso(row.created_at),
                "days_in_service": round(back_for, 2),
                "previous_reason": row.previous_reason,
            },
            row.node,
            cluster=clusters.get(row.node),
        )
    return found


def _slots(conn: Connection, uuids: list[str]) -> dict[str, str | None]:
    """The PCI bus id of each GPU in ``uuids`` (only GPUs with an alert: not the whole fleet)."""
    out: dict[str, str | None] = {}
    for i in range(0, len(uuids), 500):
        chunk = uuids[i : i + 500]
        query = select(gpus.c.uuid, gpus.c.pci_bus_id).where(gpus.c.uuid.in_(chunk))
        out.update({row.uuid: row.pci_bus_id for row in conn.execute(query)})
    return out


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None
