"""The risk series of /metrics are rendered in the background once per new assessment."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from tests.conftest import bearer

from fleetwatch.server.judge.assessment import FleetAssessment
from fleetwatch.server.metrics import risk_exposition
from fleetwatch.server.metrics.risk_exposition import render_risk
from fleetwatch.server.metrics.risk_prefetch import RiskPrefetch

HORIZONS = [24.0, 168.0]


def _snapshot() -> FleetAssessment:
    return FleetAssessment(datetime(2026, 1, 1, tzinfo=UTC), [], None, None)


def test_risk_prefetch_renders_each_new_snapshot_once(monkeypatch: pytest.MonkeyPatch) -> None:
    rendered: list[FleetAssessment] = []
    real = risk_exposition._render

    def counting(snapshot: FleetAssessment, horizons: list[float]) -> str:
        rendered.append(snapshot)
        return real(snapshot, horizons)

    monkeypatch.setattr(risk_exposition, "_render", counting)
    current: list[FleetAssessment | None] = [None]
    prefetch = RiskPrefetch(lambda: current[0], HORIZONS)
    prefetch.scraped()
    assert prefetch.prefetch_once() is False  # no assessment yet
    current[0] = first = _snapshot()
    assert prefetch.prefetch_once() is True
    assert prefetch.prefetch_once() is False  # the same snapshot: nothing to do
    assert rendered == [first]
    # What a scrape asks for is ready: nothing is rendered at scrape time.
    text = render_risk(first, HORIZONS)
    assert rendered == [first]
    assert "fleetwatch_assessment_timestamp_seconds 1767225600.000" in text
    current[0] = second = _snapshot()
    assert prefetch.prefetch_once() is True
    assert rendered == [first, second]


def test_risk_prefetch_thread_stops() -> None:
    prefetch = RiskPrefetch(_snapshot, HORIZONS, poll_s=0.01)
    prefetch.start()
    prefetch.stop()
    assert prefetch._thread is not None and not prefetch._thread.is_alive()


def test_risk_prefetch_renders_only_while_the_page_is_scraped() -> None:
    now = [1000.0]
    snapshots = iter([_snapshot(), _snapshot(), _snapshot()])
    current = [next(snapshots)]
    prefetch = RiskPrefetch(lambda: current[0], HORIZONS, active_for_s=600.0, clock=lambda: now[0])
    assert prefetch.prefetch_once() is False  # never scraped: nobody would read it
    assert "metrics:" not in "".join(current[0]._memo)
    prefetch.scraped()
    assert prefetch.prefetch_once() is True
    now[0] += 600.0  # the last scrape is as old as allowed
    current[0] = next(snapshots)
    assert prefetch.prefetch_once() is True
    now[0] += 0.5  # scrapes stopped past the window: the next snapshot is left alone
    current[0] = next(snapshots)
    assert prefetch.prefetch_once() is False
    assert not current[0]._memo
    prefetch.scraped()  # scraped again: rendered again
    assert prefetch.prefetch_once() is True


def test_a_scrape_of_the_default_page_turns_the_prefetch_on(
    make_client: Any, tokens: dict[str, str]
) -> None:
    """The real app with its background jobs on (every timer an hour away): a shard scrape
    leaves the prefetch off, a scrape of the default page turns it on."""
    hour = 3600.0
    client = make_client(
        background_jobs=True,
        assess_interval_s=hour,
        planner_interval_s=hour,
        alert_interval_s=hour,
        refit_interval_s=0,
    )
    prefetch = client.app.state.risk_prefetch
    assert not prefetch.is_active()
    shard = client.get("/metrics", params={"shard": 0, "shards": 2}, headers=bearer(tokens["read"]))
    assert shard.status_code == 200
    assert not prefetch.is_active()
    page = client.get("/metrics", headers=bearer(tokens["read"]))
    assert page.status_code == 200
    assert prefetch.is_active()
