"""The trend charts' SVG: a bar per non-zero count at its height, availability dots at their
place, gaps for days without exposure."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from datetime import date, timedelta

from fleetwatch.charts.trends import DayFigures, _nice_max, availability_svg, events_svg

SVG = "{http://www.w3.org/2000/svg}"
D0 = date(2026, 11, 1)


def test_nice_max_rounds_up_to_1_2_5() -> None:
    assert [_nice_max(v) for v in (0, 1, 2, 3, 7, 10, 11, 260)] == [1, 1, 2, 5, 10, 10, 20, 500]


def test_events_svg_draws_one_bar_per_nonzero_count_scaled_to_the_axis() -> None:
    days = [DayFigures(D0 + timedelta(days=i)) for i in range(30)]
    days[3] = DayFigures(D0 + timedelta(days=3), failures=2, drains=5, returns=0)
    days[29] = DayFigures(D0 + timedelta(days=29), returns=1)
    root = ET.fromstring(events_svg(days))
    bars = root.findall(f"{SVG}rect[@class='bar']")
    assert [(b.get("data-series"), b.get("data-day"), b.get("data-value")) for b in bars] == [
        ("failures", "2026-11-04", "2"),
        ("drains", "2026-11-04", "5"),
        ("returns", "2026-11-30", "1"),
    ]
    # axis top is 5; the plot is 180 - 24 - 22 = 134 high, its base at y=158
    assert [b.get("height") for b in bars] == ["53.6", "134", "26.8"]
    assert [b.get("y") for b in bars] == ["104.4", "24", "131.2"]
    slot = (1200 - 48 - 12) / 30
    assert bars[0].get("x") == str(round(48 + 3 * slot + 0.5 * slot / 4, 1))
    assert bars[0].findtext(f"{SVG}title") == "2026-11-04: 2 GPU failures"
    totals = {g.get("data-series"): g.get("data-total") for g in root.iter(f"{SVG}g")}
    assert totals == {"failures": "2", "drains": "5", "returns": "1"}


def test_events_svg_without_events_draws_no_bar() -> None:
    root = ET.fromstring(events_svg([DayFigures(D0), DayFigures(D0 + timedelta(days=1))]))
    assert root.findall(f"{SVG}rect[@class='bar']") == []


def test_availability_svg_places_dots_and_breaks_the_line_at_gaps() -> None:
    days = [
        DayFigures(D0, availability=1.0),
        DayFigures(D0 + timedelta(days=1), availability=0.95),
        DayFigures(D0 + timedelta(days=2)),
        DayFigures(D0 + timedelta(days=3), availability=0.9),
        DayFigures(D0 + timedelta(days=4), availability=0.85),
    ]
    root = ET.fromstring(availability_svg(days, target=0.99))
    dots = root.findall(f"{SVG}circle")
    assert [(c.get("data-day"), c.get("data-value")) for c in dots] == [
        ("2026-11-01", "1.000000"),
        ("2026-11-02", "0.950000"),
        ("2026-11-04", "0.900000"),
        ("2026-11-05", "0.850000"),
    ]
    # the axis runs 80 %..100 % (the lowest day is 85 %) over 134 units, base at 158
    assert [c.get("cy") for c in dots] == ["24", "57.5", "91", "124.5"]
    lines = root.findall(f"{SVG}polyline")
    assert len(lines) == 2  # the gap on 11-03 splits it
    target = root.find(f"{SVG}line[@class='target']")
    assert target is not None and target.get("y1") == "30.7"
    assert "mean 92.500%" in (root.get("aria-label") or "")


def test_availability_svg_without_any_day_says_so() -> None:
    root = ET.fromstring(availability_svg([DayFigures(D0)]))
    assert root.findall(f"{SVG}circle") == []
    assert root.get("aria-label") == "availability: no node"
