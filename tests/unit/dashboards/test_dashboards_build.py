"""`fleetwatch dashboards build`: reproducible JSON, committed files up to date, queries that use
only metrics FleetWatch exports, and variables every templated panel needs."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner
from tests.unit.test_prometheus_rules import exported_metric_names

from fleetwatch.cli import main
from fleetwatch.dashboards import DASHBOARDS, build_all, panel_queries, render, template_variables

REPO = Path(__file__).resolve().parents[3]
COMMITTED = REPO / "dashboards/grafana/dashboards"


def test_dashboards_build_writes_every_dashboard(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["dashboards", "build", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in (tmp_path / "dashboards").iterdir())
    assert written == sorted(f"{name}.json" for name in DASHBOARDS)
    assert result.output.count(".json") == len(DASHBOARDS)


def test_dashboards_build_matches_the_committed_files(tmp_path: Path) -> None:
    CliRunner().invoke(main, ["dashboards", "build", "--out", str(tmp_path)])
    for name in DASHBOARDS:
        fresh = (tmp_path / "dashboards" / f"{name}.json").read_text()
        committed = COMMITTED / f"{name}.json"
        assert committed.read_text() == fresh, (
            f"{committed} is stale: run `fleetwatch dashboards build`"
        )
    assert sorted(p.stem for p in COMMITTED.glob("*.json")) == sorted(DASHBOARDS)


def test_dashboards_build_is_reproducible() -> None:
    assert {k: render(v) for k, v in build_all().items()} == {
        k: render(v) for k, v in build_all().items()
    }


def test_dashboard_queries_use_only_exported_metrics() -> None:
    known = exported_metric_names()
    for name, doc in build_all().items():
        queries = panel_queries(doc) + [("$var", q) for q in template_variables(doc).values()]
        for title, expr in queries:
            used = set(re.findall(r"\bfleetwatch_[a-z0-9_]+", expr))
            assert used, f"{name}/{title}: {expr}"
            assert used - known == set(), f"{name}/{title}: {expr}"


def test_dashboards_have_unique_uids_titled_panels_and_defined_variables() -> None:
    docs = build_all()
    assert len({d["uid"] for d in docs.values()}) == len(docs)
    for name, doc in docs.items():
        variables = set(template_variables(doc))
        for panel in doc["panels"]:
            assert panel.get("title"), name
            if panel["type"] != "row":
                assert panel["targets"], f"{name}/{panel['title']}"
                assert panel["datasource"] == {"type": "prometheus", "uid": "prometheus"}
        for title, expr in panel_queries(doc):
            used = set(re.findall(r"\$(\w+)", expr)) - {"__rate_interval"}
            assert used <= variables, f"{name}/{title}: {used - variables}"
    assert set(template_variables(docs["gpu-detail"])) == {"node", "gpu"}


def test_fleet_health_has_the_panels_an_operator_looks_for() -> None:
    titles = {p["title"] for p in build_all()["fleet-health"]["panels"]}
    for wanted in (
        "Node state by rack",
        "Riskiest nodes (7-day failure probability)",
        "Critical and fatal verdicts",
        "Xid rate by code",
        "Drain budget",
    ):
        assert wanted in titles


def test_fabric_has_the_panels_an_operator_looks_for() -> None:
    doc = build_all()["fabric"]
    titles = {p["title"] for p in doc["panels"]}
    for wanted in (
        "Ports down",
        "Degraded links",
        "Nodes with a port down",
        "Port errors per second",
        "Link flaps per port (link_downed, last hour)",
        "RoCE retransmissions per second",
        "Host errors by kind and severity (per hour)",
    ):
        assert wanted in titles
    used = {m for _, q in panel_queries(doc) for m in re.findall(r"\bfleetwatch_[a-z0-9_]+", q)}
    assert {"fleetwatch_ports", "fleetwatch_fleet_host_events_total"} <= used
