"""GPU telemetry and Xid events through NVML; :mod:`fleetwatch.agent.nvml` does the reading."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from datetime import datetime
from typing import ClassVar

from fleetwatch.agent.collectors.base import Collection, EmitEvents
from fleetwatch.agent.nvml import Nvml

__all__ = ["NvmlCollector"]

logger = logging.getLogger(__name__)


class NvmlCollector:
    """Every GPU's identity and sample each interval; Xid and double-bit ECC events at once.

    Opening NVML happens here, so a node without a driver fails at startup with
    :class:`~fleetwatch.errors.NvmlUnavailable` rather than at the first tick.
    """

    name: ClassVar[str] = "nvml"

    def __init__(self, nvml: Nvml | None = None, *, event_timeout_ms: int = 500) -> None:
        self._nvml = (nvml or Nvml()).open()
        self._event_timeout_ms = event_timeout_ms
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def errors(self) -> Counter[tuple[str, str]]:
        """Failures by (collector, reason), for ``fleetwatch_agent_collector_errors_total``."""
        return self._nvml.errors

    def collect(self, now: datetime) -> Collection:
        read = self._nvml.read_all(now)
        lost = [gpu.to_event(now) for gpu in read.lost if gpu.new]
        return Collection(gpus=read.gpus, samples=read.samples, events=lost)

    def start_watch(self, emit: EmitEvents) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._watch, args=(emit,), name="fleetwatch-nvml-events", daemon=True
        )
        self._thread.start()

    def stop_watch(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self._event_timeout_ms / 1000 + 1)
            if self._thread.is_alive():
                logger.warning("the NVML event thread did not stop")
            self._thread = None

    def close(self) -> None:
        self.stop_watch()
        self._nvml.close()

    def _watch(self, emit: EmitEvents) -> None:
        for event in self._nvml.watch_events(self._stop, timeout_ms=self._event_timeout_ms):
            emit([event])
