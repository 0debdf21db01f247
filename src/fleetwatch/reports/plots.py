"""The report's figures as base64 PNG data URIs (matplotlib, Agg: no display needed)."""

from __future__ import annotations

import base64
import io
from typing import Any

__all__ = ["bar_png", "survival_png"]


def _figure() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure(figsize=(6.4, 3.2), dpi=90, layout="constrained")


def _uri(fig: Any) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def survival_png(survival: dict[str, Any]) -> str | None:
    """Kaplan–Meier curves, one step line per SKU; None without lifetimes."""
    if not survival:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    for sku, part in survival.items():
        curve = part["curve"]
        ax.step(curve["days"], curve["survival"], where="post", label=f"{sku} (n={part['n']})")
    ax.set_xlabel("days in service")
    ax.set_ylabel("survival S(t)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _uri(fig)


def bar_png(counts: dict[str, int | float], title: str) -> str | None:
    """Horizontal bars, largest on top; None when there is nothing to draw."""
    if not counts:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    labels = list(counts)[::-1]
    ax.barh(labels, [counts[k] for k in labels], color="#3b6ea5")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return _uri(fig)
