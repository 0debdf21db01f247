"""Scheduler.stop waits for the passes still running in worker threads.

Cancelling a job's task leaves its pass running in its thread; the server then disposes the
engine, and a pass still holding a pooled connection left it open for the garbage collector: the
ResourceWarning that failed an innocent test in CI now and then.
"""

from __future__ import annotations

import asyncio
import threading

from fleetwatch.server.runtime.scheduler import InFlight, Job, Scheduler


class _Count:
    def inc(self, amount: float = 1) -> None:
        pass


def _scheduler() -> Scheduler:
    return Scheduler(failures=lambda _: _Count(), runs=lambda _: _Count())


def test_stop_returns_only_after_the_pass_in_its_thread_has_ended() -> None:
    started, release = threading.Event(), threading.Event()
    order: list[str] = []

    def slow_pass() -> None:
        started.set()
        release.wait(timeout=120)
        order.append("pass ended")

    async def scenario() -> None:
        scheduler = _scheduler()
        scheduler.start([Job("slow", 3600.0, slow_pass)])
        assert await asyncio.to_thread(started.wait, 120)
        stopping = asyncio.create_task(scheduler.stop())
        # While the pass is held, stop cannot have returned, however long we look.
        done, _ = await asyncio.wait({stopping}, timeout=0.5)
        assert not done, "stop returned while a pass was still running in its thread"
        release.set()
        await stopping
        order.append("stopped")

    asyncio.run(scenario())
    assert order == ["pass ended", "stopped"]


def test_stop_gives_up_on_a_pass_that_never_ends_after_its_timeout() -> None:
    started, release = threading.Event(), threading.Event()

    def stuck_pass() -> None:
        started.set()
        release.wait(timeout=120)

    async def scenario() -> None:
        scheduler = _scheduler()
        scheduler.start([Job("stuck", 3600.0, stuck_pass)])
        assert await asyncio.to_thread(started.wait, 120)
        try:
            await scheduler.stop(passes_timeout_s=0.01)  # returns: the server's stop goes on
        finally:
            release.set()  # before asyncio.run waits for its threads

    asyncio.run(scenario())


def test_in_flight_counts_passes_that_raise_as_ended() -> None:
    in_flight = InFlight()

    def failing() -> None:
        raise RuntimeError("pass failed")

    wrapped = in_flight.wrap(failing)
    try:
        wrapped()
    except RuntimeError:
        pass
    assert in_flight.wait(0)
