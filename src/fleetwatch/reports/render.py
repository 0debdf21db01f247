"""The report as an HTML page (jinja2, plots embedded) and as a PDF (weasyprint)."""

from __future__ import annotations

from typing import Any

from fleetwatch.reports.advice import section_advice
from fleetwatch.reports.components import COMPONENT_NAMES
from fleetwatch.reports.plots import bar_png, budget_png, survival_png
from fleetwatch.reports.week_pictures import pictures
from fleetwatch.reports.weekly import WeeklyReport

__all__ = ["render_html", "render_pdf"]


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _pct(value: Any) -> str:
    return "–" if value is None else f"{100.0 * value:.2f} %"


def render_html(report: WeeklyReport) -> str:
    """A self-contained page: no external assets, so it renders offline and in a PDF."""
    from jinja2 import Environment, PackageLoader, select_autoescape

    env = Environment(
        loader=PackageLoader("fleetwatch.reports", "templates"),
        autoescape=select_autoescape(["html", "j2"]),
    )
    env.filters["fmt"] = _fmt
    env.filters["pct"] = _pct
    causes = {**report.interruptions["failure_component"]}
    plots = {
        "survival": survival_png(report.survival),
        "xid": bar_png(report.interruptions["xid_category"], "Xid events by category"),
        "causes": bar_png(causes, "GPU failures by component"),
        "budget": budget_png(report.drain_budget),
    }
    plots |= pictures(
        report.fleet_states, report.days, sla_target=report.sla.get("availability_target")
    )
    template = env.get_template("weekly.html.j2")
    return template.render(
        r=report, plots=plots, component_names=COMPONENT_NAMES, todo=section_advice(report)
    )


def render_pdf(report: WeeklyReport, html: str | None = None) -> bytes:
    """The HTML page printed to PDF by weasyprint (needs the ``report`` extra)."""
    from weasyprint import HTML

    pdf: bytes = HTML(string=html if html is not None else render_html(report)).write_pdf()
    return pdf
