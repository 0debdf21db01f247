"""Renders each new assessment's risk series for /metrics in the background.

The default page's node probabilities and at-risk counts need every GPU scored at every horizon
of ``risk_horizons_h``: seconds at 100,000 GPUs. Rendered when a scrape first asks, that cost
would land on the first scrape after every assessment (one in two at a 30 s assessment and a
15 s scrape). This thread renders a snapshot as soon as the assessor publishes it. A scrape that
arrives meanwhile waits for that render (a snapshot's memo is computed once, under its lock), so
the page never shows an older snapshot's risk than the newest assessment.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from fleetwatch.server.judge.assessment import FleetAssessment
from fleetwatch.server.metrics.risk_exposition import render_risk

__all__ = ["RiskPrefetch"]

logger = logging.getLogger(__name__)


class RiskPrefetch:
    """Polls ``latest()`` every ``poll_s`` and renders each new snapshot's risk series once."""

    def __init__(
        self,
        latest: Callable[[], FleetAssessment | None],
        horizons_h: Sequence[float],
        *,
        poll_s: float = 1.0,
    ) -> None:
        self._latest = latest
        self._horizons_h = list(horizons_h)
        self._poll_s = poll_s
        self._done: FleetAssessment | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def prefetch_once(self) -> bool:
        """Render the newest snapshot unless it was rendered already; True if it rendered."""
        snapshot = self._latest()
        if snapshot is None or snapshot is self._done:
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
