"""This process's fleet assessment, rebuilt on the assessment timer and kept for its requests.

Every process (leader or not) keeps its own :class:`FleetAssessment` in memory, so every replica
answers ``/v1/risk``, the fleet page and ``/metrics`` from a snapshot at most one interval old.
Where the leader shares its snapshots (PostgreSQL, :mod:`fleetwatch.server.judge.snapshot_sharing`)
the other processes :meth:`Assessor.adopt` the leader's instead of building their own.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from fleetwatch.config import ServerSettings
from fleetwatch.errors import InvalidInput
from fleetwatch.inventory import compile_location_pattern
from fleetwatch.models.registry import RiskBundle
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.rules.xid_catalog import XidCatalog
from fleetwatch.server.db.session import Database
from fleetwatch.server.judge.assessment import (
    FEATURES_SINCE,
    FleetAssessment,
    GpuAssessment,
    assess_fleet,
    assess_nodes,
)
from fleetwatch.server.judge.judging import FleetJudge
from fleetwatch.server.repo.models import latest_ok_model, ok_model
from fleetwatch.server.runtime.isolation import ItemGuard
from fleetwatch.server.runtime.state import load_state
from fleetwatch.server.upkeep.rollups import fleet_window_features, floor_hour

__all__ = ["Assessor"]


logger = logging.getLogger(__name__)


def _scoring_pattern(pattern: str | None) -> re.Pattern[str] | None:
    """The refit reads each lifetime's location by ``location_pattern``: so does the scoring. A
    pattern that is no regular expression fails every refit, which stores the error in its model
    version; the scoring then reads no location (no model fitted on one exists) and says why."""
    try:
        return compile_location_pattern(pattern)
    except InvalidInput as exc:
        logger.error("location_pattern not used for scoring: %s", exc)
        return None


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
        self.location_pattern = _scoring_pattern(settings.location_pattern)
        self.latest: FleetAssessment | None = None
        self._bundle: tuple[int, RiskBundle] | None = None
        self._features: tuple[tuple[Any, ...], dict[str, dict[str, float]]] | None = None
        self._fleet_features: Mapping[str, dict[str, float]] = {}  # the last full pass's
        self._lock = threading.Lock()  # one whole-fleet pass at a time
        self._targeted = threading.Lock()  # one targeted pass at a time
        self._publish = threading.Lock()  # latest, and the patches of a whole-fleet pass
        self._fleet_since: datetime | None = None  # a whole-fleet pass's now, while it runs
        self._patches: list[tuple[datetime, frozenset[str], list[GpuAssessment]]] = []
        # The leader's stored snapshot, where shared: tried before a pass of this process's own
        # when it has none yet (True: one was adopted). Set by the background jobs.
        self.adopter: Callable[[], bool] | None = None
        # Called before a reader is served: adopts the leader's newer stored snapshot first,
        # where this process adopts only while read (see snapshot_sharing). Set by the jobs.
        self.catch_up: Callable[[], None] | None = None
        # True while this process adopts only when read and nobody reads it (set by the jobs):
        # an urgent pass then keeps its nodes' judgement for the snapshot adopted later rather
        # than decoding the leader's (a second of CPU and about 200 MiB at 100,000 GPUs) for
        # no one. Node -> (when judged, its GPUs).
        self.defers: Callable[[], bool] | None = None
        self._early: dict[str, tuple[datetime, list[GpuAssessment]]] = {}
        self._adopted_at: datetime | None = None  # whole_at of the newest snapshot adopted

    def _model(self, conn: Connection) -> tuple[int, RiskBundle] | None:
        stored = latest_ok_model(conn)
        if stored is None:
            return None
        if self._bundle is None or self._bundle[0] != stored.version:
            self._bundle = (stored.version, RiskBundle.from_params(stored.params))
        return self._bundle

    def bundle_of(self, conn: Connection, version: int) -> RiskBundle | None:
        """Fitted model ``version`` (an adopted snapshot's), None when it is not stored."""
        if self._bundle is not None and self._bundle[0] == version:
            return self._bundle[1]
        stored = ok_model(conn, version)
        if stored is None:
            return None
        self._bundle = (version, RiskBundle.from_params(stored.params))
        return self._bundle[1]

    def _covariates(self, conn: Connection, now: datetime) -> dict[str, dict[str, float]] | None:
        """The window covariates, recomputed only when the rollups changed: gpu_hourly is
        written by rollup passes only, and each counts itself in ``leader_state`` (a query over
        a week of every GPU's rollups costs seconds at fleet scale; rollups come every few
        minutes, assessments every few seconds). None when no pass was counted yet."""
        state = load_state(conn, "rollups")
        if state is None or "passes" not in state:
            return None
        window = timedelta(days=self.settings.model_window_days)
        key = (state["passes"], floor_hour(now - FEATURES_SINCE), window)
        if self._features is None or self._features[0] != key:
            found = fleet_window_features(conn, window=window, since=now - FEATURES_SINCE)
            self._features = (key, found)
        return self._features[1]

    def run_once(self, now: datetime | None = None) -> FleetAssessment:
        """The whole-fleet pass."""
        with self._lock:
            return self._run_fleet(now or datetime.now(UTC))

    def _run_fleet(self, now: datetime) -> FleetAssessment:
        with self._publish:
            self._fleet_since, self._patches = now, []
        with self.db.read() as conn:
            model = self._model(conn)
            version, bundle = model if model is not None else (None, None)
            window = timedelta(days=self.settings.model_window_days)
            features = self._covariates(conn, now)
            if features is None:
                features = fleet_window_features(conn, window=window, since=now - FEATURES_SINCE)
            snapshot = assess_fleet(
                conn,
                self.judge,
                now=now,
                bundle=bundle,
                model_version=version,
                feature_window=window,
                features=features,
                location_pattern=self.location_pattern,
            )
        with self._publish:
            # Targeted passes that ran meanwhile judged their nodes after this pass began.
            for at, names, fresh in self._patches:
                snapshot = snapshot.patched(at, names, fresh)
            self._fleet_since, self._patches = None, []
            # A pass of this process's own (no fresh snapshot of the leader's when it began)
            # never replaces a newer one adopted meanwhile.
            if self._adopted_at is None or self._adopted_at <= now:
                self._fleet_features = features
                self.latest = snapshot
        return snapshot

    def adopt(self, snapshot: FleetAssessment) -> bool:
        """Serve ``snapshot`` (the leader's, decoded) from now on, unless this process holds a
        newer whole-fleet one. Nodes this process judged later than ``snapshot`` did (its own
        urgent lane) keep this process's judgement. False when it was not adopted."""
        with self._publish:
            latest = self.latest
            if latest is not None and latest.whole_at >= snapshot.whole_at:
                return False
            features = {gpu.uuid: gpu.features for gpu in snapshot.gpus}
            early, self._early = self._early, {}
            judged = {  # judged here before any snapshot was: the snapshot's covariates
                node: (at, [replace(g, features=features.get(g.uuid, g.features)) for g in own])
                for node, (at, own) in early.items()
            }
            if latest is not None:  # this process's own urgent lane since its last snapshot
                newer = {
                    node: at
                    for node, at in latest.nodes_at.items()
                    if at > snapshot.judged_at(node)
                }
                kept: dict[str, list[GpuAssessment]] = {node: [] for node in newer}
                for gpu in latest.gpus if newer else ():
                    if gpu.node in newer:
                        kept[gpu.node].append(gpu)
                judged.update((node, (at, kept[node])) for node, at in newer.items())
            snapshot = _newer_kept(snapshot, judged)
            self._adopted_at = snapshot.whole_at
            self._fleet_features = features
            self.latest = snapshot
        return True

    def _judge_early(self, names: frozenset[str], now: datetime) -> FleetAssessment | None:
        """The targeted pass with no snapshot here yet (see ``defers``): the nodes' judgement is
        kept for the snapshot adopted later; the snapshot if one was adopted meanwhile."""
        with self.db.read() as conn:
            fresh = assess_nodes(
                conn,
                self.judge,
                names,
                now=now,
                features={},
                location_pattern=self.location_pattern,
            )
        with self._publish:
            if self.latest is not None:  # adopted meanwhile: patch it as usual
                self.latest = self.latest.patched(now, names, fresh)
                return self.latest
            for node in names:
                self._early[node] = (now, [g for g in fresh if g.node == node])
        return None

    def run_nodes(
        self, names: Collection[str], now: datetime | None = None
    ) -> FleetAssessment | None:
        """The targeted pass: judge the GPUs of the nodes ``names`` alone and publish the newest
        snapshot with theirs replaced (see :meth:`FleetAssessment.patched`). It does not wait
        for a whole-fleet pass in progress (that pass patches its own snapshot with this one's
        nodes when it ends); without any snapshot yet, it is a whole-fleet pass. Covariates
        are the last whole-fleet pass's (they move with the hourly rollups, and only the risk
        reads them, never a rule). None when the nodes' judgement was kept for a snapshot
        not adopted yet (see ``defers``)."""
        with self._targeted:
            if self.latest is None and self.defers is not None and self.defers():
                return self._judge_early(frozenset(names), now or datetime.now(UTC))
            if self.latest is None and self.adopter is not None:
                self.adopter()
            if self.latest is None:
                with self._lock:
                    if self.latest is None:
                        return self._run_fleet(now or datetime.now(UTC))
            now = now or datetime.now(UTC)
            names = frozenset(names)
            with self.db.read() as conn:
                fresh = assess_nodes(
                    conn,
                    self.judge,
                    names,
                    now=now,
                    features=self._fleet_features,
                    location_pattern=self.location_pattern,
                )
            with self._publish:
                assert self.latest is not None
                snapshot = self.latest.patched(now, names, fresh)
                self.latest = snapshot
                if self._fleet_since is not None and now > self._fleet_since:
                    self._patches.append((now, names, fresh))
        return snapshot

    def newest(self) -> FleetAssessment | None:
        """The snapshot to serve a reader now, without judging (None before the first)."""
        if self.catch_up is not None:
            self.catch_up()
        return self.latest

    def current(self) -> FleetAssessment:
        """The newest snapshot: the leader's stored one or one built now, if the loop has not
        run yet."""
        if self.newest() is None and self.adopter is not None:
            self.adopter()
        return self.latest if self.latest is not None else self.run_once()


def _newer_kept(
    snapshot: FleetAssessment, judged: Mapping[str, tuple[datetime, list[GpuAssessment]]]
) -> FleetAssessment:
    """``snapshot`` with each node of ``judged`` (node -> when judged, its GPUs) whose
    judgement is newer than the snapshot's patched in, oldest first."""
    newer = [
        (at, node, gpus) for node, (at, gpus) in judged.items() if at > snapshot.judged_at(node)
    ]
    for at, node, gpus in sorted(newer, key=lambda item: item[0]):
        snapshot = snapshot.patched(at, [node], gpus)
    return snapshot
