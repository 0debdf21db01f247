"""The fleet's availability figures over the last 7 days on /metrics (default page).

A handful of fleet-level families, so the page stays small at any fleet size (breakdowns by
label are on ``GET /v1/availability``)::

    fleetwatch_fleet_availability_ratio{kind="infrastructure"|"workload"}
    fleetwatch_fleet_downtime_hours{kind="planned"|"unplanned"}
    fleetwatch_fleet_mtbf_hours                  fleetwatch_fleet_mttr_hours
    fleetwatch_fleet_slow_nodes_ratio
    fleetwatch_jobs_success_ratio                fleetwatch_jobs_interrupted_by_hardware
    fleetwatch_goodput_ratio                     fleetwatch_goodput_lost_gpu_hours{cause}
    fleetwatch_time_to_recover_minutes{to="node_back"|"job_resumed"}   (mean)
    fleetwatch_sla_met{target="availability"|"recovery"}              (1 met, 0 missed)

A figure with nothing to compute it from has no sample. The figures are computed at most once
per ``REFRESH_S`` per process (reading a week of outages and jobs on every scrape would cost
the database more than the figures are worth), so processes may differ by up to that much.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from fleetwatch.config import ServerSettings
from fleetwatch.reports.availability import compute_availability
from fleetwatch.server.db.session import Database
from fleetwatch.server.metrics.text import family_header
from fleetwatch.server.repo.availability_rows import load_period, sla_targets

__all__ = ["PERIOD", "REFRESH_S", "AvailabilityExposition", "availability_text"]

logger = logging.getLogger(__name__)

PERIOD = timedelta(days=7)
REFRESH_S = 300.0


def _family(name: str, help_text: str, samples: list[tuple[str, Any]]) -> str:
    lines = [f"{name}{labels} {float(v):.6g}\n" for labels, v in samples if v is not None]
    return family_header(name, "gauge", help_text) + "".join(lines) if lines else ""


def availability_text(figures: dict[str, Any]) -> str:
    """The families of one :func:`compute_availability` result."""
    f, jobs, gp = figures["fleet"], figures["jobs"], figures["goodput"]
    ttr, sla = figures["time_to_recover"], figures["sla"]

    def met(value: bool | None) -> int | None:
        return None if value is None else int(value)

    return "".join(
        [
            _family(
                "fleetwatch_fleet_availability_ratio",
                "Node-hours up over node-hours, last 7 days (workload: planned excluded).",
                [
                    ('{kind="infrastructure"}', f["infrastructure_availability"]),
                    ('{kind="workload"}', f["workload_availability"]),
                ],
            ),
            _family(
                "fleetwatch_fleet_downtime_hours",
                "Node-hours down, last 7 days.",
                [
                    ('{kind="planned"}', f["planned_down_h"]),
                    ('{kind="unplanned"}', f["unplanned_down_h"]),
                ],
            ),
            _family(
                "fleetwatch_fleet_mtbf_hours",
                "Up node-hours per outage, last 7 days.",
                [("", f["mtbf_h"])],
            ),
            _family(
                "fleetwatch_fleet_mttr_hours",
                "Mean outage length, last 7 days.",
                [("", f["mttr_h"])],
            ),
            _family(
                "fleetwatch_fleet_slow_nodes_ratio",
                "Nodes with a hardware straggler verdict over all nodes, last 7 days.",
                [("", figures["slow_nodes"]["share"])],
            ),
            _family(
                "fleetwatch_jobs_success_ratio",
                "Completed over completed + failed jobs, last 7 days.",
                [("", jobs["success_rate"])],
            ),
            _family(
                "fleetwatch_jobs_interrupted_by_hardware",
                "Failed jobs attributed to a node failure, last 7 days.",
                [("", jobs["interrupted_by_hardware"])],
            ),
            _family(
                "fleetwatch_goodput_ratio",
                "Productive over scheduled job GPU-hours.",
                [("", gp["goodput_ratio"])],
            ),
            _family(
                "fleetwatch_goodput_lost_gpu_hours",
                "Job GPU-hours lost, by cause.",
                [
                    ('{cause="checkpoint"}', gp["checkpoint_gpu_h"]),
                    ('{cause="restart"}', gp["restart_gpu_h"]),
                    ('{cause="straggler"}', gp["straggler_gpu_h"]),
                ],
            ),
            _family(
                "fleetwatch_time_to_recover_minutes",
                "Mean time to recover, last 7 days.",
                [
                    ('{to="node_back"}', ttr["node_back"]["mean_min"]),
                    ('{to="job_resumed"}', ttr["job_resumed"]["mean_min"]),
                ],
            ),
            _family(
                "fleetwatch_sla_met",
                "1 when the SLA target is met, 0 when missed.",
                [
                    ('{target="availability"}', met(sla["availability_met"])),
                    ('{target="recovery"}', met(sla["recovery_met"])),
                ],
            ),
        ]
    )


class AvailabilityExposition:
    """The families, recomputed at most every ``refresh_s``; one per app.

    Only the first :meth:`render` of a process waits for them (a second of the database and
    the interpreter at 12,500 nodes). Later, figures older than ``refresh_s`` are served once
    more while a thread of its own recomputes them, so no scrape waits for the week's rows;
    :meth:`refresh` computes them ahead of the first scrape (the page prefetch does)."""

    def __init__(
        self,
        db: Database,
        settings: ServerSettings,
        refresh_s: float = REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._db = db
        self._settings = settings
        self._refresh_s = refresh_s
        self._clock = clock
        self._computing = threading.Lock()  # one computation at a time
        self._starting = threading.Lock()  # never held while computing: a scrape never waits
        self._text: str | None = None
        self._at: float | None = None
        self._background: threading.Thread | None = None

    def render(self, now: datetime | None = None) -> str:
        text = self._text
        if text is None:
            return self.refresh(now)
        if self.is_stale():
            self._refresh_in_background()
        return text

    def is_stale(self) -> bool:
        at = self._at
        return at is None or self._clock() - at >= self._refresh_s

    def refresh(self, now: datetime | None = None) -> str:
        """The figures, computed now unless they are fresh."""
        with self._computing:
            if self._text is not None and not self.is_stale():
                return self._text
            until = now or datetime.now(UTC)
            with self._db.read() as conn:
                period = load_period(
                    conn, until - PERIOD, until, settings=self._settings, with_labels=False
                )
            figures = compute_availability(period, sla_targets(self._settings), by=())
            self._text = availability_text(figures)
            self._at = self._clock()
            return self._text

    def _refresh_in_background(self) -> None:
        with self._starting:
            running = self._background
            if running is not None and running.is_alive():
                return
            self._background = threading.Thread(
                target=self._refresh_logged, name="availability-refresh", daemon=True
            )
            self._background.start()

    def close(self, timeout_s: float = 30.0) -> None:
        """Wait for a background recomputation to end: it reads the database, whose engine the
        server disposes next (a read still running then would leave its connection open)."""
        with self._starting:
            running = self._background
        if running is not None:
            running.join(timeout_s)

    def _refresh_logged(self) -> None:
        try:
            self.refresh()
        except Exception:  # noqa: BLE001 - the next scrape tries again; the old figures stand
            logger.exception("recomputing the availability figures for /metrics failed")
