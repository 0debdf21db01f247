"""Kernel log records that span several lines, put back together from a stream of lines.

An NVSwitch SXid, a PCIe AER report and a machine check are each printed as a head line followed
by lines that add to it (``Severity``/``Data`` lines, ``error status/mask`` and one line per error
bit, ``TSC``/``ADDR``/``PROCESSOR``). Records of several devices interleave, a decoder's line can
fall in the middle of another record, and a capture can start in the middle of one. Grammars
(one module per source) say what each line is:

- :class:`Single`: a complete event (an Xid line, an EDAC count line);
- :class:`Head`: the start of a record, keyed by its source (switch and code, PCI device, ...);
  a new head with the same key closes the previous record;
- :class:`Part`: a line that adds to the open record with its key. With no such record it is
  absorbed if that record closed within :data:`WINDOW` lines (its head was emitted already),
  else ``orphan`` may start a partial record from what the line says alone;
- :class:`Notice`: a line that tells of a record printed just before or after it
  (``mce: Machine check events logged``): claimed by an open record of its kind, or by the next
  head of that kind within the window; otherwise an event of its own. A ``before_only`` notice
  (an AER port's announcement) is claimed only by the next head, never by an open record.

A record closes when no line has added to it for :data:`WINDOW` lines, when a head with its key
arrives, or at a flush (end of a file; in the agent, a poll that finds no new line). A notice
no record claimed stands alone at the end of a file, or at the second flush in a row that finds
it unclaimed: the kernel prints a notice and its record microseconds apart, and one quiet poll
between them must not split them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fleetwatch.agent.parsers import KernelEvent, ParseError

__all__ = [
    "WINDOW",
    "Head",
    "LineGrammar",
    "Notice",
    "Part",
    "Record",
    "Reading",
    "RecordAssembler",
    "Single",
    "unreadable",
]

# Lines a record stays open without news. The longest record in the real captures spans 12
# lines, and interleaved records of other devices are within a few lines of each other.
WINDOW = 20


@dataclass
class Record:
    """An open multi-line record: what its lines said so far, and how to make its event."""

    kind: str
    key: str
    first_line: int
    ts: datetime | None
    fields: dict[str, Any]
    finish: Callable[[Record], KernelEvent | None]
    last_line: int = 0
    notices: list[KernelEvent] = field(default_factory=list)


@dataclass(frozen=True)
class Single:
    event: KernelEvent


@dataclass(frozen=True)
class Head:
    record: Record


@dataclass(frozen=True)
class Part:
    key: str
    apply: Callable[[dict[str, Any]], None]
    orphan: Callable[[], Record] | None = None


@dataclass(frozen=True)
class Notice:
    kind: str
    event: KernelEvent
    before_only: bool = False


Reading = Single | Head | Part | Notice
LineGrammar = Callable[[str, int | None, Any], Reading | None]


@dataclass
class _Pending:
    line: int
    notice: Notice
    flushes: int = 0


@dataclass
class RecordAssembler:
    """Feeds readings in line order; hands back events as their records close."""

    window: int = WINDOW
    _open: dict[str, Record] = field(default_factory=dict)
    _closed_at: dict[str, int] = field(default_factory=dict)
    _pending: list[_Pending] = field(default_factory=list)

    def add(self, reading: Reading, line: int) -> list[KernelEvent]:
        out = self._expire(line)
        if isinstance(reading, Single):
            reading.event.line_number = line
            out.append(reading.event)
        elif isinstance(reading, Head):
            out += self._close(reading.record.key, line)
            record = reading.record
            record.first_line = record.last_line = line
            self._open[record.key] = record
            self._claim_pending(record)
        elif isinstance(reading, Part):
            out += self._add_part(reading, line)
        else:
            self._add_notice(reading, line, out)
        return out

    def add_nothing(self, line: int) -> list[KernelEvent]:
        """A line that is no part of any record: records may close of old age."""
        return self._expire(line)

    def flush(self, line: int, *, final: bool = True) -> list[KernelEvent]:
        """Close every open record; hand on the unclaimed notices if ``final`` or if they were
        unclaimed at the previous flush already."""
        out: list[KernelEvent] = []
        for key in list(self._open):
            out += self._close(key, line)
        for pending in list(self._pending):
            if final or pending.flushes >= 1:
                pending.notice.event.line_number = pending.line
                out.append(pending.notice.event)
                self._pending.remove(pending)
            else:
                pending.flushes += 1
        return out

    def _add_part(self, part: Part, line: int) -> list[KernelEvent]:
        record = self._open.get(part.key)
        if record is None:
            closed = self._closed_at.get(part.key)
            if closed is not None and line - closed <= self.window:
                return []  # the rest of a record already handed on
            if part.orphan is None:
                return []
            record = part.orphan()
            record.first_line = line
            self._open[part.key] = record
        part.apply(record.fields)
        record.last_line = line
        return []

    def _add_notice(self, notice: Notice, line: int, out: list[KernelEvent]) -> None:
        records = [r for r in self._open.values() if r.kind == notice.kind]
        if records and not notice.before_only:
            newest = max(records, key=lambda r: r.last_line)
            newest.notices.append(notice.event)
            newest.last_line = line
            return
        self._pending.append(_Pending(line, notice))

    def _claim_pending(self, record: Record) -> None:
        # The newest notice of the record's kind is its own; older ones stand alone when they
        # expire (an announcement whose record never came).
        mine = [p for p in self._pending if p.notice.kind == record.kind]
        if mine:
            record.notices.append(mine[-1].notice.event)
            self._pending.remove(mine[-1])

    def _close(self, key: str, line: int) -> list[KernelEvent]:
        record = self._open.pop(key, None)
        if record is None:
            return []
        self._closed_at[key] = line
        event = record.finish(record)
        if event is None:
            return []
        event.line_number = record.first_line
        return [event]

    def _expire(self, line: int) -> list[KernelEvent]:
        out: list[KernelEvent] = []
        for key, record in list(self._open.items()):
            if line - record.last_line > self.window:
                out += self._close(key, line)
        for pending in [p for p in self._pending if line - p.line > self.window]:
            pending.notice.event.line_number = pending.line
            out.append(pending.notice.event)
            self._pending.remove(pending)
        for key in [k for k, at in self._closed_at.items() if line - at > self.window]:
            del self._closed_at[key]
        return out


def unreadable(what: str, text: str) -> ParseError:
    """The error for a line that names a source but whose essential fields cannot be read."""
    return ParseError(f"cannot read {what} in {text[:120]!r}")
