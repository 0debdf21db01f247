"""The kernel log: ``NVRM: Xid`` lines and GPUs fallen off the bus, pushed the moment they appear.

Counters miss the events that kill a node; the kernel log does not. As a :class:`Watcher`, a
thread polls the log every ``poll_s`` and hands new events to the agent at once (coalesced per
poll, so a flood of 800,000 Xid 95 lines becomes a few batches a second, not 800,000 pushes).
Without a watcher (``fleetwatch agent --once``), ``collect`` reads what is new.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import ClassVar

from fleetwatch.agent.collectors.base import Collection, EmitEvents
from fleetwatch.agent.kmsg import LineSource
from fleetwatch.agent.parsers import KernelEvent, ParseError
from fleetwatch.agent.parsers.kernel_log import parse_kernel_line
from fleetwatch.errors import CollectorError
from fleetwatch.telemetry import Event

__all__ = ["KernelLogCollector"]

logger = logging.getLogger(__name__)


class KernelLogCollector:
    name: ClassVar[str] = "kernel-log"

    def __init__(
        self, source: LineSource, *, clock: Callable[[], datetime], poll_s: float = 0.1
    ) -> None:
        self._source = source
        self._clock = clock
        self._poll_s = poll_s
        self._lock = threading.Lock()  # the source is read by one thread at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.bad_lines = 0
        self.read_errors = 0

    def read_events(self) -> list[Event]:
        with self._lock:
            lines = self._source.read_lines()
        now = self._clock()
        events = []
        for line in lines:
            try:
                found = parse_kernel_line(line)
            except ParseError as exc:
                self.bad_lines += 1
                logger.warning("unreadable Xid line in the kernel log (%s): %r", exc, line[:200])
                continue
            if found is not None:
                events.append(_to_event(found, now))
        return events

    def collect(self, now: datetime) -> Collection:
        if self._thread is not None:
            return Collection()  # the watcher already delivered them
        return Collection(events=self.read_events())

    def start_watch(self, emit: EmitEvents) -> None:
        def watch() -> None:
            while not self._stop.wait(self._poll_s):
                try:
                    events = self.read_events()
                except (CollectorError, OSError) as exc:
                    # The watcher must outlive a bad read: it is how fatal Xids reach us.
                    self.read_errors += 1
                    logger.warning("reading the kernel log failed: %s", exc)
                    continue
                if events:
                    emit(events)

        self._thread = threading.Thread(target=watch, name="kernel-log", daemon=True)
        self._thread.start()

    def stop_watch(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def close(self) -> None:
        self._source.close()


def _to_event(found: KernelEvent, now: datetime) -> Event:
    return Event(
        kind=found.kind,
        # A monotonic stamp has no date: the moment we read the line is within one poll of it.
        ts=found.ts or now,
        xid=found.xid,
        pci_bus_id=found.pci_bus_id,
        message=found.message[:4096] if found.message else None,
        pid=found.pid,
        process=found.process[:256] if found.process else None,
    )
