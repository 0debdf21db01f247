"""The kernel log: Xid lines, GPUs fallen off the bus, NVSwitch SXids, PCIe AER, machine checks
and EDAC counts (:mod:`fleetwatch.agent.parsers.kernel_events`).

Counters miss the events that kill a node; the kernel log does not. As a :class:`Watcher`, a
thread polls the log every ``poll_s`` and hands critical events (:func:`~fleetwatch.agent.
batching.is_critical`: every Xid, a lost GPU, a fatal SXid or AER error) to the agent at once,
coalesced per poll, so a flood of 800,000 Xid 95 lines becomes a few batches a second, not
800,000 pushes. Routine events (corrected AER, EDAC counts, machine checks, non-fatal SXids) go
to ``routine_sink`` when the agent sets one (it keeps them in the spool at once, to ride with
the next push, so a storm of corrected errors is neither lost nor pushed line by line); without
a sink they are handed over with the critical ones. Without a watcher (``fleetwatch agent
--once``), ``collect`` reads what is new.

Records that span lines are put together across reads. The watcher closes open records at the
first poll that finds no new line (one poll after the record's last line, as the kernel prints a
record at once), or when a log flood has moved on by the reader's window; ``collect`` without a
watcher closes them at the end of each read.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import ClassVar

from pydantic import ValidationError

from fleetwatch.agent.batching import split_critical
from fleetwatch.agent.collectors.base import Collection, EmitEvents
from fleetwatch.agent.kmsg import LineSource
from fleetwatch.agent.parsers import KernelEvent
from fleetwatch.agent.parsers.kernel_events import KernelLogReader
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
        self._lock = threading.Lock()  # the source and the reader are used by one thread at a time
        self._reader = KernelLogReader()
        self.routine_sink: EmitEvents | None = None  # set by the agent before start_watch
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.bad_lines = 0
        self.read_errors = 0

    def read_events(self, *, close_records: bool = True) -> list[Event]:
        """Every event completed by the lines appended since the last read, in log order; open
        records are closed at the end unless ``close_records`` is false and lines were read."""
        with self._lock:
            lines = self._source.read_lines()
            found: list[KernelEvent] = []
            for line in lines:
                events, errors = self._reader.feed(line)
                found += events
                for error in errors:
                    self.bad_lines += 1
                    logger.warning("unreadable line in the kernel log (%s): %r", error, line[:200])
            if close_records or not lines:
                found += self._reader.flush(final=close_records)
        now = self._clock()
        found.sort(key=lambda e: e.line_number or 0)
        return [event for event in (self._wire_event(e, now) for e in found) if event is not None]

    def _wire_event(self, found: KernelEvent, now: datetime) -> Event | None:
        """The record as an event, or None where the wire cannot carry it (a bank number past
        64 bits, say): such a record is counted and logged as an unreadable line, and the rest
        of the read, a fatal Xid beside it included, is delivered all the same."""
        try:
            return _to_event(found, now)
        except ValidationError as exc:
            self.bad_lines += 1
            problem = exc.errors()[0]
            where = ".".join(str(part) for part in problem["loc"])
            logger.warning(
                "kernel-log %s record left out: %s: %s (%r)",
                found.kind,
                where,
                problem["msg"],
                (found.message or "")[:200],
            )
            return None

    def collect(self, now: datetime) -> Collection:
        if self._thread is not None:
            return Collection()  # the watcher already delivered them
        return Collection(events=self.read_events())

    def start_watch(self, emit: EmitEvents) -> None:
        def watch() -> None:
            while not self._stop.wait(self._poll_s):
                try:
                    events = self.read_events(close_records=False)
                except (CollectorError, OSError) as exc:
                    # The watcher must outlive a bad read: it is how fatal Xids reach us.
                    self.read_errors += 1
                    logger.warning("reading the kernel log failed: %s", exc)
                    continue
                routine: list[Event] = []
                if self.routine_sink is None:
                    critical = events
                else:
                    critical, routine = split_critical(events)
                if critical:
                    emit(critical)
                if routine and self.routine_sink is not None:
                    self.routine_sink(routine)

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
        details=found.details,
    )
