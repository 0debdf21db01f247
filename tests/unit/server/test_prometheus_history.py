"""The history import's plan (chunks within Prometheus' points limit) and its API client's
errors, with Prometheus faked by httpx.MockTransport; the real thing is in
tests/integration/test_prometheus_import.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from fleetwatch.errors import InvalidInput, SourceError
from fleetwatch.server.history.prometheus_api import MAX_POINTS_PER_SERIES, PrometheusApi
from fleetwatch.server.history.prometheus_import import plan_import

NOW = datetime(2026, 3, 31, 12, 34, 56, tzinfo=UTC)


@pytest.mark.parametrize("step_s", [1.0, 15.0, 300.0, 3600.0])
def test_plan_import_chunks_whole_hours_within_the_points_limit(step_s: float) -> None:
    plan = plan_import(since=NOW - timedelta(days=30), now=NOW, step_s=step_s)
    chunks = plan.chunks()
    assert plan.start == datetime(2026, 3, 1, 12, tzinfo=UTC)
    assert plan.end == datetime(2026, 3, 31, 12, tzinfo=UTC)  # the current hour is left out
    assert chunks[0][0] == plan.start and chunks[-1][1] == plan.end
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:], strict=False))
    for start, end in chunks:
        assert start.minute == 0 and end.minute == 0
        points = (end - start).total_seconds() / step_s  # the end itself is not asked for
        assert points <= MAX_POINTS_PER_SERIES


def test_plan_import_refuses_a_bad_step_or_an_empty_window() -> None:
    with pytest.raises(InvalidInput, match="step"):
        plan_import(since=NOW - timedelta(days=1), now=NOW, step_s=0.5)
    with pytest.raises(InvalidInput, match="current hour"):
        plan_import(since=NOW - timedelta(minutes=5), now=NOW, step_s=60)


def test_prometheus_api_passes_on_prometheus_error_text() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = {"status": "error", "errorType": "bad_data", "error": "exceeded maximum resolution"}
        return httpx.Response(400, json=body)

    transport = httpx.MockTransport(handler)
    with (
        httpx.Client(base_url="http://prom:9090", transport=transport) as client,
        pytest.raises(SourceError, match="400: exceeded maximum resolution") as caught,
    ):
        PrometheusApi(client).query_range("up", NOW - timedelta(hours=1), NOW, 1.0)
    assert caught.value.url == "http://prom:9090/api/v1/query_range"


def test_prometheus_api_reads_a_matrix() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        result = [{"metric": {"__name__": "up", "job": "x"}, "values": [[1700000000, "1"]]}]
        data = {"resultType": "matrix", "result": result}
        return httpx.Response(200, json={"status": "success", "data": data})

    transport = httpx.MockTransport(handler)
    with httpx.Client(base_url="http://prom:9090", transport=transport) as client:
        series = PrometheusApi(client).query_range("up", NOW, NOW, 300)
    assert [(s.labels, s.samples) for s in series] == [
        ({"__name__": "up", "job": "x"}, [(1_700_000_000_000, 1.0)])
    ]
    assert seen[0].url.params["step"] == "300"
