"""The urgent lane and /metrics scrapes run ahead of the whole-fleet passes of their process.

Every background pass of a process shares one interpreter, and so one GIL: while the lifecycle
opens 100,000 new lifetimes beside the assessment reading every GPU, the planner and the alerts,
the urgent lane's thread got a fifth of the interpreter at best, and each of its few dozen
database round trips waited its turn for it again (fleet-scale runs 37 and 38: the one Xid probe
that met the lifecycle's first pass over a new fleet took 3.4 s and 7.4 s to its eviction, the
others 0.2 to 1.5 s).

A /metrics scrape is waited on too (Prometheus times out a target at its scrape timeout): a
shard of 3,125 GPUs, 0.3 s of CPU alone, took 1.2 s on the leader beside those passes
(fleet-scale runs 40 and 41).

So a whole-fleet pass calls :meth:`Precedence.give_way` at points where it holds nothing the
urgent lane or a page needs (no lock of the judge's windows, of the planner or of the alerts; no
SQLite writer lock: on SQLite, where one writer lock orders every write anyway, precedence is
off); while an urgent pass or a page runs (:meth:`Precedence.ahead`), giving way waits for it to
end, at most ``max_wait_s``, so that a stuck one cannot stop the fleet's passes. The time waited
is counted (``fleetwatch_background_gave_way_seconds_total``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

__all__ = ["MAX_WAIT_S", "MIN_RUN_S", "NO_PRECEDENCE", "Precedence"]

# A pass that just gave way runs this long before it gives way again: scrapes arriving back to
# back (32 shards, two Prometheus replicas) never stop the fleet's passes for good.
MIN_RUN_S = 0.25
# An urgent pass or a shard takes 0.1 to 0.5 s at 100,000 GPUs; one longer than this (an Xid
# storm's 64 nodes) shares the interpreter again.
MAX_WAIT_S = 2.0


class _Counter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class Precedence:
    """Whole-fleet passes give way while work that is waited on runs."""

    def __init__(
        self,
        *,
        enabled: bool = True,
        max_wait_s: float = MAX_WAIT_S,
        waited: _Counter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = enabled
        self.max_wait_s = max_wait_s
        self._waited = waited
        self._clock = clock
        # The threads running ahead now (ident -> how many): their own :meth:`give_way`, in code
        # the urgent lane shares with the whole-fleet passes, never waits.
        self._ahead: dict[int, int] = {}
        self._done = threading.Condition()
        self._waiting = 0  # threads waiting in give_way now
        self._resumed = threading.local()  # when this thread last stopped giving way

    @property
    def running_ahead(self) -> bool:
        return bool(self._ahead)

    @property
    def waiting(self) -> int:
        """Threads giving way now."""
        return self._waiting

    @contextmanager
    def ahead(self) -> Iterator[None]:
        """Work waited on in this thread (an urgent pass, a page): other threads giving way
        wait until it ends."""
        me = threading.get_ident()
        with self._done:
            self._ahead[me] = self._ahead.get(me, 0) + 1
        try:
            yield
        finally:
            with self._done:
                left = self._ahead.pop(me) - 1
                if left:
                    self._ahead[me] = left
                elif not self._ahead:
                    self._done.notify_all()

    def give_way(self) -> None:
        """Wait while work runs ahead in another thread (at most ``max_wait_s``); at once
        otherwise, and within :data:`MIN_RUN_S` of this thread's last wait."""
        if not self.enabled or not self._ahead:  # the common case: no lock taken
            return
        if threading.get_ident() in self._ahead:
            return
        started = self._clock()
        resumed: float | None = getattr(self._resumed, "at", None)
        if resumed is not None and started - resumed < MIN_RUN_S:
            return
        with self._done:
            self._waiting += 1
            try:
                self._done.wait_for(lambda: not self._ahead, timeout=self.max_wait_s)
            finally:
                self._waiting -= 1
        self._resumed.at = ended = self._clock()
        if self._waited is not None:
            self._waited.inc(ended - started)


# For the parts built without a process's precedence (tests, one-off passes): never waits.
NO_PRECEDENCE = Precedence(enabled=False)
