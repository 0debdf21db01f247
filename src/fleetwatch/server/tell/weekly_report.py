"""Weekly delivery: once per week, after Monday 00:00 UTC + ``report_delay_h``, last week's JSON
summary goes to the webhook outbox under the key ``weekly:<week>`` (the outbox dedupes on it).

Delivery goes through ``fleetwatch.server.tell.outbox.enqueue_report`` (to subscriptions whose
filters say ``weekly_report: true``); tests pass their own ``enqueue``. The report is built only
when a subscriber is still waiting for that week (a restart does not rebuild a sent report, and
a fleet without report subscribers never builds one).

Who is still waiting is read from the outbox at every tick (a count), never remembered: a
subscription added later in the week gets that week's report at the next tick, whichever process
leads and since when.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from fleetwatch.config import ServerSettings
from fleetwatch.reports.weeks import IsoWeek
from fleetwatch.rules.xid_catalog import XidCatalog
from fleetwatch.server.db.session import Database
from fleetwatch.server.repo.report_rows import compute_weekly
from fleetwatch.server.runtime.isolation import ItemGuard
from fleetwatch.server.tell.outbox import enqueue_report, report_recipients_waiting

__all__ = ["WeeklyReportJob", "summary"]

logger = logging.getLogger(__name__)

Enqueue = Callable[..., int]
Waiting = Callable[..., int]


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """The webhook payload: everything but the survival curves' points."""
    survival = {
        sku: {k: v for k, v in part.items() if k != "curve"}
        for sku, part in report["survival"].items()
    }
    return {"kind": "weekly_report", **report, "survival": survival}


class WeeklyReportJob:
    """Call it periodically; it queues each completed week's report once per subscription (the
    outbox key), as soon as a subscription is waiting for it."""

    def __init__(
        self,
        db: Database,
        settings: ServerSettings,
        catalog: XidCatalog,
        enqueue: Enqueue | None = None,
        waiting: Waiting | None = None,
        guard: ItemGuard | None = None,
    ) -> None:
        self.db = db
        self.settings = settings
        self.catalog = catalog
        self.enqueue: Enqueue = enqueue or functools.partial(
            enqueue_report, guard=guard or ItemGuard("weekly_report")
        )
        self.waiting: Waiting = waiting or report_recipients_waiting

    def due(self, now: datetime) -> IsoWeek:
        return IsoWeek.last_complete(now, timedelta(hours=self.settings.report_delay_h))

    def __call__(self, now: datetime | None = None) -> str | None:
        """The week whose report was queued now; None when no subscription waits for it."""
        now = now or datetime.now(UTC)
        week = self.due(now)
        with self.db.read() as conn:
            waiting = self.waiting(conn, key=f"weekly:{week}")
        if not waiting:
            return None
        self.deliver(week, now)
        return str(week)

    def deliver(self, week: IsoWeek, now: datetime) -> int:
        """Build ``week``'s report and hand its summary to the outbox (idempotent by key)."""
        with self.db.read() as conn:
            report = compute_weekly(
                conn, week, settings=self.settings, catalog=self.catalog, now=now
            )
        with self.db.write() as conn:
            queued = self.enqueue(
                conn, key=f"weekly:{week}", payload=summary(report.to_dict()), now=now
            )
        logger.info("weekly report %s queued for %d subscriptions", week, queued)
        return queued
