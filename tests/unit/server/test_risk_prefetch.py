"""The risk series of /metrics are rendered in the background once per new assessment."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

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
