"""This process's fleet assessment, rebuilt on the assessment timer and kept for its requests.

Every process (leader or not) keeps its own :class:`FleetAssessment` in memory, so every replica
answers ``/v1/risk``, the fleet page and ``/metrics`` from a snapshot at most one interval old.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection

from fleetwatch.config import ServerSettings
from fleetwatch.models.registry import RiskBundle
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.rules.xid_catalog import XidCatalog
from fleetwatch.server.db.session import Database
from fleetwatch.server.jobs.isolation import ItemGuard
from fleetwatch.server.judge.assessment import FleetAssessment, assess_fleet
from fleetwatch.server.judge.judging import FleetJudge
from fleetwatch.server.repo.models import latest_ok_model

__all__ = ["Assessor"]


class Assessor:
    """Builds this worker's :class:`FleetAssessment` and keeps the newest one."""

    def __init__(
        self,
        db: Database,
        settings: ServerSettings,
        catalog: XidCatalog,
        thresholds: HealthThresholds,
        guard: ItemGuard | None = None,
    ) -> None:
        self.db = db
        self.settings = settings
        self.judge = FleetJudge(
            catalog=catalog,
            thresholds=thresholds,
            unreachable_after_intervals=settings.unreachable_after_intervals,
            guard=guard,
        )
        self.latest: FleetAssessment | None = None
        self._bundle: tuple[int, RiskBundle] | None = None
        self._lock = threading.Lock()

    def _model(self, conn: Connection) -> tuple[int, RiskBundle] | None:
        stored = latest_ok_model(conn)
        if stored is None:
            return None
        if self._bundle is None or self._bundle[0] != stored.version:
            self._bundle = (stored.version, RiskBundle.from_params(stored.params))
        return self._bundle

    def run_once(self, now: datetime | None = None) -> FleetAssessment:
        now = now or datetime.now(UTC)
        with self._lock, self.db.read() as conn:
            model = self._model(conn)
            version, bundle = model if model is not None else (None, None)
            snapshot = assess_fleet(
                conn,
                self.judge,
                now=now,
                bundle=bundle,
                model_version=version,
                feature_window=timedelta(days=self.settings.model_window_days),
            )
        self.latest = snapshot
        return snapshot

    def current(self) -> FleetAssessment:
        """The newest snapshot, building one now if the loop has not run yet."""
        return self.latest if self.latest is not None else self.run_once()
