"""Renders each new assessment's risk series for /metrics in the background.

The default page's node probabilities and at-risk counts need every GPU scored at every horizon
of ``risk_horizons_h``: seconds at 100,000 GPUs. Rendered when a scrape first asks, that cost
would land on the first scrape after every assessment (one in two at a 30 s assessment and a
15 s scrape). This thread renders a snapshot as soon as the assessor publishes it. A scrape that
arrives meanwhile waits for that render (a snapshot's memo is computed once, under its lock), so
the page never shows an older snapshot's risk than the newest assessment.

Only a process whose default page is scraped renders: one nobody scraped for ``active_for_s``
(an API process behind a load balancer that Prometheus does not scrape, say) would otherwise
render every snapshot it adopts or patches for no one (a fifth of such a process's CPU at
100,000 GPUs, sampled with py-spy). Its first scrape after that renders on demand, as without
the prefetch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from fleetwatch.server.judge.assessment import FleetAssessment
from fleetwatch.server.metrics.risk_exposition import render_risk

__all__ = ["RiskPrefetch"]

logger = logging.getLogger(__name__)


# Longer than any scrape interval in use (Prometheus' default is 1 min; 15-30 s is common).
ACTIVE_FOR_S = 600.0


class RiskPrefetch:
    """Polls ``latest()`` every ``poll_s`` and renders each new snapshot's risk series once,
    while the default page was scraped (:meth:`scraped`) within ``active_for_s``."""

    def __init__(
        self,
        latest: Callable[[], FleetAssessment | None],
        horizons_h: Sequence[float],
        *,
        poll_s: float = 1.0,
        active_for_s: float = ACTIVE_FOR_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._latest = latest
        self._horizons_h = list(horizons_h)
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
        """Render the newest snapshot unless it was rendered already or no one scrapes this
        process; True if it rendered."""
        snapshot = self._latest()
        if snapshot is None or snapshot is self._done or not self.is_active():
            return False
        render_risk(snapshot, self._horizons_h)
        self._done = snapshot
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="metrics-risk-prefetch", daemon=True)
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
                logger.exception("rendering the risk series of /metrics failed")
