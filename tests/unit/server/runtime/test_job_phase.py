"""Background passes keep their rhythm: the next pass comes the rest of the interval after one
(a breather after a slow one; sooner when the job hints), and a job with a phase has its second
pass that much later, so that two heavy jobs of one interval (the rollups and the lifecycle)
never start together after the first. Fake clock and waker: nothing waits."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from fleetwatch.config import ServerSettings
from fleetwatch.server.background import BackgroundJobs
from fleetwatch.server.db.secret_box import SecretBox
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.runtime.metric_families import ServerMetrics
from fleetwatch.server.runtime.scheduler import Waker, next_pause, periodic


def test_the_next_pass_comes_the_rest_of_the_interval_after() -> None:
    assert next_pause(300.0, 40.0) == 260.0
    assert next_pause(300.0, 400.0) == 30.0, "a slow pass still leaves a tenth of the interval"
    assert next_pause(300.0, 40.0, hint_s=5.0) == 5.05, "the job knows its next work sooner"
    assert next_pause(300.0, 40.0, hint_s=1000.0) == 260.0


class _Pauses:
    """Stands in for the job's Waker: records each pause asked for and returns at once; stops
    the job (cancels it) after ``passes`` pauses."""

    def __init__(self, passes: int) -> None:
        self.passes = passes
        self.asked: list[float] = []

    async def wait(self, timeout_s: float) -> None:
        self.asked.append(timeout_s)
        if len(self.asked) == self.passes:
            raise asyncio.CancelledError


def _pauses(phase_s: float, passes: int = 4) -> tuple[list[float], int]:
    pauses = _Pauses(passes)
    ran = []

    async def run() -> None:
        with pytest.raises(asyncio.CancelledError):
            await periodic(
                "job",
                300.0,
                lambda: ran.append(1),
                cast(Waker, pauses),
                phase_s=phase_s,
                clock=lambda: 1000.0,  # every pass takes no time
            )

    asyncio.run(run())
    return pauses.asked, len(ran)


def test_a_phase_delays_the_second_pass_only() -> None:
    assert _pauses(phase_s=0.0) == ([300.0, 300.0, 300.0, 300.0], 4)
    assert _pauses(phase_s=150.0) == ([450.0, 300.0, 300.0, 300.0], 4)


def _jobs(settings: ServerSettings) -> dict[str, Any]:
    jobs = BackgroundJobs(
        Database(make_engine(settings)),  # nothing is read: the jobs are only built
        settings,
        metrics=ServerMetrics(CollectorRegistry()),
        secrets=SecretBox([]),
        heard_since=datetime.now(UTC) - timedelta(hours=1),
    )
    return {job.name: job for job in jobs.leader_jobs()}


def test_the_lifecycle_runs_half_an_interval_behind_the_rollups(tmp_path: Any) -> None:
    base = ServerSettings(database_url=f"sqlite:///{tmp_path / 'x.db'}", _env_file=None)  # type: ignore[call-arg]
    jobs = _jobs(base)
    assert jobs["rollups"].phase_s == 0.0
    assert jobs["lifecycle"].phase_s == base.lifecycle_interval_s / 2 == 150.0
    other = base.model_copy(update={"lifecycle_interval_s": 600.0})
    assert _jobs(other)["lifecycle"].phase_s == 0.0, "other intervals meet only now and then"
