"""Stragglers on /metrics, read from the database per scrape (every process shows the same).

On the default page: ``fleetwatch_node_step_slowdown_ratio{node,job}``, a node's median step
time over its job's median in the job's newest judged window, for jobs judged in the last 10
minutes (what the ``FleetWatchNodeStraggler`` alert reads). On a shard's page:
``fleetwatch_node_slowness_score{node}`` of the shard's nodes, the exponentially weighted ratio
across jobs (for dashboards; one series per node that ever ran a reported job).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fleetwatch.server.db.session import Database
from fleetwatch.server.metrics.shards import Shard
from fleetwatch.server.metrics.text import escape_label, family_header
from fleetwatch.server.repo.jobs import load_slowness, recent_ratios

__all__ = ["RATIOS_FRESH_S", "render_slowness", "render_straggler_ratios"]

RATIOS_FRESH_S = 600.0


def render_straggler_ratios(db: Database, now: datetime | None = None) -> str:
    since = (now or datetime.now(UTC)) - timedelta(seconds=RATIOS_FRESH_S)
    with db.read() as conn:
        ratios = recent_ratios(conn, since=since)
    if not ratios:
        return ""
    header = family_header(
        "fleetwatch_node_step_slowdown_ratio",
        "gauge",
        "A node's median step time over its job's median, newest window.",
    )
    return header + "".join(
        f'fleetwatch_node_step_slowdown_ratio{{node="{escape_label(n)}",job="{escape_label(j)}"}} '
        f"{r:.4f}\n"
        for j, n, r in ratios
    )


def render_slowness(db: Database, shard: Shard) -> str:
    """Nodes are named by the jobs' step reports, which need not be nodes that push telemetry:
    the shard is taken from the name, not from the ``nodes`` table."""
    with db.read() as conn:
        scores = load_slowness(conn)
    mine = sorted((n, s) for n, s in scores.items() if shard.holds(n))
    if not mine:
        return ""
    header = family_header(
        "fleetwatch_node_slowness_score",
        "gauge",
        "Exponentially weighted step-time ratio of the node across jobs "
        "(1 = as fast as its peers).",
    )
    return header + "".join(
        f'fleetwatch_node_slowness_score{{node="{escape_label(n)}"}} {s:.4f}\n' for n, s in mine
    )
