"""A pass gets its context from whatever runs it: the scheduler runs every pass in a
PassContext of its process's precedence, the domain code gives way through it without being
handed anything, and the context ends with the pass (pooled threads carry none over)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from fleetwatch.server.runtime.passes import OUTSIDE_A_PASS, PassContext, current_pass, give_way
from fleetwatch.server.runtime.precedence import Precedence
from fleetwatch.server.runtime.scheduler import Job, Scheduler


class _Count:
    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


def _scheduler(precedence: Precedence) -> tuple[Scheduler, dict[str, _Count]]:
    failures: dict[str, _Count] = {}
    scheduler = Scheduler(
        failures=lambda job: failures.setdefault(job, _Count()),
        runs=lambda job: _Count(),
        precedence=precedence,
    )
    return scheduler, failures


def test_outside_a_pass_giving_way_never_waits() -> None:
    precedence = Precedence(max_wait_s=600.0)
    release = threading.Event()
    entered = threading.Event()

    def urgent() -> None:
        with PassContext("urgent", precedence, ahead=True).running():
            entered.set()
            release.wait(60.0)

    other = threading.Thread(target=urgent)
    other.start()
    try:
        assert entered.wait(30.0) and precedence.running_ahead
        assert current_pass() is OUTSIDE_A_PASS
        give_way()  # a test or a CLI command calling pass code: would wait 600 s in a pass
        assert precedence.waiting == 0
    finally:
        release.set()
        other.join(30.0)


def test_a_scheduled_pass_gives_way_through_its_context_to_the_urgent_lane() -> None:
    """A real Scheduler: the job's code calls the module's give_way() with nothing handed to
    it, and waits while the urgent lane's pass runs ahead in another thread."""
    precedence = Precedence(max_wait_s=600.0)
    seen: list[str] = []
    done = threading.Event()

    def whole_fleet_pass() -> None:
        seen.append(current_pass().job)
        give_way()
        seen.append("after giving way")
        done.set()

    async def run() -> None:
        scheduler, failures = _scheduler(precedence)
        with precedence.ahead():  # the urgent lane runs ahead, in this thread
            scheduler.start([Job("rollups", 3600.0, whole_fleet_pass)])
            deadline = asyncio.get_running_loop().time() + 60.0
            while precedence.waiting == 0:  # the pass reached its checkpoint and waits
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.01)
            assert seen == ["rollups"]
        await asyncio.to_thread(done.wait, 60.0)
        await scheduler.stop()
        assert "rollups" not in failures or failures["rollups"].value == 0

    asyncio.run(run())
    assert seen == ["rollups", "after giving way"]


def test_the_urgent_lanes_pass_runs_ahead_and_never_waits_on_itself() -> None:
    precedence = Precedence(max_wait_s=600.0)
    seen: list[tuple[str, bool, bool]] = []
    pool = ThreadPoolExecutor(1, thread_name_prefix="urgent-test")

    def urgent_pass() -> None:
        give_way()  # code shared with the whole-fleet passes: never waits here
        seen.append((current_pass().job, current_pass().ahead, precedence.running_ahead))

    async def run() -> None:
        scheduler, _ = _scheduler(precedence)
        scheduler.start([Job("urgent", 3600.0, urgent_pass, executor=pool, ahead=True)])
        deadline = asyncio.get_running_loop().time() + 60.0
        while not seen:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        await scheduler.stop()

    try:
        asyncio.run(run())
        assert seen == [("urgent", True, True)]
        assert not precedence.running_ahead  # ahead only while its pass ran
        # The pooled thread carries no context over to what it runs next.
        assert pool.submit(current_pass).result(30.0) is OUTSIDE_A_PASS
    finally:
        pool.shutdown()


def test_a_context_ends_with_its_pass_even_when_the_pass_fails() -> None:
    precedence = Precedence()
    try:
        with PassContext("alerts", precedence).running():
            assert current_pass().job == "alerts"
            raise RuntimeError("the pass failed")
    except RuntimeError:
        pass
    assert current_pass() is OUTSIDE_A_PASS
    with PassContext("urgent", precedence, ahead=True).running():
        with PassContext("planner", precedence).running():  # a nested step: its own context
            assert current_pass().job == "planner"
        assert current_pass().job == "urgent" and precedence.running_ahead
    assert current_pass() is OUTSIDE_A_PASS and not precedence.running_ahead
