"""Grafana dashboards as code: ``fleetwatch dashboards build`` writes them as JSON.

Each dashboard lives in its own module and is built with grafana-foundation-sdk (the ``dashboards``
extra); :func:`build_all` returns them as plain JSON documents and :func:`write_all` writes them
byte-for-byte reproducibly (sorted keys, two-space indent, trailing newline), so the committed
files in ``dashboards/grafana/dashboards/`` can be checked against a fresh build.
"""

from __future__ import annotations

from fleetwatch.dashboards.build import (
    DASHBOARDS,
    build_all,
    panel_queries,
    render,
    template_variables,
    write_all,
)

__all__ = [
    "DASHBOARDS",
    "build_all",
    "panel_queries",
    "render",
    "template_variables",
    "write_all",
]
