"""The little SVG every chart shares: escaping, number formatting and the document wrapper."""

from __future__ import annotations

from html import escape

__all__ = ["attr", "document", "num", "text"]

FONT = 'font-family="system-ui, sans-serif" font-size="11"'


def attr(value: object) -> str:
    """``value`` safe inside a double-quoted attribute."""
    return escape(str(value), quote=True)


def num(value: float) -> str:
    """A coordinate with at most one decimal, without a trailing ``.0`` (smaller documents)."""
    rounded = round(float(value), 1)
    return str(int(rounded)) if rounded == int(rounded) else str(rounded)


def text(x: float, y: float, body: str, *, anchor: str = "start", fill: str = "#1d2330") -> str:
    return (
        f'<text x="{num(x)}" y="{num(y)}" text-anchor="{anchor}" fill="{fill}">'
        f"{escape(body, quote=False)}</text>"
    )


def document(width: float, height: float, label: str, body: list[str], *, kind: str) -> str:
    """The ``<svg>`` element: sized in user units, scaled down by the page when narrower."""
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart {kind}" role="img" '
        f'viewBox="0 0 {num(width)} {num(height)}" width="{num(width)}" height="{num(height)}" '
        f'aria-label="{attr(label)}" {FONT}>' + "".join(body) + "</svg>"
    )
