"""The urgent lane runs ahead of the whole-fleet passes of its process: a pass giving way waits
while an urgent pass runs in another thread (never in the urgent pass's own thread, never past
``max_wait_s``, never where precedence is off), and the passes give way between their chunks
without changing what they store or judge."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select
from tests.faults.waiting import wait_for
from tests.unit.server.upkeep.test_lifecycle import T0, _gpu, _report

from fleetwatch.config import ServerSettings
from fleetwatch.rules.xid import XidCatalog
from fleetwatch.server.background import BackgroundJobs
from fleetwatch.server.db.secret_box import SecretBox
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.db.tables import gpu_lifetimes
from fleetwatch.server.operations import _render
from fleetwatch.server.runtime.metric_families import ServerMetrics
from fleetwatch.server.runtime.passes import OUTSIDE_A_PASS, PassContext, current_pass
from fleetwatch.server.runtime.precedence import MIN_RUN_S, Precedence
from fleetwatch.server.upkeep import lifecycle as lifecycle_module
from fleetwatch.server.upkeep.lifecycle import LifecycleCounts, sync_lifetimes


@pytest.fixture(scope="module")
def catalog() -> XidCatalog:
    return XidCatalog.load()


class _Seconds:
    def __init__(self) -> None:
        self.total = 0.0
        self.calls = 0

    def inc(self, amount: float = 1) -> None:
        self.total += amount
        self.calls += 1


class _CountingPrecedence(Precedence):
    """A process's precedence that counts the checkpoints a pass reaches."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def give_way(self) -> None:
        self.calls += 1
        super().give_way()


@contextmanager
def _ahead_in_another_thread(precedence: Precedence) -> Iterator[None]:
    """Work running ahead in another thread (a stuck urgent pass, a long scrape) until the
    block ends."""
    release, started = threading.Event(), threading.Event()

    def ahead() -> None:
        with precedence.ahead():
            started.set()
            release.wait(60.0)

    other = threading.Thread(target=ahead)
    other.start()
    try:
        assert started.wait(30.0)
        yield
    finally:
        release.set()
        other.join(30.0)


def test_giving_way_waits_for_an_urgent_pass_in_another_thread() -> None:
    waited = _Seconds()
    precedence = Precedence(max_wait_s=600.0, waited=waited)
    passed: list[str] = []

    def whole_fleet_pass() -> None:
        precedence.give_way()
        passed.append("fleet")

    with precedence.ahead():
        fleet = threading.Thread(target=whole_fleet_pass)
        fleet.start()
        wait_for("the pass to give way", lambda: precedence.waiting == 1, timeout=60.0)
        assert passed == []  # held at its checkpoint while the urgent pass runs
        assert precedence.running_ahead
    fleet.join(30.0)
    assert passed == ["fleet"] and not precedence.running_ahead
    assert waited.calls == 1 and waited.total > 0
    assert precedence.waiting == 0


def test_no_urgent_pass_no_wait_and_the_urgent_thread_never_waits_on_itself() -> None:
    waited = _Seconds()
    precedence = Precedence(max_wait_s=600.0, waited=waited)
    precedence.give_way()
    with precedence.ahead(), precedence.ahead():  # nested: still this thread's own
        precedence.give_way()  # shared code called by the urgent pass itself
    assert waited.calls == 0 and not precedence.running_ahead


def test_a_stuck_urgent_pass_holds_the_fleet_only_max_wait() -> None:
    waited = _Seconds()
    precedence = Precedence(max_wait_s=0.05, waited=waited)
    with _ahead_in_another_thread(precedence):  # a stuck urgent pass
        precedence.give_way()  # returns although the urgent pass has not ended
        assert precedence.running_ahead and waited.calls == 1


def test_precedence_off_never_waits() -> None:
    waited = _Seconds()
    precedence = Precedence(enabled=False, max_wait_s=600.0, waited=waited)
    done = threading.Event()

    def whole_fleet_pass() -> None:
        precedence.give_way()
        done.set()

    with precedence.ahead():
        fleet = threading.Thread(target=whole_fleet_pass)
        fleet.start()
        assert done.wait(30.0)  # would wait 600 s if precedence were on
    fleet.join(30.0)
    assert waited.calls == 0


def test_the_lifecycle_gives_way_between_chunks_and_opens_every_lifetime_once(
    db: Database, catalog: XidCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lifecycle is handed nothing: it gives way through the pass it runs in."""
    monkeypatch.setattr(lifecycle_module, "_INSERT_CHUNK", 100)
    for n in range(40):
        node = f"node-{n:03d}"
        _report(db, [_gpu(f"S{n}-{i}", node=node, index=i) for i in range(8)], at=T0, node=node)
    precedence = _CountingPrecedence()
    with db.write() as conn, PassContext("lifecycle", precedence).running():
        counts = sync_lifetimes(conn, now=T0, catalog=catalog)
    assert counts == LifecycleCounts(opened=320)
    assert precedence.calls == 1 + 4  # one chunk of first readings, four of 100 lifetimes
    with db.read() as conn:
        serials = conn.execute(select(gpu_lifetimes.c.serial)).scalars().all()
        assert len(serials) == len(set(serials)) == 320
        assert conn.execute(select(func.count()).select_from(gpu_lifetimes)).scalar_one() == 320


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_the_urgent_pass_runs_first_on_postgresql_only(
    database: str, request: pytest.FixtureRequest, tmp_path: Any
) -> None:
    """Precedence is on where passes share PostgreSQL, off on SQLite (one writer lock already
    orders the writes); the urgent pass runs inside it either way."""
    if database == "postgres":
        url = request.getfixturevalue("migrated_postgres_url")
    else:
        url = f"sqlite:///{tmp_path / 'fw.db'}"
    settings = ServerSettings(database_url=url, _env_file=None)
    db = Database(make_engine(settings))
    try:
        jobs = BackgroundJobs(
            db,
            settings,
            metrics=ServerMetrics(CollectorRegistry()),
            secrets=SecretBox([]),
            heard_since=T0,
        )
        assert jobs.precedence.enabled is (database == "postgres")
        assert jobs.scheduler._precedence is jobs.precedence
        ahead = {job.name for job in [*jobs.process_jobs(), *jobs.leader_jobs()] if job.ahead}
        assert ahead == {"urgent"}
        urgent = next(job for job in jobs.process_jobs() if job.name == "urgent")
        seen: list[tuple[bool, str]] = []
        jobs._urgent_nodes = lambda names: seen.append(
            (jobs.precedence.running_ahead, current_pass().job)
        )
        jobs.urgent.add(["node-a"])
        assert jobs.scheduler._pass_of(urgent, urgent.run)() == 1
        assert seen == [(True, "urgent")] and not jobs.precedence.running_ahead
        assert current_pass() is OUTSIDE_A_PASS
    finally:
        db.engine.dispose()


def test_a_pass_that_just_gave_way_runs_a_while_before_it_waits_again() -> None:
    """Scrapes back to back never stop a whole-fleet pass for good: after one wait it runs at
    least MIN_RUN_S (an injected clock: no sleeping)."""
    now = [100.0]
    waited = _Seconds()
    precedence = Precedence(max_wait_s=0.01, waited=waited, clock=lambda: now[0])
    with _ahead_in_another_thread(precedence):  # a long scrape
        precedence.give_way()  # waits (max_wait_s) for the scrape
        assert waited.calls == 1
        now[0] += MIN_RUN_S / 2
        precedence.give_way()  # too soon: runs on
        assert waited.calls == 1
        now[0] += MIN_RUN_S
        precedence.give_way()  # its run is over: waits again
        assert waited.calls == 2


def test_a_metrics_page_renders_ahead_of_the_whole_fleet_passes() -> None:
    precedence = Precedence(max_wait_s=600.0)
    seen: list[tuple[bool, object]] = []

    class _Assessor:
        def newest(self) -> str:
            return "snapshot"

    def render(*, snapshot: object, fleet: object) -> str:
        seen.append((precedence.running_ahead, snapshot))
        return "page"

    page = _render(render, _Assessor(), precedence, fleet=None)
    assert page == "page" and seen == [(True, "snapshot")]
    assert not precedence.running_ahead
