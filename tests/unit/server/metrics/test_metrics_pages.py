"""Every metric a Grafana panel or an alert rule reads is on a /metrics page that the shipped
scrape config scrapes: the default page or a shard. Alerts read the default page only, but for
the fabric group's, which read each port's counters on the shards.

A small fleet that makes every family appear: full GPU samples, an Xid 79 (a fatal verdict), a
fitted risk model and an assessment, straggler ratios and slowness scores, network ports (one
down, one degraded, a RoCE port; two readings, so rates) and host errors (a fatal machine check:
a verdict about the node).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from tests.conftest import bearer
from tests.factories import make_batch
from tests.unit.server.conftest import Push
from tests.unit.server.routers.test_risk_api import _store_model
from tests.unit.test_prometheus_rules import RULES

from fleetwatch.dashboards import build_all, panel_queries, template_variables
from fleetwatch.metrics import GPU_METRICS
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import node_slowness, straggler_state

SCRAPE_CONFIG = RULES.parents[1] / "prometheus.yml"
FLAGS = {
    "retired_pages_pending",
    "remapped_rows_pending",
    "remapped_rows_failure",
}


def _ports(at: datetime, tick: int) -> list[dict[str, Any]]:
    def port(device: str, **fields: Any) -> dict[str, Any]:
        return {"device": device, "port": 1, "ts": at.isoformat(), "link_layer": "InfiniBand",
                "state": "ACTIVE", "state_code": 4, "phys_state": "LinkUp", "phys_state_code": 5,
                "rate_gbps": 400.0, "link_width": 4} | fields  # fmt: skip

    counters = {"symbol_error": tick, "link_downed": tick, "link_error_recovery": tick,
                "port_rcv_errors": tick, "port_xmit_discards": tick}  # fmt: skip
    return [
        port("mlx5_0", netdev="ib0", counters=counters),
        port("mlx5_1", state="DOWN", state_code=1, phys_state="Polling", phys_state_code=2),
        port("mlx5_2", rate_gbps=200.0, link_width=2),
        port("mlx5_bond_0", link_layer="Ethernet", hw_counters={"roce_adp_retrans": tick}),
    ]


def _names(expr: str) -> set[str]:
    return set(re.findall(r"\bfleetwatch_[a-z0-9_]+", expr))


def _produced(text: str) -> set[str]:
    """Names of the series a page actually carries (a family announced with no sample is not)."""
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.fixture
def pages(client: TestClient, push: Push, db: Database, tokens: dict[str, str]) -> dict[str, set]:
    """Series names on the default page and on the shards of the shipped scrape config."""
    _store_model(db)
    batch = make_batch("node-a", gpus=2, ticks=2)
    for sample in batch["samples"]:
        for metric in GPU_METRICS:
            sample.setdefault(metric.field, False if metric.field in FLAGS else 1)
    bus = batch["gpus"][1]["pci_bus_id"]
    now = datetime.now(UTC)
    batch["events"] = [
        {"kind": "xid", "ts": now.isoformat(), "xid": 79, "pci_bus_id": bus},
        {"kind": "mce", "ts": now.isoformat(), "details": {"severity": "corrected"}},
        # Judged about the whole node: fleetwatch_node_verdict.
        {"kind": "mce", "ts": now.isoformat(), "details": {"severity": "fatal"}},
    ]
    batch["ports"] = _ports(now - timedelta(seconds=20), 0) + _ports(now - timedelta(seconds=10), 1)
    assert push(batch).status_code == 200
    assert push(make_batch("node-b", gpus=2)).status_code == 200
    client.app.state.assessor.run_once()  # type: ignore[attr-defined]
    with db.write() as conn:
        ratios = {"node-a": 1.3, "node-b": 1.0}
        conn.execute(
            straggler_state.insert().values(
                job_id="job-1", next_start=now, detector={}, ratios=ratios, updated_at=now
            )
        )
        for node, score in ratios.items():
            conn.execute(
                node_slowness.insert().values(node=node, score=score, windows=3, updated_at=now)
            )

    job = next(
        j
        for j in yaml.safe_load(SCRAPE_CONFIG.read_text())["scrape_configs"]
        if j["job_name"] == "fleetwatch-shards"
    )
    shards = int(job["params"]["shards"][0])
    read = bearer(tokens["read"])

    def scrape(params: dict[str, int]) -> set[str]:
        response = client.get("/metrics", params=params, headers=read)
        assert response.status_code == 200, response.text
        return _produced(response.text)

    shard_names: set[str] = set()
    for index in job["static_configs"][0]["targets"]:
        shard_names |= scrape({"shard": int(index), "shards": shards})
    return {"default": scrape({}), "shards": shard_names}


def _dashboard_names() -> dict[str, set[str]]:
    used: dict[str, set[str]] = {}
    for name, doc in build_all().items():
        queries = [q for _, q in panel_queries(doc)] + list(template_variables(doc).values())
        used[name] = set().union(*(_names(q) for q in queries))
    return used


def _alert_names(*, fabric: bool) -> set[str]:
    """Metrics the alerts of the fabric group (``fabric``) or of every other group read."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return set().union(
        *(
            _names(r["expr"])
            for g in groups
            if (g["name"] == "fleetwatch-fabric") == fabric
            for r in g["rules"]
        )
    )


def test_every_dashboard_metric_is_on_a_scraped_page(pages: dict[str, set]) -> None:
    produced = pages["default"] | pages["shards"]
    for dashboard, used in _dashboard_names().items():
        assert used, dashboard
        assert used - produced == set(), dashboard


def test_every_alert_reads_the_default_page(pages: dict[str, set]) -> None:
    used = _alert_names(fabric=False)
    assert len(used) >= 8
    assert used - pages["default"] == set()


def test_fabric_alerts_read_a_scraped_page(pages: dict[str, set]) -> None:
    used = _alert_names(fabric=True)
    assert {"fleetwatch_node_ports_down", "fleetwatch_port_link_downed_total"} <= used
    assert used - (pages["default"] | pages["shards"]) == set()


def test_the_pages_share_no_series_name(pages: dict[str, set]) -> None:
    assert pages["default"] & pages["shards"] == set()
    assert {"fleetwatch_gpu_temperature_celsius", "fleetwatch_gpu_failure_probability"} <= pages[
        "shards"
    ]
    assert {"fleetwatch_gpu_verdict", "fleetwatch_node_up", "fleetwatch_gpus"} <= pages["default"]
    # Ports: one series per port on the shards; the default page has fleet counts and the nodes
    # with a problem.
    assert {"fleetwatch_port_state", "fleetwatch_port_symbol_errors_total"} <= pages["shards"]
    assert {"fleetwatch_ports", "fleetwatch_node_ports_down"} <= pages["default"]
    assert {"fleetwatch_fleet_host_events_total"} <= pages["default"]
    assert {"fleetwatch_host_events_total"} <= pages["shards"]
