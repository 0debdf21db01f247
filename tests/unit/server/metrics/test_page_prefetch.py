"""The default /metrics page's slow parts are built in the background: the risk series once per
new assessment, the other parts whenever they are stale."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest
from tests.conftest import bearer

from fleetwatch.server.judge.assessment import FleetAssessment
from fleetwatch.server.metrics import risk_exposition
from fleetwatch.server.metrics.page_prefetch import PagePrefetch
from fleetwatch.server.metrics.risk_exposition import render_risk

HORIZONS = [24.0, 168.0]


def _snapshot() -> FleetAssessment:
    return FleetAssessment(datetime(2026, 1, 1, tzinfo=UTC), [], None, None)


def test_the_prefetch_renders_each_new_snapshot_once(monkeypatch: pytest.MonkeyPatch) -> None:
    rendered: list[FleetAssessment] = []
    real = risk_exposition._render

    def counting(snapshot: FleetAssessment, horizons: list[float]) -> str:
        rendered.append(snapshot)
        return real(snapshot, horizons)

    monkeypatch.setattr(risk_exposition, "_render", counting)
    current: list[FleetAssessment | None] = [None]
    prefetch = PagePrefetch(lambda: current[0], HORIZONS)
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


def test_the_prefetch_thread_stops() -> None:
    prefetch = PagePrefetch(_snapshot, HORIZONS, poll_s=0.01)
    prefetch.start()
    prefetch.stop()
    assert prefetch._thread is not None and not prefetch._thread.is_alive()


def test_the_prefetch_renders_only_while_the_page_is_scraped() -> None:
    now = [1000.0]
    snapshots = iter([_snapshot(), _snapshot(), _snapshot()])
    current = [next(snapshots)]
    prefetch = PagePrefetch(lambda: current[0], HORIZONS, active_for_s=600.0, clock=lambda: now[0])
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


def test_a_warm_process_renders_before_any_scrape() -> None:
    """The leader keeps the page warm from its start; once it stops leading, it renders only
    while scraped, as any other process."""
    leading = [True]
    current = [_snapshot()]
    prefetch = PagePrefetch(lambda: current[0], HORIZONS, warm_while=lambda: leading[0])
    assert not prefetch.is_active()  # never scraped
    assert prefetch.prefetch_once() is True
    assert "metrics:" in "".join(current[0]._memo)
    leading[0] = False
    current[0] = _snapshot()
    assert prefetch.prefetch_once() is False
    assert not current[0]._memo


def test_the_other_parts_are_refreshed_only_while_the_page_is_built_ahead() -> None:
    now = [1000.0]
    refreshed: list[float] = []
    prefetch = PagePrefetch(
        lambda: None,
        HORIZONS,
        refreshers=[lambda: refreshed.append(now[0])],
        active_for_s=600.0,
        clock=lambda: now[0],
    )
    prefetch.prefetch_once()
    assert refreshed == []  # nobody scrapes: nothing to refresh for
    prefetch.scraped()
    prefetch.prefetch_once()
    now[0] += 30.0
    prefetch.prefetch_once()  # every poll: the refresher itself knows when it is stale
    assert refreshed == [1000.0, 1030.0]


def _app_with_jobs(make_client: Any) -> Any:
    """The real app with its background jobs on, every timer an hour away."""
    hour = 3600.0
    return make_client(
        background_jobs=True,
        assess_interval_s=hour,
        planner_interval_s=hour,
        alert_interval_s=hour,
        refit_interval_s=0,
    )


def test_the_leader_builds_the_page_before_its_first_scrape(
    make_client: Any, tokens: dict[str, str]
) -> None:
    """The real app leading (SQLite: one process, its jobs on, every timer an hour away): its
    prefetch computes the availability figures with no scrape yet."""
    client = _app_with_jobs(make_client)
    availability = client.app.state.availability
    deadline = time.monotonic() + 60
    while availability.is_stale() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not availability.is_stale()
    assert not client.app.state.page_prefetch.is_active()  # built ahead, not because scraped


def test_a_scrape_of_the_default_page_turns_the_prefetch_on(
    make_client: Any, tokens: dict[str, str]
) -> None:
    """The real app with its background jobs on (every timer an hour away): a shard scrape
    leaves the prefetch off, a scrape of the default page turns it on."""
    client = _app_with_jobs(make_client)
    prefetch = client.app.state.page_prefetch
    assert not prefetch.is_active()
    shard = client.get("/metrics", params={"shard": 0, "shards": 2}, headers=bearer(tokens["read"]))
    assert shard.status_code == 200
    assert not prefetch.is_active()
    page = client.get("/metrics", headers=bearer(tokens["read"]))
    assert page.status_code == 200
    assert prefetch.is_active()
