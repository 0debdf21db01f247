"""The rows one weekly report is computed from: the week's lifetimes, nodes, GPUs, evictions,
events, stragglers and samples, and the risk model in effect when it began.

The server reads them from its database (:mod:`fleetwatch.server.repo.report_rows`); the report
only computes from them. Rows are read by attribute (column names), as SQLAlchemy rows are.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from fleetwatch.reports.weeks import IsoWeek

__all__ = ["CONFIRM_WINDOW", "WeekData"]

# A drain is confirmed by a failure or a fatal event this close to it, either side.
CONFIRM_WINDOW = timedelta(hours=24)


@dataclass
class WeekData:
    week: IsoWeek
    # Any: a row's arity varies with the query that read it.
    lifetimes: list[Any]
    nodes: dict[int, Any]
    node_ids: dict[str, int]
    gpus: dict[str, Any]
    gpus_per_node: Counter[int]
    evictions: list[Any]
    events: list[Any]
    stragglers: list[Any]
    reporting_gpu_hours: int
    samples: list[Any] = field(default_factory=list)
    # The newest good risk model trained by the week's start (``version``, ``params``), if any.
    model: Any | None = None
    # GPU UUID -> telemetry covariates over the model's window before the week's start (from
    # the hourly rollups): what the drain curve scores with. Empty when not loaded.
    features: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def start(self) -> datetime:
        return self.week.start

    @property
    def end(self) -> datetime:
        return self.week.end
