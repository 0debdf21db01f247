"""Every event the kernel log tells of, from all its sources, line by line or from a whole file.

:class:`KernelLogReader` reads lines in order and hands back events as they are complete: Xid
lines and GPUs fallen off the bus (:mod:`~fleetwatch.agent.parsers.kernel_log`), NVSwitch SXids
(:mod:`~fleetwatch.agent.parsers.sxid`), EDAC counts (:mod:`~fleetwatch.agent.parsers.edac`),
machine checks (:mod:`~fleetwatch.agent.parsers.machine_check`) and PCIe AER records
(:mod:`~fleetwatch.agent.parsers.pcie_aer`); multi-line records are put together by
:mod:`~fleetwatch.agent.parsers.kernel_records`. A line that names a source but whose essential
fields cannot be read (a cut ``SXid (PCI:0000:06:0`` line, an unknown AER severity) is an error
with its line number; the reader goes on. :func:`parse_kernel_events` reads a whole text.

Newer drivers print a lost GPU over three ``NVRM:`` lines in ``dmesg`` (``The NVIDIA GPU
0000:b3:00.0`` / ``(PCI ID: 10de:26b5) installed in this system has`` / ``fallen off the bus and
is not responding to commands.``): the address on the first line is given to the event of the
third.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, tzinfo

from fleetwatch.agent.parsers import KernelEvent, ParseError
from fleetwatch.agent.parsers.edac import read_edac_line
from fleetwatch.agent.parsers.kernel_log import KernelLogResult, parse_kernel_line
from fleetwatch.agent.parsers.kernel_records import Reading, RecordAssembler, Single
from fleetwatch.agent.parsers.machine_check import read_machine_check_line
from fleetwatch.agent.parsers.pci_address import PCI_PATTERN, pci_address
from fleetwatch.agent.parsers.pcie_aer import read_aer_line
from fleetwatch.agent.parsers.sxid import read_sxid_line
from fleetwatch.agent.textclean import clean_text

__all__ = ["KernelLogReader", "parse_kernel_events"]

_GRAMMARS = (read_sxid_line, read_edac_line, read_machine_check_line, read_aer_line)
_NVIDIA_GPU_RE = re.compile(rf"NVRM: The NVIDIA GPU (?P<pci>{PCI_PATTERN})\b")
_LOST_LINES = 3  # the lost-GPU message spans three lines


class KernelLogReader:
    """Reads kernel log lines in order; ``feed`` returns the events completed so far."""

    def __init__(self, *, year_hint: int | None = None, tz: tzinfo = UTC) -> None:
        self._year_hint = year_hint
        self._tz = tz
        self._records = RecordAssembler()
        self._line = 0
        self._lost_gpu: tuple[int, str] | None = None  # (line, address) of "The NVIDIA GPU ..."

    @property
    def lines_read(self) -> int:
        return self._line

    def feed(self, line: str) -> tuple[list[KernelEvent], list[ParseError]]:
        self._line += 1
        number = self._line
        line = clean_text(line.rstrip())
        try:
            reading = self._read(line, number)
        except ParseError as exc:
            return self._records.add_nothing(number), [ParseError(str(exc), line_number=number)]
        if reading is None:
            return self._records.add_nothing(number), []
        return self._records.add(reading, number), []

    def feed_all(self, lines: Iterable[str]) -> tuple[list[KernelEvent], list[ParseError]]:
        """Every line, then :meth:`flush`: the events of these lines, in line order."""
        events: list[KernelEvent] = []
        errors: list[ParseError] = []
        for line in lines:
            found, bad = self.feed(line)
            events += found
            errors += bad
        events += self.flush()
        events.sort(key=lambda e: e.line_number or 0)
        return events, errors

    def flush(self, *, final: bool = True) -> list[KernelEvent]:
        """Close every open record: at the end of the input (``final``), or when a poll finds
        nothing new (then a lone notice waits for one more such poll)."""
        return self._records.flush(self._line, final=final)

    def _read(self, line: str, number: int) -> Reading | None:
        event = parse_kernel_line(line, year_hint=self._year_hint, tz=self._tz)
        if event is not None:
            if event.kind == "gpu_lost" and event.pci_bus_id is None:
                event.pci_bus_id = self._recent_lost_gpu(number)
            return Single(event)
        if (named := _NVIDIA_GPU_RE.search(line)) is not None:
            self._lost_gpu = (number, pci_address(named["pci"]))
            return None
        for grammar in _GRAMMARS:
            reading = grammar(line, self._year_hint, self._tz)
            if reading is not None:
                return reading
        return None

    def _recent_lost_gpu(self, number: int) -> str | None:
        if self._lost_gpu is None or number - self._lost_gpu[0] >= _LOST_LINES:
            return None
        return self._lost_gpu[1]


def parse_kernel_events(
    text: str, *, year_hint: int | None = None, tz: tzinfo = UTC
) -> KernelLogResult:
    """Every event in ``text``, in line order, and the lines that named a source but were
    unreadable (each :class:`ParseError` carries its 1-based ``line_number``)."""
    reader = KernelLogReader(year_hint=year_hint, tz=tz)
    events, errors = reader.feed_all(text.splitlines())
    return KernelLogResult(events, errors)
