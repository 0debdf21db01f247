"""Server-rendered SVG pictures of the fleet: pure functions from plain data to an SVG string.

The fleet page embeds them inline (its Content-Security-Policy loads no images and runs no
script) and the weekly report reuses them. Every drawn mark carries ``data-*`` attributes naming
what it stands for, so a test (or a person with the inspector) can check the picture against
the data without reading pixels.
"""

from __future__ import annotations

from fleetwatch.charts.fleet_map import STATES, MapNode, fleet_map_svg, state_counts, worst
from fleetwatch.charts.risk_bands import RiskBand, risk_bands, risk_bands_svg
from fleetwatch.charts.trends import DayFigures, availability_svg, events_svg

__all__ = [
    "STATES",
    "DayFigures",
    "MapNode",
    "RiskBand",
    "availability_svg",
    "events_svg",
    "fleet_map_svg",
    "risk_bands",
    "risk_bands_svg",
    "state_counts",
    "worst",
]
