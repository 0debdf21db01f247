"""Every metric a Grafana panel or an alert rule reads is on a /metrics page that the shipped
scrape config scrapes: the default page or a shard. Alerts read the default page only.

A small fleet that makes every family appear: full GPU samples, an Xid 79 (a fatal verdict), a
fitted risk model and an assessment, straggler ratios and slowness scores.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from tests.conftest import bearer
from tests.factories import make_batch
from tests.unit.server.conftest import Push
from tests.unit.server.test_risk_api import _store_model
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
    batch["events"] = [
        {"kind": "xid", "ts": datetime.now(UTC).isoformat(), "xid": 79, "pci_bus_id": bus}
    ]
    assert push(batch).status_code == 200
    assert push(make_batch("node-b", gpus=2)).status_code == 200
    client.app.state.assessor.run_once()  # type: ignore[attr-defined]
    now = datetime.now(UTC)
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


def _alert_names() -> set[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return set().union(*(_names(r["expr"]) for g in groups for r in g["rules"]))


def test_every_dashboard_metric_is_on_a_scraped_page(pages: dict[str, set]) -> None:
    produced = pages["default"] | pages["shards"]
    for dashboard, used in _dashboard_names().items():
        assert used, dashboard
        assert used - produced == set(), dashboard


def test_every_alert_reads_the_default_page(pages: dict[str, set]) -> None:
    used = _alert_names()
    assert len(used) >= 8
    assert used - pages["default"] == set()


def test_the_pages_share_no_series_name(pages: dict[str, set]) -> None:
    assert pages["default"] & pages["shards"] == set()
    assert {"fleetwatch_gpu_temperature_celsius", "fleetwatch_gpu_failure_probability"} <= pages[
        "shards"
    ]
    assert {"fleetwatch_gpu_verdict", "fleetwatch_node_up", "fleetwatch_gpus"} <= pages["default"]
