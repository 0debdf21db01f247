"""The risk distribution: each probability in its band, edges inclusive below, bars log-long."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from fleetwatch.charts.risk_bands import risk_bands, risk_bands_svg

SVG = "{http://www.w3.org/2000/svg}"


def test_risk_bands_counts_each_probability_in_its_band() -> None:
    probabilities = [0.0, 0.0099, 0.01, 0.049, 0.05, 0.1, 0.2499, 0.25, 0.5, 1.0, None, None]
    bands = risk_bands(probabilities, out_by_rule=3)
    assert [(b.key, b.label, b.count) for b in bands] == [
        ("out", "out by rule", 3),
        ("model-0.5", "50% – 100%", 2),
        ("model-0.25", "25% – 50%", 1),
        ("model-0.1", "10% – 25%", 2),
        ("model-0.05", "5% – 10%", 1),
        ("model-0.01", "1% – 5%", 2),
        ("model-0", "< 1%", 2),
        ("none", "no model score", 2),
    ]


def test_risk_bands_svg_draws_log_length_bars_with_counts() -> None:
    bands = risk_bands([0.001] * 999 + [0.6], out_by_rule=0)
    root = ET.fromstring(risk_bands_svg(bands))
    bars = {r.get("data-band"): r for r in root.findall(f"{SVG}rect")}
    assert bars["model-0"].get("width") == "400"  # the largest band: the full length
    assert bars["model-0.5"].get("width") == "40.1"  # log10(2) / log10(1000) of it
    assert bars["out"].get("width") == "0" and bars["out"].get("data-count") == "0"
    assert bars["model-0"].findtext(f"{SVG}title") == "< 1%: 999 GPUs"
    assert "999" in [t.text for t in root.iter(f"{SVG}text")]
    assert root.get("aria-label") == "P(failure) bands of 1000 GPUs (bar length: log scale)"
