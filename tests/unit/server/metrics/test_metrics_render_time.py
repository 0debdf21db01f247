"""``/metrics`` counts its own rendering: each page built adds one observation to
``fleetwatch_metrics_render_seconds{page}`` and its thread's CPU to
``fleetwatch_metrics_render_cpu_seconds_total{page}``, shown on the next default page."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from tests.conftest import bearer
from tests.factories import make_batch
from tests.unit.server.conftest import Push


def _samples(text: str) -> dict[tuple[str, str], float]:
    return {
        (s.name, s.labels.get("page", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("fleetwatch_metrics_render")
    }


def test_each_page_built_is_counted_under_its_kind(
    client: TestClient, push: Push, tokens: dict[str, str]
) -> None:
    assert push(make_batch("node-a", gpus=2)).status_code == 200
    read = bearer(tokens["read"])

    def scrape(**params: int) -> str:
        response = client.get("/metrics", params=params, headers=read)
        assert response.status_code == 200, response.text
        return response.text

    first = _samples(scrape())
    assert ("fleetwatch_metrics_render_seconds_count", "default") not in first  # none built yet
    scrape(shard=0, shards=2)
    scrape(shard=1, shards=2)
    seen = _samples(scrape())
    assert seen[("fleetwatch_metrics_render_seconds_count", "default")] == 1
    assert seen[("fleetwatch_metrics_render_seconds_count", "shard")] == 2
    for page in ("default", "shard"):
        assert seen[("fleetwatch_metrics_render_seconds_sum", page)] > 0
        assert seen[("fleetwatch_metrics_render_cpu_seconds_total", page)] > 0
