"""The fleet's part of /metrics: node state and event counts, and a shard's per-GPU series.

Two pages, disjoint, so that no sum in PromQL counts a series twice:

- the default page, small at any fleet size: ``fleetwatch_node_up{node}`` and
  ``fleetwatch_nodes{state}``; the fleet's event counters ``fleetwatch_fleet_xid_events_total{xid}``
  and ``fleetwatch_fleet_events_total{kind}``; host errors (kernel-log kinds sxid, pcie_aer, mce,
  edac) by severity, ``fleetwatch_fleet_host_events_total{kind,severity}``, every severity the wire
  names for each kind exported even at 0 (so ``increase()`` sees the first one);
- a shard's page (:mod:`~fleetwatch.server.metrics.shards`), for the shard's nodes only:
  the per-GPU families of :mod:`~fleetwatch.server.metrics.gpu_exposition`,
  ``fleetwatch_node_info``, ``fleetwatch_node_last_seen_timestamp_seconds``,
  ``fleetwatch_xid_events_total{node,gpu,uuid,xid}``, ``fleetwatch_events_total{node,kind}`` and
  ``fleetwatch_host_events_total{node,kind,severity}`` (nodes that had one).

A host event that carried no severity is counted without the ``severity`` label.

Node liveness follows this process's :class:`~fleetwatch.server.concepts.liveness.Liveness`, as the
alerter and the planner do. An *unheard* node (silent since before the server started, still in
its grace) has no ``fleetwatch_node_up`` sample: neither 1 nor 0 is known, and a 0 would start
the ``FleetWatchNodeUnreachable`` rule's clock on every restart. ``fleetwatch_nodes`` counts it
under ``state="unheard"``. A node in a maintenance window has no ``fleetwatch_node_up`` sample
either (its silence is planned: no rule must fire on it); ``fleetwatch_nodes{state="maintenance"}``
is the gauge of nodes in maintenance.

Fleet-wide silence (:mod:`fleetwatch.server.judge.silence`): ``fleetwatch_fleet_silent_nodes`` is
the nodes unreachable among those that count (not in maintenance, heard within a day),
``fleetwatch_fleet_silence`` is 1 while they are more than ``unreachable_storm_pct`` of those
(no unreachable evictions meanwhile), else 0. ``fleetwatch_fleet_ingest_lag_seconds`` is how late
the fleet's pushes are stored (:mod:`fleetwatch.server.concepts.ingest_lag`): every node's deadline
moves out by it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta

from fleetwatch.server.concepts.ingest_lag import fleet_lag_s
from fleetwatch.server.concepts.liveness import Liveness, NodeReading
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.judge.silence import RECENT, is_storm
from fleetwatch.server.metrics.fleet_cache import CachedNode, FleetCache
from fleetwatch.server.metrics.gpu_exposition import load_gpu_rows, render_gpu_families
from fleetwatch.server.metrics.text import escape_label, family_header
from fleetwatch.server.metrics.ttl_parts import TtlParts

__all__ = ["HOST_SEVERITIES", "FleetExposition"]

# The severities each kernel-log kind's events carry (``Event.details.severity``, telemetry.py).
HOST_SEVERITIES: dict[str, tuple[str, ...]] = {
    "edac": ("corrected", "uncorrected"),
    "mce": ("corrected", "deferred", "fatal", "uncorrected"),
    "pcie_aer": ("corrected", "fatal", "non_fatal"),
    "sxid": ("correctable", "fatal", "non_fatal"),
}


class FleetExposition:
    """Renders the fleet's default page and its shards from a :class:`FleetCache`."""

    def __init__(
        self,
        db: Database,
        *,
        ttl_s: float,
        liveness: Liveness,
        clock: Callable[[], datetime] = utcnow,
        storm_pct: float = 0.0,
        storm_min_nodes: int = 2,
    ) -> None:
        self._db = db
        self._liveness = liveness
        self._storm_pct = storm_pct
        self._storm_min_nodes = storm_min_nodes
        self.cache = FleetCache(db, ttl_s=ttl_s, clock=clock)
        # The default page's other database reads, as stale as the cache at most.
        self.db_parts = TtlParts(ttl_s)

    # -- the default page -------------------------------------------------------------------

    def render(self) -> str:
        """The default page's fleet families."""
        return self._node_state_text() + self._fleet_event_text()

    def _node_state_text(self) -> str:
        now = self._liveness.clock()
        planned = self.cache.planned(now)
        up: list[str] = []
        states: dict[NodeReading, int] = {"up": 0, "unheard": 0, "unreachable": 0, "maintenance": 0}
        counted = silent = 0  # for the fleet-wide silence, as server.judge.silence counts
        # Up by its own last report (the first test Liveness.state makes), unless a window covers
        # it: the same answer without a call per node, for nearly every node of a live fleet.
        factor = self._liveness.factor
        cached = self.cache.nodes()
        # Measured whatever the setting: a server behind on ingest is news of its own.
        behind = fleet_lag_s(((n.last_seen, n.lag_s) for n in cached), now, max_s=math.inf)
        lag = min(behind, self._liveness.lag_max_s)
        up_since: dict[float, datetime] = {}
        for node in cached:
            cutoff = up_since.get(node.interval_s)
            if cutoff is None:
                cutoff = up_since[node.interval_s] = now - timedelta(
                    seconds=node.interval_s * factor + lag
                )
            if node.last_seen >= cutoff and not planned.covers(node.name):
                state: NodeReading = "up"
            else:
                state = self._liveness.state(
                    node.last_seen, node.interval_s, now, planned=planned, node=node.name, lag_s=lag
                )
            states[state] += 1
            if state != "maintenance" and node.last_seen >= now - RECENT:
                counted += 1
                silent += state == "unreachable"
            if state in ("up", "unreachable"):
                value = 1 if state == "up" else 0
                up.append(f'fleetwatch_node_up{{node="{escape_label(node.name)}"}} {value}\n')
        storm = is_storm(silent, counted, self._storm_pct, self._storm_min_nodes)
        return "".join(
            [
                family_header(
                    "fleetwatch_node_up",
                    "gauge",
                    "1 if the node reported within 3 of its intervals, 0 if not "
                    "(absent while not heard since the server started).",
                ),
                *up,
                family_header(
                    "fleetwatch_nodes",
                    "gauge",
                    "Nodes by liveness state (up, unheard, unreachable, maintenance: covered by "
                    "a maintenance window).",
                ),
                *(f'fleetwatch_nodes{{state="{s}"}} {n}\n' for s, n in sorted(states.items())),
                family_header(
                    "fleetwatch_fleet_silent_nodes",
                    "gauge",
                    "Nodes unreachable now, of those not in maintenance and heard within a day.",
                ),
                f"fleetwatch_fleet_silent_nodes {silent}\n",
                family_header(
                    "fleetwatch_fleet_silence",
                    "gauge",
                    "1 while a fleet-wide silence holds (more than unreachable_storm_pct of the "
                    "nodes unreachable at once: no unreachable evictions), else 0.",
                ),
                f"fleetwatch_fleet_silence {int(storm)}\n",
                family_header(
                    "fleetwatch_fleet_ingest_lag_seconds",
                    "gauge",
                    "How late the fleet's pushes are stored: the median, over the nodes heard in "
                    "the last 10 minutes, of the seconds from a push's newest reading to its "
                    "storing (0 when none is late). Unreachable deadlines move out by it, up to "
                    "unreachable_lag_grace_max_s.",
                ),
                f"fleetwatch_fleet_ingest_lag_seconds {behind:.3f}\n",
            ]
        )

    def _fleet_event_text(self) -> str:
        counts = self.cache.event_counts()
        by_code: Counter[int] = Counter()
        for (_node, _uuid, xid), n in counts.xids.items():
            by_code[xid] += n
        by_kind: Counter[str] = Counter()
        for (_node, kind), n in counts.kinds.items():
            by_kind[kind] += n
        host: Counter[tuple[str, str | None]] = Counter(
            {(k, s): 0 for k, severities in HOST_SEVERITIES.items() for s in severities}
        )
        for (_node, kind, severity), n in counts.host.items():
            host[(kind, severity)] += n
        return "".join(
            [
                family_header(
                    "fleetwatch_fleet_xid_events_total",
                    "counter",
                    "Xid errors reported by the whole fleet, by code.",
                ),
                *(
                    f'fleetwatch_fleet_xid_events_total{{xid="{x}"}} {n}\n'
                    for x, n in sorted(by_code.items())
                ),
                family_header(
                    "fleetwatch_fleet_events_total",
                    "counter",
                    "Events reported by the whole fleet, by kind.",
                ),
                *(
                    f'fleetwatch_fleet_events_total{{kind="{escape_label(k)}"}} {n}\n'
                    for k, n in sorted(by_kind.items())
                ),
                family_header(
                    "fleetwatch_fleet_host_events_total",
                    "counter",
                    "Host errors from the kernel log (sxid, pcie_aer, mce, edac) reported by the "
                    "whole fleet, by kind and severity.",
                ),
                *(
                    f"fleetwatch_fleet_host_events_total{{{_host_labels(k, s)}}} {n}\n"
                    for (k, s), n in sorted(host.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))
                ),
            ]
        )

    # -- a shard ----------------------------------------------------------------------------

    def render_shard(self, members: list[CachedNode], *, whole_fleet: bool) -> str:
        """The fleet families of a shard's nodes (``members``, from :attr:`cache`): their GPUs,
        identity and event counts. ``whole_fleet``: ``members`` is every node (one shard)."""
        names = {node.id: node.name for node in members}
        rows = load_gpu_rows(self._db, None if whole_fleet else list(names))
        gpu_index = {row.uuid: row.slot for row in rows if row.node_id in names}
        return "".join(
            [
                render_gpu_families(rows, names),
                self._node_identity_text(members),
                self._shard_event_text(names, gpu_index),
            ]
        )

    def _node_identity_text(self, members: list[CachedNode]) -> str:
        labels = self.cache.labels([node.id for node in members])
        seen, info = [], []
        for node in members:
            name = escape_label(node.name)
            seen.append(
                f'fleetwatch_node_last_seen_timestamp_seconds{{node="{name}"}} '
                f"{node.last_seen.timestamp()}\n"
            )
            extra = "".join(
                f',{k}="{escape_label(v)}"'
                for k, v in sorted(labels.get(node.id, {}).items())
                if k != "node"
            )
            info.append(f'fleetwatch_node_info{{node="{name}"{extra}}} 1\n')
        if not members:
            return ""
        return "".join(
            [
                family_header(
                    "fleetwatch_node_last_seen_timestamp_seconds",
                    "gauge",
                    "Unix time of the last batch.",
                ),
                *seen,
                family_header("fleetwatch_node_info", "gauge", "Node labels; always 1."),
                *info,
            ]
        )

    def _shard_event_text(self, names: dict[int, str], gpu_index: dict[str, int]) -> str:
        counts = self.cache.event_counts()
        mine_xids = sorted(
            (names[node_id], uuid, xid, n)
            for (node_id, uuid, xid), n in counts.xids.items()
            if node_id in names
        )
        xids = [
            f'fleetwatch_xid_events_total{{node="{escape_label(node)}",'
            f'gpu="{gpu_index.get(uuid, "")}",uuid="{escape_label(uuid)}",xid="{xid}"}} {n}\n'
            for node, uuid, xid, n in mine_xids
        ]
        mine_kinds = sorted(
            (names[node_id], kind, n)
            for (node_id, kind), n in counts.kinds.items()
            if node_id in names
        )
        kinds = [
            f'fleetwatch_events_total{{node="{escape_label(node)}",kind="{escape_label(kind)}"}} '
            f"{n}\n"
            for node, kind, n in mine_kinds
        ]
        mine_host = sorted(
            ((names[node_id], kind, severity or ""), n)
            for (node_id, kind, severity), n in counts.host.items()
            if node_id in names
        )
        host = [
            f'fleetwatch_host_events_total{{node="{escape_label(node)}",'
            f"{_host_labels(kind, severity or None)}}} {n}\n"
            for (node, kind, severity), n in mine_host
        ]
        out = []
        if xids:
            out += [
                family_header(
                    "fleetwatch_xid_events_total", "counter", "Xid errors reported, by code."
                ),
                *xids,
            ]
        if kinds:
            out += [
                family_header("fleetwatch_events_total", "counter", "Events reported, by kind."),
                *kinds,
            ]
        if host:
            out += [
                family_header(
                    "fleetwatch_host_events_total",
                    "counter",
                    "Host errors from the kernel log (sxid, pcie_aer, mce, edac), by kind and "
                    "severity.",
                ),
                *host,
            ]
        return "".join(out)


def _host_labels(kind: str, severity: str | None) -> str:
    if severity is None:
        return f'kind="{escape_label(kind)}"'
    return f'kind="{escape_label(kind)}",severity="{escape_label(severity)}"'
