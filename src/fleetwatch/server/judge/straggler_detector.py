"""The straggler background job: judges each job's new windows and keeps ``stragglers`` current.

Every ``straggler_interval_s`` it reads the jobs table, and for each job whose newest step is half a
window past the next unjudged window, judges the windows in order
(:mod:`fleetwatch.models.stragglers`). It writes verdict transitions and ``node_slowness`` in one
transaction per job. A telemetry correlation is attached to hardware verdicts when they open.

Detector state (runs of slow and normal windows) lives in this worker's memory. A worker that
builds a detector for a job it has not followed (a restart, or another worker that held the lock)
replays up to the job's last 60 windows and adopts its open verdicts; ``node_slowness`` may then
count those windows twice. So a job that posts old steps all at once is judged whole when it is
shorter than 10 minutes of steps, and on its last 10 minutes otherwise. On PostgreSQL an advisory
lock lets one worker do a pass; a worker that loses the race drops its detectors so that it
rebuilds them from the database when it next wins.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from sqlalchemy import Connection, text

from fleetwatch.config import ServerSettings
from fleetwatch.models.stragglers import (
    DetectorConfig,
    JobDetector,
    JobTrackers,
    TrackedJob,
    judge_window,
)
from fleetwatch.server.db.session import Database
from fleetwatch.server.jobs.isolation import ItemGuard
from fleetwatch.server.metrics.exposition import escape_label
from fleetwatch.server.repo.jobs import (
    JobRow,
    apply_transitions,
    list_jobs,
    list_stragglers,
    load_slowness,
    read_steps,
    telemetry_evidence,
    update_slowness,
)

__all__ = ["StragglerDetector", "render_stragglers"]

logger = logging.getLogger(__name__)

_LOCK = 0x46575F535452  # "FW_STR"
REBUILD_WINDOWS = 60
MAX_WINDOWS_PER_PASS = 2000
_IDLE_DROP_S = 3600.0


def _singleton(conn: Connection) -> bool:
    if conn.dialect.name != "postgresql":
        return True
    return bool(conn.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": _LOCK}).scalar())


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
        self.trackers = JobTrackers()

    def run_once(self, now: datetime | None = None) -> int:
        """One pass over every job; returns the number of windows judged."""
        now = now or datetime.now(UTC)
        judged = 0
        with self.db.write() as conn:
            if not _singleton(conn):
                with self.trackers.lock:
                    self.trackers.jobs.clear()
                return 0
            slowness = load_slowness(conn)
            for job in list_jobs(conn, limit=1000):
                if self._idle(job):
                    continue  # most jobs, most passes: no savepoint for nothing to do
                # A savepoint per job: its detector state in memory moves with its writes, so a
                # failing job is rolled back alone and rebuilt from the database next pass.
                with self.guard.item(conn, f"job {job.job_id}") as ok:
                    judged += self._run_job(conn, job, slowness, now)
                if not ok:
                    with self.trackers.lock:
                        self.trackers.jobs.pop(job.job_id, None)
        self._forget_idle()
        return judged

    def _idle(self, job: JobRow) -> bool:
        """Whether the job surely has no window to judge (what :meth:`_run_job` checks first)."""
        if self.trackers.finished.get(job.job_id) == job.last_seen:
            return True
        tracked = self.trackers.jobs.get(job.job_id)
        if tracked is None or job.job_id in self.trackers.finished:
            return False  # _run_job builds the tracker, or drops the stale mark
        return tracked.next_start + self.config.width > job.last_seen - self.config.grace

    def _tracker(self, conn: Connection, job: JobRow, slowness: dict[str, float]) -> TrackedJob:
        tracked = self.trackers.jobs.get(job.job_id)
        if tracked is not None:
            return tracked
        width = self.config.width
        start = job.first_seen
        if job.last_seen - job.first_seen > width * REBUILD_WINDOWS:
            skip = int((job.last_seen - job.first_seen - width * REBUILD_WINDOWS) / width)
            start = job.first_seen + width * skip
        detector = JobDetector(self.config, from_start=start == job.first_seen,
                               slowness=slowness.get)  # fmt: skip
        for row in list_stragglers(conn, job_id=job.job_id, active=True):
            detector.adopt_open(row["node"], row["started_at"], row["windows"])
        tracked = TrackedJob(detector, start)
        with self.trackers.lock:
            self.trackers.jobs[job.job_id] = tracked
        return tracked

    def _run_job(
        self, conn: Connection, job: JobRow, slowness: dict[str, float], now: datetime
    ) -> int:
        if self.trackers.finished.get(job.job_id) == job.last_seen:
            return 0
        self.trackers.finished.pop(job.job_id, None)
        tracked = self._tracker(conn, job, slowness)
        width, ready = self.config.width, job.last_seen - self.config.grace
        if tracked.next_start + width > ready:
            return 0
        tracked.touched, tracked.last_seen = time.monotonic(), job.last_seen
        steps = read_steps(conn, job.job_id, tracked.next_start, ready)
        judged = 0
        ratios: dict[str, list[float]] = {}
        transitions = []
        i = 0
        while tracked.next_start + width <= ready and judged < MAX_WINDOWS_PER_PASS:
            start, end = tracked.next_start, tracked.next_start + width
            j = i
            while j < len(steps) and steps[j].ts < end:
                j += 1
            window = steps[i:j]
            i = j
            if window:
                result = judge_window(window, start, end, ratio=self.config.ratio)
                transitions.extend(tracked.detector.feed(result))
                for node, nw in (result.nodes if result else {}).items():
                    ratios.setdefault(node, []).append(nw.ratio)
                tracked.next_start = end
            elif i < len(steps):  # a gap: jump to the window holding the next step
                tracked.next_start = start + width * int((steps[i].ts - start) / width)
            else:
                tracked.next_start = start + width * int((ready - start) / width)
            judged += 1
        for t in transitions:
            if t.action == "open" and t.kind == "hardware":
                found = telemetry_evidence(conn, t.node, t.started_at, t.at)
                if found is not None:
                    t.evidence["telemetry"] = found
            logger.info("straggler %s: job %s node %s %s (%.2fx)", t.action, job.job_id, t.node,
                        t.kind or "", t.ratio)  # fmt: skip
        apply_transitions(conn, job.job_id, transitions, now)
        if ratios:
            update_slowness(conn, ratios, slowness, now)
        return judged

    def _forget_idle(self) -> None:
        cutoff = time.monotonic() - _IDLE_DROP_S
        with self.trackers.lock:
            for job_id, tracked in list(self.trackers.jobs.items()):
                if tracked.touched < cutoff and tracked.last_seen is not None:
                    del self.trackers.jobs[job_id]
                    self.trackers.finished[job_id] = tracked.last_seen


def render_stragglers(detector: StragglerDetector | None, db: Database) -> str:
    """``fleetwatch_node_step_slowdown_ratio{node,job}`` for jobs judged in the last 10 minutes
    (this worker's detectors) and ``fleetwatch_node_slowness_score{node}`` for every node."""
    out: list[str] = []
    if detector is not None:
        fresh = time.monotonic() - 600.0
        with detector.trackers.lock:
            live = {j for j, t in detector.trackers.jobs.items() if t.touched >= fresh}
        lines = [
            f"fleetwatch_node_step_slowdown_ratio"
            f'{{node="{escape_label(n)}",job="{escape_label(j)}"}} {r:.4f}\n'
            for j, n, r in detector.trackers.ratios()
            if j in live
        ]
        if lines:
            out.append(
                "# HELP fleetwatch_node_step_slowdown_ratio A node's median step time over its "
                "job's median, newest window.\n"
                "# TYPE fleetwatch_node_step_slowdown_ratio gauge\n"
            )
            out.extend(lines)
    with db.read() as conn:
        scores = load_slowness(conn)
    if scores:
        out.append(
            "# HELP fleetwatch_node_slowness_score Exponentially weighted step-time ratio of the "
            "node across jobs (1 = as fast as its peers).\n"
            "# TYPE fleetwatch_node_slowness_score gauge\n"
        )
        out.extend(
            f'fleetwatch_node_slowness_score{{node="{escape_label(n)}"}} {s:.4f}\n'
            for n, s in sorted(scores.items())
        )
    return "".join(out)
