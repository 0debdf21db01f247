"""The fleet's last days: failures, drains and returns per day (bars), availability per day
(a line). One :class:`DayFigures` per UTC day, oldest first."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date

from fleetwatch.charts.svg import document, num, text

__all__ = ["SERIES", "DayFigures", "availability_svg", "events_svg"]

# (field, words, fill)
SERIES: tuple[tuple[str, str, str], ...] = (
    ("failures", "GPU failures", "#d92d20"),
    ("drains", "drains", "#7a5af8"),
    ("returns", "returns", "#32d583"),
)

_WIDTH = 1200
_HEIGHT = 180
_LEFT, _RIGHT, _TOP, _BOTTOM = 48, 12, 24, 22


@dataclass(frozen=True)
class DayFigures:
    day: date
    failures: int = 0
    drains: int = 0
    returns: int = 0
    availability: float | None = None  # workload availability, 0..1; None: no node exposed


def _nice_max(value: float) -> int:
    """The smallest of 1, 2, 5 x 10^k at least ``value`` (an axis that ends on a round count)."""
    if value <= 1:
        return 1
    power = 10 ** math.floor(math.log10(value))
    return next(int(m * power) for m in (1, 2, 5, 10) if m * power >= value)


def _x_axis(days: Sequence[DayFigures], slot: float, base: float) -> list[str]:
    marks = [
        f'<line x1="{_LEFT}" y1="{num(base)}" x2="{_WIDTH - _RIGHT}" y2="{num(base)}" '
        f'stroke="#98a2b3"/>'
    ]
    for i, d in enumerate(days):
        if i % 7 == 0 or i == len(days) - 1:
            marks.append(
                text(_LEFT + (i + 0.5) * slot, base + 15, d.day.strftime("%m-%d"), anchor="middle")
            )
    return marks


def events_svg(days: Sequence[DayFigures]) -> str:
    """Grouped bars, one group a day, one bar a series; a day's zero counts draw nothing."""
    plot_h = _HEIGHT - _TOP - _BOTTOM
    base = _TOP + plot_h
    slot = (_WIDTH - _LEFT - _RIGHT) / max(len(days), 1)
    bar = slot / (len(SERIES) + 1)
    top = _nice_max(max((getattr(d, f) for d in days for f, _, _ in SERIES), default=0))
    marks = [
        text(_LEFT - 6, _TOP + 4, str(top), anchor="end"),
        text(_LEFT - 6, base, "0", anchor="end"),
    ]
    marks += _x_axis(days, slot, base)
    for i, d in enumerate(days):
        for j, (field, words, fill) in enumerate(SERIES):
            value = getattr(d, field)
            if not value:
                continue
            h = plot_h * value / top
            x = _LEFT + i * slot + (j + 0.5) * bar
            marks.append(
                f'<rect x="{num(x)}" y="{num(base - h)}" width="{num(bar)}" height="{num(h)}" '
                f'fill="{fill}" class="bar" data-series="{field}" data-day="{d.day.isoformat()}" '
                f'data-value="{value}"><title>{d.day.isoformat()}: {value} {words}</title></rect>'
            )
    x = _LEFT
    for field, words, fill in SERIES:
        total = sum(getattr(d, field) for d in days)
        label = f"{words}: {total}"
        marks.append(
            f'<g class="legend" data-series="{field}" data-total="{total}"><rect x="{x}" y="4" '
            f'width="10" height="10" fill="{fill}"/>{text(x + 14, 13, label)}</g>'
        )
        x += 14 + 7 * len(label) + 16
    what = f"failures, drains and returns per day over {len(days)} days"
    return document(_WIDTH, _HEIGHT, what, marks, kind="trend-events")


def availability_svg(days: Sequence[DayFigures], *, target: float | None = None) -> str:
    """Availability per day as a line with a dot a day (days without exposure are gaps); the
    axis starts at the lowest 10 % step below the lowest day (and below ``target``)."""
    values = [d.availability for d in days if d.availability is not None]
    floor_of = min([*values, *([target] if target is not None else []), 1.0])
    low = min(0.9, math.floor(floor_of * 10) / 10)
    plot_h = _HEIGHT - _TOP - _BOTTOM
    base = _TOP + plot_h
    slot = (_WIDTH - _LEFT - _RIGHT) / max(len(days), 1)

    def y_of(value: float) -> float:
        return base - plot_h * (value - low) / (1.0 - low)

    marks = [
        text(_LEFT - 6, _TOP + 4, "100%", anchor="end"),
        text(_LEFT - 6, base, f"{low:.0%}", anchor="end"),
    ]
    marks += _x_axis(days, slot, base)
    if target is not None:
        yt = y_of(target)
        marks.append(
            f'<line x1="{_LEFT}" y1="{num(yt)}" x2="{_WIDTH - _RIGHT}" y2="{num(yt)}" '
            f'stroke="#b54708" stroke-dasharray="4 3" class="target" data-value="{target}"/>'
        )
        marks.append(
            text(_WIDTH - _RIGHT, yt - 3, f"target {target:.2%}", anchor="end", fill="#b54708")
        )
    segment: list[str] = []
    segments: list[list[str]] = [segment]
    dots = []
    for i, d in enumerate(days):
        if d.availability is None:
            segment = []
            segments.append(segment)
            continue
        x, y = _LEFT + (i + 0.5) * slot, y_of(d.availability)
        segment.append(f"{num(x)},{num(y)}")
        dots.append(
            f'<circle cx="{num(x)}" cy="{num(y)}" r="3" fill="#2e90fa" class="day" '
            f'data-day="{d.day.isoformat()}" data-value="{d.availability:.6f}">'
            f"<title>{d.day.isoformat()}: {d.availability:.3%} available</title></circle>"
        )
    for points in segments:
        if len(points) > 1:
            marks.append(
                f'<polyline points="{" ".join(points)}" fill="none" stroke="#2e90fa" '
                'stroke-width="2"/>'
            )
    marks += dots
    mean = sum(values) / len(values) if values else None
    label = (
        f"availability per day (mean {mean:.3%})" if mean is not None else "availability: no node"
    )
    marks.append(text(_LEFT, 13, label))
    return document(_WIDTH, _HEIGHT, label, marks, kind="trend-availability")
