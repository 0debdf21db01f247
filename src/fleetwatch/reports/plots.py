"""The report's figures as base64 PNG data URIs (matplotlib, Agg: no display needed)."""

from __future__ import annotations

import base64
import io
from typing import Any

__all__ = ["bar_png", "budget_png", "survival_png"]


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


def budget_png(budget: dict[str, Any] | None) -> str | None:
    """Precision and recall of draining the k riskiest GPUs (x: k, log scale), the three
    budgets of :data:`~fleetwatch.models.drain_budget.BUDGET_FRACTIONS` marked; None without a
    curve (:mod:`fleetwatch.reports.drain_curve`)."""
    if not budget or not budget.get("curve"):
        return None
    curve = budget["curve"]
    ks = [p["k"] for p in curve]
    nan = float("nan")
    fig = _figure()
    ax = fig.add_subplot()
    for key, label, style in (("precision", "precision", "o-"), ("recall", "recall", "s-")):
        values = [nan if p[key] is None else p[key] for p in curve]
        ax.plot(ks, values, style, markersize=3, label=label)
    for mark in budget.get("budgets", ()):
        ax.axvline(mark["k"], color="grey", linestyle=":", linewidth=1)
        ax.annotate(
            f"{100 * mark['fraction']:g} %",
            (mark["k"], 1.0),
            xytext=(2, -10),
            textcoords="offset points",
            fontsize=7,
            color="grey",
        )
    if len(set(ks)) > 1:
        ax.set_xscale("log")
    ax.set_xlabel("GPUs drained at the week's start (k)")
    ax.set_ylabel("share")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center right")
    return _uri(fig)
