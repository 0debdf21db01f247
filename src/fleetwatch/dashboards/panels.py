"""Small panel helpers over grafana-foundation-sdk: a Prometheus query, and the four panel kinds
the FleetWatch dashboards use, all pointing at the provisioned ``prometheus`` data source."""

from __future__ import annotations

from grafana_foundation_sdk.builders import bargauge, stat, table, timeseries
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

__all__ = [
    "DATASOURCE",
    "Query",
    "bars",
    "layout",
    "query_variable",
    "single_stat",
    "table_panel",
    "time_series",
]

# The uid of dashboards/grafana/provisioning/datasources/prometheus.yml.
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="prometheus")
# Grafana's own rate window: at least four scrape intervals, whatever the zoom.
RATE = "$__rate_interval"

Query = tuple[str, str]  # (PromQL, legend format)


def _targets(queries: list[Query], *, instant: bool) -> list[prom.Dataquery]:
    out = []
    for i, (expr, legend) in enumerate(queries):
        q = prom.Dataquery().expr(expr).ref_id(chr(ord("A") + i)).datasource(DATASOURCE)
        if legend:
            q = q.legend_format(legend)
        if instant:
            q = q.instant().format(PromQueryFormat.TABLE)
        out.append(q)
    return out


def time_series(
    title: str, queries: list[Query], *, unit: str = "short", description: str = "", w: int = 12
) -> timeseries.Panel:
    panel = timeseries.Panel().title(title).unit(unit).datasource(DATASOURCE).span(w).height(8)
    if description:
        panel = panel.description(description)
    for target in _targets(queries, instant=False):
        panel = panel.with_target(target)
    return panel


def single_stat(
    title: str, expr: str, *, unit: str = "short", description: str = "", w: int = 4
) -> stat.Panel:
    panel = stat.Panel().title(title).unit(unit).datasource(DATASOURCE).span(w).height(4)
    if description:
        panel = panel.description(description)
    return panel.with_target(_targets([(expr, "")], instant=False)[0])


def table_panel(
    title: str, expr: str, *, unit: str = "short", description: str = "", w: int = 12, h: int = 8
) -> table.Panel:
    panel = table.Panel().title(title).unit(unit).datasource(DATASOURCE).span(w).height(h)
    if description:
        panel = panel.description(description)
    return panel.with_target(_targets([(expr, "")], instant=True)[0])


def bars(
    title: str, queries: list[Query], *, unit: str = "short", description: str = "", w: int = 12
) -> bargauge.Panel:
    panel = bargauge.Panel().title(title).unit(unit).datasource(DATASOURCE).span(w).height(8)
    if description:
        panel = panel.description(description)
    for target in _targets(queries, instant=True):
        panel = panel.with_target(target)
    return panel


def query_variable(name: str, label: str, query: str) -> dash.QueryVariable:
    return (
        dash.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
    )


def layout(title: str, uid: str, description: str) -> dash.Dashboard:
    """A dashboard with FleetWatch's defaults: last 6 hours, 30 s refresh, UTC, tagged."""
    return (
        dash.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["fleetwatch"])
        .time("now-6h", "now")
        .refresh("30s")
        .timezone("utc")
        .editable()
    )
