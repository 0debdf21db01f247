"""Builds the default /metrics page's slow parts in the background, ahead of the scrapes.

The default page's node probabilities and at-risk counts need every GPU scored at every horizon
of ``risk_horizons_h``: seconds at 100,000 GPUs. Rendered when a scrape first asks, that cost
would land on the first scrape after every assessment (one in two at a 30 s assessment and a
15 s scrape). This thread renders a snapshot as soon as the assessor publishes it. A scrape that
arrives meanwhile waits for that render (a snapshot's memo is computed once, under its lock), so
the page never shows an older snapshot's risk than the newest assessment. The same thread keeps
the other parts that are computed now and then (``refreshers``: the availability figures) fresh,
so that no scrape waits for them either.

A process renders while its default page was scraped within ``active_for_s``, or while
``warm_while()`` says so: the leader, which builds every snapshot itself (nothing to decode)
and is the process a single-process deployment's Prometheus scrapes, keeps the page warm from
its start, so that even its first scrape finds it built. Any other process nobody scraped for
``active_for_s`` (an API process behind a load balancer that Prometheus does not scrape, say)
would otherwise render every snapshot it adopts or patches for no one (a fifth of such a
process's CPU at 100,000 GPUs, sampled with py-spy). Its first scrape after that renders on
demand.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from fleetwatch.server.judge.assessment import FleetAssessment
from fleetwatch.server.metrics.risk_exposition import render_risk

__all__ = ["PagePrefetch"]

logger = logging.getLogger(__name__)


# Longer than any scrape interval in use (Prometheus' default is 1 min; 15-30 s is common).
ACTIVE_FOR_S = 600.0


class PagePrefetch:
    """Polls ``latest()`` every ``poll_s`` and renders each new snapshot's risk series once, and
    calls each of ``refreshers`` (each cheap while what it refreshes is fresh), while the
    default page was scraped (:meth:`scraped`) within ``active_for_s`` or ``warm_while()``."""

    def __init__(
        self,
        latest: Callable[[], FleetAssessment | None],
        horizons_h: Sequence[float],
        *,
        refreshers: Sequence[Callable[[], object]] = (),
        warm_while: Callable[[], bool] = lambda: False,
        poll_s: float = 1.0,
        active_for_s: float = ACTIVE_FOR_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._latest = latest
        self._horizons_h = list(horizons_h)
        self._refreshers = list(refreshers)
        self._warm_while = warm_while
        self._poll_s = poll_s
        self._active_for_s = active_for_s
        self._clock = clock
        self._scraped_at: float | None = None
        self._done: FleetAssessment | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def scraped(self) -> None:
        """The default page was asked for now."""
        self._scraped_at = self._clock()

    def is_active(self) -> bool:
        """Whether the default page was scraped within ``active_for_s``."""
        scraped_at = self._scraped_at
        return scraped_at is not None and self._clock() - scraped_at <= self._active_for_s

    def prefetch_once(self) -> bool:
        """Refresh the other parts and render the newest snapshot unless it was rendered already,
        while someone scrapes this process or it keeps warm; True if it rendered a snapshot."""
        if not (self.is_active() or self._warm_while()):
            return False
        for refresh in self._refreshers:
            refresh()
        snapshot = self._latest()
        if snapshot is None or snapshot is self._done:
            return False
        render_risk(snapshot, self._horizons_h)
        self._done = snapshot
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="metrics-page-prefetch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                self.prefetch_once()
            except Exception:  # noqa: BLE001 - a scrape renders it instead; keep polling
                logger.exception("building the default /metrics page ahead of scrapes failed")
