"""The one scheduler of the server's background jobs: each job on its timer, in a worker thread.

Each pass runs in a worker thread (``asyncio.to_thread``) so that requests keep being served. A
failing pass is logged, counted and retried at the next tick, never fatal to the server. A
:class:`Waker` cuts the wait short (a fatal Xid should not sit until the next tick). Jobs that
write run on the one leader (:mod:`fleetwatch.server.runtime.leader`): :class:`Scheduler` starts
them when this process becomes the leader and cancels them when it stops being it. The jobs
themselves are listed in :mod:`fleetwatch.server.background`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol

from fleetwatch.server.runtime.passes import PassContext
from fleetwatch.server.runtime.precedence import NO_PRECEDENCE, Precedence

__all__ = ["InFlight", "Job", "Scheduler", "Waker", "periodic"]

logger = logging.getLogger(__name__)


class Waker:
    """Cuts a background job's wait short.

    ``poke`` may be called from any thread; :func:`periodic` jobs given the waker run as soon as
    it is poked (pokes during a run coalesce into one more run).
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def bind(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()

    def poke(self) -> None:
        if self._loop is not None and self._event is not None:
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self, timeout_s: float) -> None:
        assert self._event is not None, "bind() the waker in the event loop first"
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that
        # lands as the event is set, and the job's task then outlives the server's shutdown.
        try:
            async with asyncio.timeout(timeout_s):
                await self._event.wait()
        except TimeoutError:
            pass
        self._event.clear()


class InFlight:
    """The passes running in worker threads. Cancelling a job's task does not stop its thread:
    the pass runs on, with a pooled connection checked out, after the server's shutdown has
    disposed the engine, and that connection is then left open for the garbage collector (a
    ResourceWarning in a test process, a backend kept until exit in a server). So the
    scheduler's :meth:`Scheduler.stop` waits for them."""

    def __init__(self) -> None:
        self._count = 0
        self._idle = threading.Condition()

    def wrap(self, job: Callable[[], Any]) -> Callable[[], Any]:
        def counted() -> Any:
            with self._idle:
                self._count += 1
            try:
                return job()
            finally:
                with self._idle:
                    self._count -= 1
                    self._idle.notify_all()

        return counted

    def wait(self, timeout_s: float) -> bool:
        """Whether every pass ended within ``timeout_s``."""
        with self._idle:
            return self._idle.wait_for(lambda: self._count == 0, timeout=timeout_s)


class _Counter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class _Timings(Protocol):
    def observe(self, amount: float) -> None: ...


def next_pause(interval_s: float, elapsed_s: float, hint_s: float | None = None) -> float:
    """Seconds from a pass that took ``elapsed_s`` to the next: the rest of ``interval_s`` (a
    pass slower than its interval still leaves a breather, never a busy loop), or sooner when
    the job hinted when it next has work (``hint_s``: the planner, a node about to go silent)."""
    pause = max(interval_s - elapsed_s, 0.1 * interval_s)
    if hint_s is not None:
        pause = min(pause, max(hint_s + 0.05, 0.05))
    return pause


async def periodic(
    name: str,
    interval_s: float,
    job: Callable[[], Any],
    waker: Waker | None = None,
    failures: _Counter | None = None,
    runs: _Counter | None = None,
    durations: _Timings | None = None,
    executor: Executor | None = None,
    phase_s: float = 0.0,
    clock: Callable[[], float] | None = None,
) -> None:
    """Run ``job`` in a thread now and then every ``interval_s`` (sooner when ``waker`` is
    poked), until cancelled; with ``phase_s``, the second pass comes that much later, and the
    rest every ``interval_s`` after it. A failed pass is logged, counted on ``failures`` and
    retried; a completed one is counted on ``runs`` and its wall time observed on
    ``durations``. The thread is the loop's default pool's, or ``executor``'s. ``clock``: the
    loop's by default."""
    clock = clock or asyncio.get_running_loop().time
    while True:
        started = clock()
        hint: float | None = None
        try:
            if executor is None:
                result = await asyncio.to_thread(job)
            else:
                result = await asyncio.get_running_loop().run_in_executor(executor, job)
            logger.debug("%s: %s", name, result)
            if runs is not None:
                runs.inc()
            if durations is not None:
                durations.observe(clock() - started)
            # A job may know when it next has work (the planner: a node about to go silent).
            hint = getattr(result, "next_run_s", None)
        except Exception:
            if failures is not None:
                failures.inc()
            logger.exception("background job %s failed; retrying in %.0f s", name, interval_s)
        elapsed = clock() - started
        pause = next_pause(interval_s, elapsed, hint) + phase_s
        phase_s = 0.0
        if waker is None:
            await asyncio.sleep(pause)
        else:
            await waker.wait(pause)


@dataclass(frozen=True)
class Job:
    """One background job: what runs, how often, and where."""

    name: str
    interval_s: float
    run: Callable[[], Any]
    waker: Waker | None = None
    # Must succeed once before the first pass (the planner and the alerts: a fresh assessment).
    first: Callable[[], Any] | None = None
    # A job that keeps its own timer (refits): called with ``interval_s`` instead of ``periodic``.
    timer: Callable[[float], Coroutine[Any, Any, None]] | None = None
    # Its own thread (the urgent lane: never queued behind the other jobs' long passes in the
    # loop's default pool, which has cpu_count + 4 threads).
    executor: Executor | None = None
    # How much later than ``interval_s`` its second pass comes (every later one is
    # ``interval_s`` after the one before): keeps two heavy jobs of one interval apart.
    phase_s: float = 0.0
    # Work others wait on (the urgent lane): its passes run ahead of the other jobs' passes,
    # which give way to it (runtime/passes.py); every other job's passes give way.
    ahead: bool = False


class Scheduler:
    """Runs jobs as asyncio tasks: every process's from :meth:`start`, the leader's between
    :meth:`lead` and :meth:`stop_leading`.

    ``failures(job)`` and ``runs(job)`` give the counters of a job's failed and completed passes,
    ``durations(job)`` (optional) what observes each completed pass's wall time. Each pass
    runs in a :class:`PassContext` of ``precedence`` (its process's: the urgent lane first).
    """

    def __init__(
        self,
        *,
        failures: Callable[[str], _Counter],
        runs: Callable[[str], _Counter],
        durations: Callable[[str], _Timings] | None = None,
        precedence: Precedence = NO_PRECEDENCE,
    ) -> None:
        self._failures = failures
        self._precedence = precedence
        self._runs = runs
        self._durations = durations
        self._tasks: list[asyncio.Task[None]] = []
        self._leading: list[asyncio.Task[None]] = []
        self._in_flight = InFlight()

    def start(self, jobs: list[Job]) -> None:
        """Start jobs that run until :meth:`stop` (call in the event loop)."""
        self._tasks.extend(self._spawn(job) for job in jobs)

    def lead(self, jobs: list[Job]) -> None:
        """Start the leader's jobs, until :meth:`stop_leading` (call in the event loop)."""
        self._leading.extend(self._spawn(job) for job in jobs)

    def stop_leading(self) -> None:
        """Cancel the leader's jobs at once: a pass already in its worker thread finishes its
        transaction, no new one starts (the write jobs are idempotent and claim their rows in
        the database)."""
        for task in self._leading:
            task.cancel()
        self._leading.clear()

    async def stop(self, passes_timeout_s: float = 60.0) -> None:
        """Cancel every job, wait for the tasks to end and for the passes still running in
        their threads to finish (up to ``passes_timeout_s``: a whole-fleet pass takes seconds)."""
        tasks = [*self._tasks, *self._leading]
        self.stop_leading()
        self._tasks.clear()
        # Cancelled again until they end: a cancellation swallowed by code the job awaits (a
        # library's, an older asyncio's) must not hold up the shutdown for ever.
        pending = set(tasks)
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=1.0)
        if not await asyncio.to_thread(self._in_flight.wait, passes_timeout_s):
            logger.warning(
                "background passes still running %.0f s after shutdown", passes_timeout_s
            )

    def _spawn(self, job: Job) -> asyncio.Task[None]:
        return asyncio.create_task(self._loop(job), name=job.name)

    async def _loop(self, job: Job) -> None:
        if job.timer is not None:
            await job.timer(job.interval_s)
            return
        failures, runs = self._failures(job.name), self._runs(job.name)
        while job.first is not None:
            try:
                await asyncio.to_thread(self._pass_of(job, job.first))
                break
            except Exception:
                failures.inc()
                logger.exception(
                    "%s: no fresh assessment yet; retry in %.0f s", job.name, job.interval_s
                )
                await asyncio.sleep(job.interval_s)
        durations = self._durations(job.name) if self._durations is not None else None
        await periodic(
            job.name,
            job.interval_s,
            self._pass_of(job, job.run),
            job.waker,
            failures,
            runs,
            durations,
            job.executor,
            phase_s=job.phase_s,
        )

    def _pass_of(self, job: Job, run: Callable[[], Any]) -> Callable[[], Any]:
        """``run`` as one pass of ``job``: in its context, in its thread, counted in flight."""
        context = PassContext(job.name, self._precedence, ahead=job.ahead)

        def in_context() -> Any:
            with context.running():
                return run()

        return self._in_flight.wrap(in_context)
