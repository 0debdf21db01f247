"""The weekly fleet report: reliability, cost, drains and model calibration for one ISO week.

``compute_weekly`` builds a :class:`WeeklyReport` from the database; ``render_html`` and
``render_pdf`` turn it into a page (the PDF needs the ``report`` extra).
"""

from __future__ import annotations

from fleetwatch.reports.weekly import WeeklyReport, compute_weekly
from fleetwatch.reports.weeks import IsoWeek, parse_week

__all__ = ["IsoWeek", "WeeklyReport", "compute_weekly", "parse_week"]
