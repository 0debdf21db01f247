"""The straggler background job: judges each job's new windows and keeps ``stragglers`` current.

Every ``straggler_interval_s`` it reads the jobs table, and for each job whose newest step is half a
window past the next unjudged window, judges the windows in order
(:mod:`fleetwatch.models.stragglers`). It writes verdict transitions, ``node_slowness`` and the
job's detector state (``straggler_state``: the next unjudged window, each node's runs of slow and
normal windows, open verdicts, the newest window's ratios) in one transaction per job. A telemetry
correlation is attached to hardware verdicts when they open, and so are the node's network ports
that were down, degraded or erroring around the onset (a slow rail slows every collective).

No state that matters stays in a worker's memory: whichever worker judges a job next (after a
restart, or as a new leader) resumes from its stored state exactly, so no window is judged, or
counted in ``node_slowness``, twice, and ``/metrics`` shows the same ratios on every process. A job
without stored state (new, or judged by a version before ``straggler_state``) is built by
replaying up to its last 60 windows and adopting its open verdicts (for the latter,
``node_slowness`` counts those windows a second time, once). So a job that posts old steps all at
once is judged whole when it is shorter than 10 minutes of steps, and on its last 10 minutes
otherwise. On PostgreSQL an advisory lock lets one worker do a pass.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from sqlalchemy import Connection

from fleetwatch.config import ServerSettings
from fleetwatch.models.stragglers import (
    DetectorConfig,
    JobDetector,
    judge_window,
)
from fleetwatch.server.db.session import Database
from fleetwatch.server.repo.jobs import (
    JobRow,
    StoredDetector,
    apply_transitions,
    detector_starts,
    list_jobs,
    list_stragglers,
    load_detector,
    load_slowness,
    read_steps,
    save_detector,
    telemetry_evidence,
    update_slowness,
)
from fleetwatch.server.repo.ports import port_evidence
from fleetwatch.server.runtime.isolation import ItemGuard
from fleetwatch.server.runtime.locks import LockKey, try_transaction_lock

__all__ = ["StragglerDetector"]

logger = logging.getLogger(__name__)

REBUILD_WINDOWS = 60
MAX_WINDOWS_PER_PASS = 2000


class StragglerDetector:
    """Judges new step windows of every job; ``run_once()`` is the background job."""

    def __init__(
        self, db: Database, settings: ServerSettings, guard: ItemGuard | None = None
    ) -> None:
        self.db = db
        self.guard = guard or ItemGuard("stragglers")
        self.config = DetectorConfig(
            window_s=settings.straggler_window_s,
            ratio=settings.straggler_ratio,
            windows=settings.straggler_windows,
            normal_windows=settings.straggler_windows,
        )

    def run_once(self, now: datetime | None = None) -> int:
        """One pass over every job; returns the number of windows judged."""
        now = now or datetime.now(UTC)
        judged = 0
        with self.db.write() as conn:
            if not try_transaction_lock(conn, LockKey.STRAGGLERS):
                return 0
            slowness = load_slowness(conn)
            listed = list_jobs(conn, limit=1000)
            starts = detector_starts(conn, [job.job_id for job in listed])
            for job in listed:
                start = starts.get(job.job_id)
                if start is not None and start + self.config.width > self._ready(job):
                    continue  # most jobs, most passes: no savepoint for nothing to do
                # A savepoint per job: its stored state moves with its writes, so a failing job is
                # rolled back alone and judged again from where it was, next pass (its slowness
                # scores too: the later jobs of this pass must not see them).
                with self.guard.item(conn, f"job {job.job_id}"):
                    scores = dict(slowness)
                    judged += self._run_job(conn, job, scores, now)
                    slowness.update(scores)
        return judged

    def _ready(self, job: JobRow) -> datetime:
        """Windows ending by then may be judged (ranks flush at different moments)."""
        return job.last_seen - self.config.grace

    def _rebuild(
        self, conn: Connection, job: JobRow, slowness: dict[str, float]
    ) -> tuple[JobDetector, datetime]:
        """A detector for a job without stored state, and the window it starts at."""
        width = self.config.width
        start = job.first_seen
        if job.last_seen - job.first_seen > width * REBUILD_WINDOWS:
            skip = int((job.last_seen - job.first_seen - width * REBUILD_WINDOWS) / width)
            start = job.first_seen + width * skip
        detector = JobDetector(
            self.config, from_start=start == job.first_seen, slowness=slowness.get
        )
        for row in list_stragglers(conn, job_id=job.job_id, active=True):
            detector.adopt_open(row["node"], row["started_at"], row["windows"])
        return detector, start

    def _run_job(
        self, conn: Connection, job: JobRow, slowness: dict[str, float], now: datetime
    ) -> int:
        stored = load_detector(conn, job.job_id)
        if stored is None:
            detector, next_start = self._rebuild(conn, job, slowness)
            latest: dict[str, float] = {}
        else:
            detector = JobDetector.resume(self.config, stored.detector, slowness=slowness.get)
            next_start, latest = stored.next_start, stored.ratios
        width, ready = self.config.width, self._ready(job)
        if next_start + width > ready:
            return 0
        steps = read_steps(conn, job.job_id, next_start, ready)
        judged = 0
        ratios: dict[str, list[float]] = {}
        transitions = []
        i = 0
        while next_start + width <= ready and judged < MAX_WINDOWS_PER_PASS:
            start, end = next_start, next_start + width
            j = i
            while j < len(steps) and steps[j].ts < end:
                j += 1
            window = steps[i:j]
            i = j
            if window:
                result = judge_window(window, start, end, ratio=self.config.ratio)
                transitions.extend(detector.feed(result))
                for node, nw in (result.nodes if result else {}).items():
                    ratios.setdefault(node, []).append(nw.ratio)
                next_start = end
            elif i < len(steps):  # a gap: jump to the window holding the next step
                next_start = start + width * int((steps[i].ts - start) / width)
            else:
                next_start = start + width * int((ready - start) / width)
            judged += 1
        for t in transitions:
            if t.action == "open" and t.kind == "hardware":
                found = telemetry_evidence(conn, t.node, t.started_at, t.at)
                if found is not None:
                    t.evidence["telemetry"] = found
                ports = port_evidence(conn, t.node, t.started_at, t.at)
                if ports is not None:
                    t.evidence["network"] = ports
            logger.info(
                "straggler %s: job %s node %s %s (%.2fx)",
                t.action,
                job.job_id,
                t.node,
                t.kind or "",
                t.ratio,
            )
        apply_transitions(conn, job.job_id, transitions, now)
        if ratios:
            update_slowness(conn, ratios, slowness, now)
        if detector.last is not None:
            latest = {node: nw.ratio for node, nw in detector.last.nodes.items()}
        save_detector(conn, job.job_id, StoredDetector(next_start, detector.state(), latest), now)
        return judged
