"""The weekly report's "Availability and jobs" section on the fixed week of ``conftest.py``,
against figures worked out by hand from its rows."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.reports.conftest import NOW, WEEK

from fleetwatch.config import ServerSettings
from fleetwatch.reports.render import render_html
from fleetwatch.reports.weeks import parse_week
from fleetwatch.server.db.session import Database
from fleetwatch.server.repo.report_rows import compute_weekly


def test_weekly_availability_section_matches_the_rows_by_hand(
    db: Database, settings: ServerSettings, fleet_rows: Any
) -> None:
    with db.read() as conn:
        report = compute_weekly(conn, parse_week(WEEK), settings=settings, now=NOW)
    a = report.availability
    assert a is not None
    fleet = a["fleet"]
    # n1: drained 24th 02:00 .. 25th 08:00, its GPU failing inside it (30 h, one outage);
    # n2: GPU failed on the 28th, never replaced, drained on the 29th, out at week end (48 h);
    # n3: drained 26th 01:00 .. 05:00 (4 h).
    assert fleet["node_hours"] == 3 * 168
    assert fleet["unplanned_down_h"] == pytest.approx(30 + 48 + 4)
    assert fleet["infrastructure_availability"] == pytest.approx((504 - 82) / 504)
    assert fleet["failures"] == 3 and fleet["repairs"] == 2
    assert fleet["mttr_h"] == pytest.approx((30 + 4) / 2)
    assert fleet["mtbf_h"] == pytest.approx((504 - 82) / 3)
    assert fleet["planned_known"] is True and fleet["planned_down_h"] == 0  # no window
    assert a["by"]["sku"]["A100"]["unplanned_down_h"] == pytest.approx(4)
    assert a["by"]["rack"]["r1"]["failures"] == 2
    assert a["slow_nodes"] == {"slow_nodes": 2, "share": pytest.approx(2 / 3)}
    assert a["jobs"]["success_rate"] is None  # no job reported an end: none, not 0
    assert a["sla"]["recovery_basis"] == "node_back"
    assert a["sla"]["recovery_met"] is False  # 17 h mean > 15 min
    html = render_html(report)
    assert "Availability and jobs" in html
    assert "83.73 %" in html  # (504 - 82) / 504
