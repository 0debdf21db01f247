"""The two kinds of /metrics page, and which families each carries.

The **default page** carries what only FleetWatch knows and what alerts read, and stays small at
any fleet size (one series per node for a handful of families, one per GPU only where the GPU
has a verdict): the process's own counters (ingest, background jobs, leadership, storage), node
state, the fleet's event counters (host errors by kind and severity among them), port counts by
state and the nodes with a port down or degraded, risk and verdicts, straggler ratios, evictions,
and the fleet's availability figures over the last 7 days. Its parts read from the database per
scrape (ports, stragglers, evictions) are shared for ``metrics_cache_ttl_s``
(:mod:`~fleetwatch.server.metrics.ttl_parts`).

A **shard** (``?shard=i&shards=n``) carries the per-GPU series and the per-node detail of its
nodes (see :mod:`~fleetwatch.server.metrics.shards`): the GPUs' newest telemetry, identity and
failure probabilities, per-GPU Xid counts, node labels and last-seen times, slowness scores,
and each network adapter port's state, rate and error counters (about one port per GPU).
None of the process's own counters: ``n`` shards would count them ``n`` times.

No family is on both (a sum over the default job and the shard job never counts twice), and the
shards of one ``n`` partition the fleet (their union is the whole fleet, each series once).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from fleetwatch.config import ServerSettings
from fleetwatch.server.db.session import Database
from fleetwatch.server.judge.assessment import FleetAssessment
from fleetwatch.server.metrics.availability_exposition import AvailabilityExposition
from fleetwatch.server.metrics.eviction_exposition import render_evictions
from fleetwatch.server.metrics.exposition import FleetExposition
from fleetwatch.server.metrics.port_exposition import render_port_summary, render_ports
from fleetwatch.server.metrics.risk_exposition import render_gpu_risk, render_risk
from fleetwatch.server.metrics.shards import Shard
from fleetwatch.server.metrics.straggler_exposition import render_slowness, render_straggler_ratios

__all__ = ["default_page", "shard_page"]


def default_page(
    *,
    registry: CollectorRegistry,
    fleet: FleetExposition,
    snapshot: FleetAssessment | None,
    db: Database,
    settings: ServerSettings,
    availability: AvailabilityExposition | None = None,
) -> str:
    return "".join(
        [
            generate_latest(registry).decode(),
            fleet.render(),
            fleet.db_parts.get(
                "ports",
                lambda: render_port_summary(
                    db, {node.id: node.name for node in fleet.cache.nodes()}
                ),
            ),
            render_risk(snapshot, settings.risk_horizons_h),
            fleet.db_parts.get("stragglers", lambda: render_straggler_ratios(db)),
            fleet.db_parts.get(
                "evictions", lambda: render_evictions(db, settings.drain_budget_pct)
            ),
            availability.render() if availability is not None else "",
        ]
    )


def shard_page(
    shard: Shard,
    *,
    fleet: FleetExposition,
    snapshot: FleetAssessment | None,
    db: Database,
    settings: ServerSettings,
) -> str:
    members = fleet.cache.nodes(shard)
    names = {node.name for node in members}
    return "".join(
        [
            fleet.render_shard(members, whole_fleet=shard.count == 1),
            render_ports(db, {node.id: node.name for node in members}),
            render_gpu_risk(snapshot, settings.risk_horizons_h, names),
            render_slowness(db, shard),
        ]
    )
