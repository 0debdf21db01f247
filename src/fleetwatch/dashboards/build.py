"""Build, render and write the dashboards; read back their queries and template variables."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from fleetwatch.dashboards.fabric import fabric
from fleetwatch.dashboards.fleet import fleet_health
from fleetwatch.dashboards.gpu import gpu_detail
from fleetwatch.dashboards.reliability import reliability
from fleetwatch.dashboards.stragglers import stragglers

__all__ = [
    "DASHBOARDS",
    "build_all",
    "panel_queries",
    "render",
    "template_variables",
    "write_all",
]

# File stem -> builder. The stems are the committed file names in dashboards/grafana/dashboards/.
DASHBOARDS: dict[str, Callable[[], dash.Dashboard]] = {
    "fleet-health": fleet_health,
    "gpu-detail": gpu_detail,
    "stragglers": stragglers,
    "reliability": reliability,
    "fabric": fabric,
}


def build_all() -> dict[str, dict[str, Any]]:
    """Every dashboard as a JSON document (what Grafana's provisioning reads)."""
    out = {}
    for name, make in DASHBOARDS.items():
        doc: dict[str, Any] = json.loads(json.dumps(make().build(), cls=JSONEncoder))
        for number, panel in enumerate(doc.get("panels") or [], start=1):
            panel["id"] = number  # stable ids, so links to a panel survive a rebuild
        out[name] = doc
    return out


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def write_all(out_dir: Path) -> list[Path]:
    """Write ``<out_dir>/dashboards/<name>.json`` for every dashboard; returns the paths."""
    target = out_dir / "dashboards"
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name, doc in build_all().items():
        path = target / f"{name}.json"
        path.write_text(render(doc))
        written.append(path)
    return written


def panel_queries(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query target of every panel, rows included."""
    found = []
    stack = list(doc.get("panels") or [])
    while stack:
        panel = stack.pop(0)
        stack.extend(panel.get("panels") or [])
        for target in panel.get("targets") or []:
            if target.get("expr"):
                found.append((str(panel.get("title", "")), str(target["expr"])))
    return found


def template_variables(doc: dict[str, Any]) -> dict[str, str]:
    """Template variable name -> its query (e.g. ``label_values(fleetwatch_gpu_info, node)``)."""
    templating = doc.get("templating") or {}
    return {str(v["name"]): str(v.get("query", "")) for v in templating.get("list") or []}
