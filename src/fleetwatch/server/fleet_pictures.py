"""The fleet page's pictures: each node's state on the map, the last 30 days' trends and the
risk distribution, drawn by :mod:`fleetwatch.charts`.

A node's state is the worst that applies (:data:`fleetwatch.charts.STATES`), except that a node
in a maintenance window is shown as in maintenance whatever else it is: its silence, reboots and
resets are planned. Out by rule: a verdict took one of its GPUs out. At risk: one of its GPUs'
model P(failure within the page's horizon) reaches ``notice_risk_threshold``, the level at which
a job on it is told. Draining: an eviction of it was acked or completed and it has not returned.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from markupsafe import Markup
from sqlalchemy import Connection

from fleetwatch.charts import (
    MapNode,
    availability_svg,
    events_svg,
    fleet_map_svg,
    risk_bands,
    risk_bands_svg,
    state_counts,
    worst,
)
from fleetwatch.charts.fleet_map import STATES
from fleetwatch.reports.daily import daily_figures, day_starts
from fleetwatch.server.judge.assessment import FleetAssessment
from fleetwatch.server.repo.availability_rows import load_outages

__all__ = ["TREND_DAYS", "FleetPictures", "NodeFlags", "draw", "node_flags", "node_state"]

TREND_DAYS = 30
_LIVENESS = {"unreachable": "unreachable", "unheard": "unheard", "maintenance": "maintenance"}


@dataclass(frozen=True)
class NodeFlags:
    """What the assessment says of the fleet's nodes, for their states."""

    out: frozenset[str]
    at_risk: frozenset[str]
    model_probabilities: list[float | None]  # one per GPU in service
    out_gpus: int


@dataclass(frozen=True)
class FleetPictures:
    map_svg: Markup
    counts: list[tuple[str, str, int]]  # (state, words, nodes)
    events_svg: Markup
    availability_svg: Markup
    bands_svg: Markup
    trend_days: int


def node_flags(snap: FleetAssessment, horizon_days: float, threshold: float) -> NodeFlags:
    out: set[str] = set()
    at_risk: set[str] = set()
    probabilities: list[float | None] = []
    out_gpus = 0
    for risk in snap.risks(horizon_days):
        if risk.gpu.out_of_service:
            out.add(risk.gpu.node)
            out_gpus += 1
            continue
        p = risk.model_probability
        probabilities.append(p)
        if p is not None and p >= threshold:
            at_risk.add(risk.gpu.node)
    return NodeFlags(frozenset(out), frozenset(at_risk), probabilities, out_gpus)


def node_state(name: str, liveness: str, flags: NodeFlags, draining: set[str]) -> str:
    """``name``'s state on the map from its liveness reading (up, unheard, unreachable or
    maintenance) and the assessment's flags (see the module's docstring)."""
    if liveness == "maintenance":
        return "maintenance"
    found = [_LIVENESS[liveness]] if liveness in _LIVENESS else []
    found += [s for s, names in (("out", flags.out), ("at_risk", flags.at_risk)) if name in names]
    if name in draining:
        found.append("draining")
    return worst(found)


def _trends(conn: Connection, now: datetime, settings_target: float) -> tuple[Markup, Markup]:
    starts = day_starts(now, TREND_DAYS)
    period = load_outages(conn, starts[0], now)
    days = daily_figures(period, starts)
    return Markup(events_svg(days)), Markup(availability_svg(days, target=settings_target))


def draw(
    conn: Connection,
    nodes: Iterable[tuple[str, Mapping[str, Any], str]],
    *,
    flags: NodeFlags,
    draining: set[str],
    now: datetime,
    sla_target: float,
) -> FleetPictures:
    """The pictures of ``nodes`` given as (name, labels, liveness reading)."""
    placed = [
        MapNode(
            name,
            node_state(name, reading, flags, draining),
            rack=_label(labels, "rack"),
            row=_label(labels, "row"),
        )
        for name, labels, reading in nodes
    ]
    counted = state_counts(placed)
    counts = [(s, words, counted[s]) for s, words, _ in STATES if counted[s] or s != "unheard"]
    events, availability = _trends(conn, now, sla_target)
    bands = risk_bands(flags.model_probabilities, out_by_rule=flags.out_gpus)
    return FleetPictures(
        map_svg=Markup(fleet_map_svg(placed)),
        counts=counts,
        events_svg=events,
        availability_svg=availability,
        bands_svg=Markup(risk_bands_svg(bands)),
        trend_days=TREND_DAYS,
    )


def _label(labels: Mapping[str, Any], key: str) -> str | None:
    value = labels.get(key)
    return str(value) if value not in (None, "") else None
