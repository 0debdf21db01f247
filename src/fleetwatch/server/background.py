"""Every background job of the server, in one list: what runs, how often, and where.

=============  ===============================  ========  =======================================
job            interval (setting)               runs on   also runs
=============  ===============================  ========  =======================================
assessment     ``assess_interval_s``            every     when a node is too many for the urgent
                                                process   lane, on a new leader; a process that
                                                          does not lead adopts the leader's
                                                          stored snapshot instead, when fresh
snapshot       ``snapshot_poll_s``              not the   (PostgreSQL) adopts the leader's newer
                                                leader    stored snapshot, if any, while this
                                                          process's is read (else on next read)
urgent         when woken (else hourly, idle)   every     when a fatal Xid, a lost GPU or an
                                                process   urgent host or port event arrives here
                                                          or (NOTIFY) on any replica: judges
                                                          those nodes alone (targeted pass)
rollups        ``rollup_interval_s``            leader
lifecycle      ``lifecycle_interval_s``         leader
retention      ``retention_interval_s``         leader
planner        ``planner_interval_s``           leader    woken by each assessment on the leader
                                                          (its timer restarts); for its nodes
                                                          after an urgent pass
notices        ``planner_interval_s``           leader    after each plan on the leader; for
                                                          its nodes after an urgent plan
stragglers     ``straggler_interval_s``         leader
alerts         ``alert_interval_s``             leader    woken by each assessment on the leader
                                                          (its timer restarts); for its nodes
                                                          after an urgent pass
weekly_report  every 10 minutes                 leader
webhooks       ``webhook_delivery_interval_s``  leader    when an alert is queued
refit          ``refit_interval_s`` (0: never)  leader    on ``POST /v1/models/refit``, there
=============  ===============================  ========  =======================================

With ``background_jobs`` off nothing runs; with ``--role api`` a process never leads. The urgent
lane (:mod:`fleetwatch.server.runtime.urgent`) patches the newest snapshot with the nodes of urgent
events and, on the leader, plans and alerts for those nodes (:meth:`EvictionPlanner.run_for`,
:meth:`Alerter.run_for`) at once, in a thread of its own, beside a whole-fleet pass in progress
(its plan waits for a whole-fleet plan in progress). Its passes are counted and timed as job
``urgent`` (``fleetwatch_background_pass_seconds``; a run that finds nothing, at the start or
once an hour, takes about 0 s). Every replica answers ``/v1/risk`` from a snapshot in its own
memory: on PostgreSQL the leader's, stored after each of its whole-fleet passes and adopted by
the others (:mod:`fleetwatch.server.judge.snapshot_sharing`), so that one process, not every one,
judges the whole fleet. The planner and the alerts of a new leader first wait for an assessment
of its own, as a standby's snapshot may predate what the old leader acted on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from prometheus_client import Counter, Histogram
from sqlalchemy import Engine

from fleetwatch.config import ServerSettings
from fleetwatch.rules.overrides import load_rules
from fleetwatch.server.act.notices import JobNotices
from fleetwatch.server.act.planner import EvictionPlanner
from fleetwatch.server.db.secret_box import SecretBox
from fleetwatch.server.db.session import Database
from fleetwatch.server.judge.assessment import FleetAssessment
from fleetwatch.server.judge.assessor import Assessor
from fleetwatch.server.judge.snapshot_sharing import SnapshotSharing
from fleetwatch.server.judge.straggler_detector import StragglerDetector
from fleetwatch.server.runtime.isolation import ItemGuard
from fleetwatch.server.runtime.leader import LeaderElector
from fleetwatch.server.runtime.metric_families import ServerMetrics
from fleetwatch.server.runtime.passes import give_way
from fleetwatch.server.runtime.precedence import Precedence
from fleetwatch.server.runtime.scheduler import Job, Scheduler, Waker
from fleetwatch.server.runtime.urgent import UrgentNodes
from fleetwatch.server.tell.alerting import Alerter
from fleetwatch.server.tell.outbox import OutboxWorker
from fleetwatch.server.tell.weekly_report import WeeklyReportJob
from fleetwatch.server.upkeep.lifecycle import run_lifecycle
from fleetwatch.server.upkeep.refit import Refitter
from fleetwatch.server.upkeep.remote_write_seal import RemoteWriteSealer
from fleetwatch.server.upkeep.retention import RetentionJob
from fleetwatch.server.upkeep.rollups import RollupJob

__all__ = ["WEEKLY_REPORT_INTERVAL_S", "BackgroundJobs"]

logger = logging.getLogger(__name__)

WEEKLY_REPORT_INTERVAL_S = 600.0
URGENT_IDLE_S = 3600.0
# How often staged remote-write scrapes are looked at: a scrape is stored within a second of
# settling. A pass with nothing settled is one indexed read.
_SEAL_INTERVAL_S = 1.0


def _apart(interval_s: float, other_interval_s: float) -> float:
    """A phase that keeps a job's passes off another's when both run at one interval (half of
    it); none when their intervals differ (their passes meet only now and then anyway)."""
    return interval_s / 2 if interval_s == other_interval_s else 0.0


class BackgroundJobs:
    """The job objects (the routes use some of them too) and the list of jobs run on them."""

    def __init__(
        self,
        db: Database,
        settings: ServerSettings,
        *,
        metrics: ServerMetrics,
        secrets: SecretBox,
        heard_since: datetime,
    ) -> None:
        self.db = db
        self.settings = settings
        self.metrics = metrics
        self.catalog, thresholds = load_rules(settings.rules_file)
        self.waker = Waker()  # the whole-fleet assessment's
        self.urgent_waker = Waker()  # the urgent lane's: a fatal Xid or a lost GPU
        self.urgent = UrgentNodes(self.urgent_waker, self.waker)
        self._urgent_thread = ThreadPoolExecutor(1, thread_name_prefix="urgent-lane")
        # The urgent lane first, the whole-fleet passes of this process giving way to it; off
        # on SQLite, where one writer lock orders the writes whatever the interpreter does.
        self.precedence = Precedence(
            enabled=not db.is_sqlite, waited=metrics.background_gave_way_seconds
        )
        self.outbox_waker = Waker()  # the webhook delivery's: an alert queued
        # The planner's and the alerts': a new whole-fleet assessment on the leader.
        self.planner_waker = Waker()
        self.alerts_waker = Waker()
        self.assessor = Assessor(
            db,
            settings,
            self.catalog,
            thresholds,
            guard=self._guard("assessment"),
        )
        self.planner = EvictionPlanner(
            db, settings, self.assessor, guard=self._guard("planner"), heard_since=heard_since
        )
        self.sharing: SnapshotSharing | None = None
        if not db.is_sqlite and settings.snapshot_poll_s > 0:
            self.sharing = SnapshotSharing(
                db,
                self.assessor,
                stale_after_s=settings.snapshot_stale_after_s,
                counted=metrics.fleet_snapshots,
            )
            self.assessor.adopter = self._follow
            self.assessor.catch_up = self._catch_up
            self.assessor.defers = self._defers
        # Issue 15: what each running job is told about its nodes (after each plan).
        self.notices = JobNotices(db, settings, lambda: self.assessor.latest)
        self.stragglers = StragglerDetector(db, settings, guard=self._guard("stragglers"))
        self.alerter = Alerter(
            db,
            settings,
            lambda: self.assessor.latest,
            on_queued=self.outbox_waker.poke,
            guard=self._guard("alerts"),
            heard_since=heard_since,
        )
        self.outbox = OutboxWorker(db, settings, guard=self._guard("webhooks"), secrets=secrets)
        self.refitter = Refitter(db, settings, failures=self._failures("refit"))
        self.sealer = RemoteWriteSealer(
            db,
            settings,
            counted=lambda outcome, n: metrics.remote_write_samples.labels(outcome).inc(n),
        )
        self.elector: LeaderElector | None = None
        # Every pass runs in a context of this process's precedence (runtime/passes.py): the
        # whole-fleet passes give way through it, the urgent lane's runs ahead.
        self.scheduler = Scheduler(
            failures=self._failures,
            runs=self._runs,
            durations=self._pass_seconds,
            precedence=self.precedence,
        )

    def process_jobs(self) -> list[Job]:
        """What every process runs: its own assessment (then, on the leader, a plan and alerts)."""
        s = self.settings
        jobs = [
            Job("assessment", s.assess_interval_s, self._assess_then_act, waker=self.waker),
            # Run by its pokes; every node added pokes it, so its timer has nothing to find.
            Job(
                "urgent",
                URGENT_IDLE_S,
                self._urgent_pass,
                waker=self.urgent_waker,
                executor=self._urgent_thread,
                ahead=True,
            ),
        ]
        if self.sharing is not None:
            jobs.append(Job("snapshot", s.snapshot_poll_s, self._poll))
        # Every process seals (rows are taken with SKIP LOCKED): a remote-write scrape is stored
        # about a settle time after its last piece, wherever the piece came in.
        jobs.append(Job("remote_write_seal", _SEAL_INTERVAL_S, self.sealer.run_once))
        return jobs

    def leader_jobs(self) -> list[Job]:
        """What the leader runs; built anew each time this process becomes the leader, as what
        a leader keeps in memory starts afresh on a new leader."""
        s, db, catalog = self.settings, self.db, self.catalog
        rollups = RollupJob(db, catalog, guard=self._guard("rollups"))
        lifecycle = functools.partial(run_lifecycle, db, s, catalog, guard=self._guard("lifecycle"))
        weekly_report = WeeklyReportJob(db, s, catalog, guard=self._guard("weekly_report"))
        fresh = self.assessor.run_once
        jobs = [
            Job("rollups", s.rollup_interval_s, rollups),
            # Half an interval behind the rollups: both read the whole fleet every 5 minutes,
            # and started together they ran side by side on the database (fleet-scale run 31:
            # the lifecycle's read of every GPU beside the rollups' 17 s read of samples, while
            # the stored rate fell to 6,726 rows/s).
            Job(
                "lifecycle",
                s.lifecycle_interval_s,
                lifecycle,
                phase_s=_apart(s.lifecycle_interval_s, s.rollup_interval_s),
            ),
            Job(
                "retention", s.retention_interval_s, RetentionJob.from_settings(db, s, self.metrics)
            ),
            Job(
                "planner",
                s.planner_interval_s,
                self._plan_then_notify,
                first=fresh,
                waker=self.planner_waker,
            ),
            Job("stragglers", s.straggler_interval_s, self.stragglers.run_once),
            Job(
                "alerts",
                s.alert_interval_s,
                self.alerter.run_once,
                first=fresh,
                waker=self.alerts_waker,
            ),
            Job("weekly_report", WEEKLY_REPORT_INTERVAL_S, weekly_report),
            Job(
                "webhooks",
                s.webhook_delivery_interval_s,
                self.outbox.run_once,
                waker=self.outbox_waker,
            ),
        ]
        if s.refit_interval_s > 0:
            refit = self.refitter
            jobs.append(Job("refit", s.refit_interval_s, refit.request, timer=refit.run_schedule))
        return jobs

    @property
    def is_leader(self) -> bool:
        return self.elector is not None and self.elector.is_leader

    def start(self, engine: Engine) -> None:
        """Start the jobs this process runs (call in the event loop, e.g. the app's lifespan)."""
        self.waker.bind()
        self.urgent_waker.bind()
        self.outbox_waker.bind()
        self.planner_waker.bind()
        self.alerts_waker.bind()
        if not self.settings.background_jobs:
            return
        if self.settings.role != "api":
            self.elector = LeaderElector.for_engine(
                engine, on_change=self._leadership_changed, on_wake=self.urgent.add
            )
        self.scheduler.start(self.process_jobs())
        if self.elector is not None:
            self.elector.start()

    async def stop(self) -> None:
        """Stop leading, cancel every job, and let a refit in flight end (up to a minute)."""
        if self.elector is not None:
            await asyncio.to_thread(self.elector.stop)
        await self.scheduler.stop()
        await asyncio.to_thread(self.refitter.wait, 60.0)  # before the engine is disposed
        await asyncio.to_thread(self.outbox.close)
        await asyncio.to_thread(self._urgent_thread.shutdown)  # a pass in flight ends first

    def _leadership_changed(self, leading: bool) -> None:
        if not leading:
            self.scheduler.stop_leading()
            return
        self.scheduler.lead(self.leader_jobs())
        self.waker.poke()  # a new leader judges and plans at once, not one interval later

    def _follow(self) -> bool:
        """Adopt the leader's newer stored snapshot, if this process shares and does not lead;
        whether it serves a fresh one of the leader's (see :meth:`SnapshotSharing.follow`)."""
        return self.sharing is not None and not self.is_leader and self.sharing.follow()

    def _poll(self) -> bool:
        """Whether the leader's stored snapshot is fresh, if this process shares and does not
        lead; adopted at once only while this process's snapshot is read (see
        :meth:`SnapshotSharing.poll`)."""
        return self.sharing is not None and not self.is_leader and self.sharing.poll()

    def _defers(self) -> bool:
        """Whether this process leaves the leader's snapshot unread (see Assessor.defers)."""
        return self.sharing is not None and not self.is_leader and not self.sharing.being_read()

    def _catch_up(self) -> None:
        if self.sharing is not None and not self.is_leader:
            self.sharing.catch_up()

    def _assess_then_act(self) -> None:
        if self._poll():
            return  # the leader judged the fleet: its snapshot answers this process's requests
        snapshot = self.assessor.run_once()
        if self.is_leader:  # a replica's snapshot answers its requests; the leader plans, alerts
            # Their own loops, woken: they run at once and their timers start again, where a
            # pass of each here as well made four planner and alert passes in 30 s instead of
            # three (fleet-scale run 40: 18 % of the worker's interpreter after assessments).
            self.planner_waker.poke()
            self.alerts_waker.poke()
            if self.sharing is not None:
                self._publish(snapshot)

    def _publish(self, snapshot: FleetAssessment) -> None:
        """Store the leader's snapshot for the other processes (after waking the planner and
        the alerts on it). A failure leaves them their previous one."""
        assert self.sharing is not None
        give_way()
        try:
            self.sharing.publish(snapshot)
        except Exception:
            self._failures("snapshot").inc()
            logger.exception("could not publish the fleet assessment for the other processes")

    def _urgent_pass(self) -> int:
        """The urgent lane's targeted pass over the nodes waiting (nothing if none); their
        number."""
        names = self.urgent.take()
        if not names:
            return 0
        self._urgent_nodes(names)  # ahead of the whole-fleet passes (its Job is ``ahead``)
        return len(names)

    def _urgent_nodes(self, names: frozenset[str]) -> None:
        judge = self.assessor.judge
        fresh_before = judge.fresh_reads
        snapshot = self.assessor.run_nodes(names)
        self.metrics.urgent_fresh_reads.inc(judge.fresh_reads - fresh_before)
        if self.is_leader:
            # A targeted snapshot says nothing new of the other nodes: their notices stand.
            notify = functools.partial(self.notices.run_once, snapshot, nodes=names)
            self._act(
                functools.partial(self.planner.run_for, names),
                notify,
                functools.partial(self.alerter.run_for, names),
            )

    def _act(
        self,
        plan: Callable[[], object],
        notify: Callable[[], object],
        alert: Callable[[], object],
    ) -> None:
        # The planner and the alerts have their own loops too: one failing must not keep the
        # other from acting on this assessment (each failure is logged and counted there).
        steps = (("planner", plan), ("notices", notify), ("alerts", alert))
        for job, step in steps:
            try:
                step()  # a fatal Xid drains and pages without waiting for their ticks
            except Exception:
                self._failures(job).inc()
                logger.exception("background job %s (after the assessment) failed", job)

    def _plan_then_notify(self) -> None:
        """The planner's tick, then the jobs' notices from the evictions it left open."""
        self.planner.run_once()
        self.notices.run_once()

    def _guard(self, job: str) -> ItemGuard:
        return ItemGuard(job, self.metrics.background_item_errors.labels(job=job))

    def _failures(self, job: str) -> Counter:
        return self.metrics.background_job_failures.labels(job=job)

    def _runs(self, job: str) -> Counter:
        return self.metrics.background_runs.labels(job=job)

    def _pass_seconds(self, job: str) -> Histogram:
        return self.metrics.background_pass_seconds.labels(job=job)
