"""The weekly report's pictures: the fleet map at the week's end and the trends of the weeks
up to it, drawn by the fleet page's own SVG builders (:mod:`fleetwatch.charts`).

A report is about a week that has passed, so its map cannot show verdicts the server holds
now. It shows each node's state at the week's end from the same outages and maintenance windows
the availability figures count: in a maintenance window, drained and not yet returned, out
with a failed GPU not yet back, or else in service. The pictures go into the page as ``data:``
images, the only images the report's Content-Security-Policy (and a PDF) takes.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import asdict
from datetime import date, datetime
from typing import Any

from fleetwatch.charts.fleet_map import MapNode, fleet_map_svg
from fleetwatch.charts.trends import DayFigures, availability_svg, events_svg
from fleetwatch.reports.availability import FleetPeriod

__all__ = ["REPORT_TREND_DAYS", "day_dicts", "pictures", "week_end_states"]

REPORT_TREND_DAYS = 28  # the week and the three before it


def week_end_states(period: FleetPeriod, at: datetime) -> list[dict[str, Any]]:
    """Each node of ``period`` and its state at ``at``, with its rack and row labels."""
    down: dict[str, str] = {}
    for outage in period.outages:
        if outage.start <= at and (outage.end is None or outage.end > at):
            state = "draining" if outage.cause.startswith("drain") else "out"
            if down.get(outage.node) != "out":  # a failed GPU outranks a drain
                down[outage.node] = state
    out = []
    for node, labels in sorted(period.nodes.items()):
        planned = any(start <= at < end for start, end in period.planned.get(node, ()))
        state = down.get(node) or ("maintenance" if planned else "healthy")
        out.append(
            {
                "node": node,
                "state": state,
                "rack": _label(labels, "rack"),
                "row": _label(labels, "row"),
            }
        )
    return out


def day_dicts(days: Sequence[DayFigures]) -> list[dict[str, Any]]:
    """Day figures as JSON (the report's ``days``)."""
    return [asdict(d) | {"day": d.day.isoformat()} for d in days]


def pictures(
    fleet_states: list[dict[str, Any]] | None,
    days: list[dict[str, Any]] | None,
    *,
    sla_target: float | None,
) -> dict[str, str]:
    """Name -> ``data:`` URL of each picture the report has data for."""
    out = {}
    if fleet_states:
        nodes = [MapNode(s["node"], s["state"], rack=s["rack"], row=s["row"]) for s in fleet_states]
        out["fleet_map"] = _data_url(fleet_map_svg(nodes))
    if days:
        figures = [DayFigures(**(d | {"day": date.fromisoformat(d["day"])})) for d in days]
        out["events"] = _data_url(events_svg(figures))
        out["availability"] = _data_url(availability_svg(figures, target=sla_target))
    return out


def _data_url(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode("ascii")


def _label(labels: Any, key: str) -> str | None:
    value = labels.get(key) if labels else None
    return str(value) if value not in (None, "") else None
