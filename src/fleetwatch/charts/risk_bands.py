"""How many GPUs at each P(failure) band: out by rule, then the model's bands, highest first,
then the GPUs no model scored. Bar length is logarithmic in the count (a fleet is mostly in the
lowest band; linear bars would hide the few that matter); the count is written beside each."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fleetwatch.charts.svg import attr, document, num, text

__all__ = ["EDGES", "RiskBand", "risk_bands", "risk_bands_svg"]

# Lower edges of the model's bands, highest first: [0.5, 1], [0.25, 0.5), ... [0, 0.01).
EDGES: tuple[float, ...] = (0.5, 0.25, 0.1, 0.05, 0.01, 0.0)

_WIDTH = 600
_LABEL_W = 110
_BAR_W = 400
_LINE = 20


@dataclass(frozen=True)
class RiskBand:
    key: str  # "out", "model-0.5", ..., "none"
    label: str
    count: int
    fill: str


def _band_label(i: int) -> str:
    lo = EDGES[i]
    hi = 1.0 if i == 0 else EDGES[i - 1]
    return f"{lo:.0%} – {hi:.0%}" if lo else f"< {hi:.0%}"


def risk_bands(model_probabilities: Iterable[float | None], *, out_by_rule: int) -> list[RiskBand]:
    """Bands of the GPUs in service: each model probability in its band, None as unscored;
    ``out_by_rule`` GPUs (a verdict took them out) come first."""
    counts = [0] * len(EDGES)
    unscored = 0
    for p in model_probabilities:
        if p is None:
            unscored += 1
            continue
        counts[next(i for i, lo in enumerate(EDGES) if p >= lo)] += 1
    shades = ("#f04438", "#f79009", "#fdb022", "#fec84b", "#a6f4c5", "#32d583")
    bands = [RiskBand("out", "out by rule", out_by_rule, "#912018")]
    bands += [
        RiskBand(f"model-{EDGES[i]:g}", _band_label(i), counts[i], shades[i])
        for i in range(len(EDGES))
    ]
    bands.append(RiskBand("none", "no model score", unscored, "#c4c9d2"))
    return bands


def risk_bands_svg(bands: Sequence[RiskBand]) -> str:
    top = max((b.count for b in bands), default=0)
    marks = []
    for i, band in enumerate(bands):
        y = i * _LINE
        width = _BAR_W * math.log10(1 + band.count) / math.log10(1 + top) if top else 0.0
        marks.append(text(_LABEL_W - 8, y + 13, band.label, anchor="end"))
        marks.append(
            f'<rect x="{_LABEL_W}" y="{y + 3}" width="{num(max(width, 1.0 if band.count else 0))}" '
            f'height="14" fill="{band.fill}" class="band" data-band="{band.key}" '
            f'data-count="{band.count}"><title>{attr(band.label)}: {band.count} GPUs</title></rect>'
        )
        marks.append(text(_LABEL_W + width + 6, y + 14, f"{band.count:,}"))
    total = sum(b.count for b in bands)
    what = f"P(failure) bands of {total} GPUs (bar length: log scale)"
    return document(_WIDTH, len(bands) * _LINE + 4, what, marks, kind="risk-bands")
