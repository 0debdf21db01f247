"""The weekly fleet report: reliability, cost, drains and model calibration for one ISO week.

``build_weekly`` computes a :class:`WeeklyReport` from a week's rows (:class:`WeekData`, which the
server reads from its database: ``fleetwatch.server.repo.report_rows``); ``render_html`` and
``render_pdf`` turn it into a page (the PDF needs the ``report`` extra).
"""

from __future__ import annotations

from fleetwatch.reports.rows import WeekData
from fleetwatch.reports.weekly import WeeklyReport, build_weekly
from fleetwatch.reports.weeks import IsoWeek, parse_week

__all__ = ["IsoWeek", "WeekData", "WeeklyReport", "build_weekly", "parse_week"]
