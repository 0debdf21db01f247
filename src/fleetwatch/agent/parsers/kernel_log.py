"""Kernel log lines onto GPU events: ``NVRM: Xid`` reports and GPUs lost from the bus.

The event is looked for wherever ``NVRM:`` sits in the line, so any prefix works: bare lines,
``dmesg`` raw ``[ 1234.567890]``, ``dmesg -T`` ``[Fri Aug 30 11:43:09 2024]``, ``dmesg
--time-format=iso`` (with or without ``--decode``'s ``kern  :warn  :``), syslog/journal ``Jan  1
12:00:00 host kernel:`` (with or without an uptime stamp), raw ``/dev/kmsg`` records
(``6,3964,206764307,-;msg``) and alert wrappers around any of these. Xid bodies seen in the wild::

    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:19:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable ...
    NVRM: Xid (PCI:0000:02:00): 45, pid=1300, Ch 00000001             (old drivers: no name=)
    NVRM: Xid (PCI:0000:55:00): 154, GPU recovery action changed ...  (no pid at all)
    NVRM: Xid (0000:01:00): 13, Graphics Exception ...                (older: no "PCI:")

``NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.`` (no Xid number) becomes kind
``gpu_lost``. NVSwitch ``SXid`` lines, ``NVRM: GPU at PCI:...: GPU-<uuid>`` mapping lines and
device-plugin messages are not GPU events here (``None``).

Time: ``ts`` is a UTC datetime only when the prefix holds an absolute time
(:func:`fleetwatch.agent.parsers.log_time.line_time` says which stamps count); monotonic stamps
give ``ts=None``, and :func:`monotonic_seconds` reads them.

Control characters: a NUL or any other control character in a line (seen in a real log, inside
the process name) becomes U+FFFD before parsing (:func:`fleetwatch.agent.textclean.clean_text`),
so the event is kept and its text can be stored.

Bad lines: an ``NVRM: Xid`` line whose code cannot be read (a truncated line) raises
:class:`ParseError` from :func:`parse_kernel_line`; :func:`parse_kernel_log` collects those errors
next to the events instead of stopping, so a caller can keep the good events and report the rest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo

from fleetwatch.agent.parsers import KernelEvent, ParseError
from fleetwatch.agent.parsers.log_time import line_time
from fleetwatch.agent.parsers.log_time import monotonic_seconds as _monotonic_seconds
from fleetwatch.agent.parsers.pci_address import PCI_PATTERN, pci_address
from fleetwatch.agent.textclean import clean_text

__all__ = [
    "KernelLogResult",
    "monotonic_seconds",
    "parse_kernel_line",
    "parse_kernel_log",
]

_PCI = PCI_PATTERN

_XID_MARK = re.compile(r"NVRM: Xid\b")
_XID_RE = re.compile(rf"NVRM: Xid \((?:PCI:)?(?P<pci>{_PCI})\):\s*(?P<xid>\d+)\b(?P<body>.*)$")
# Fields after the code, each optional and in this order; whatever follows is the message.
_BODY_RE = re.compile(
    r"^(?:,\s*pid=(?P<pid>'?<unknown>'?|\d+))?(?:,\s*name=(?P<name>[^,]*))?[,\s]*(?P<msg>.*)$"
)
_LOST_TEXT = "fallen off the bus"
_LOST_RE = re.compile(rf"NVRM: GPU (?:at )?(?:PCI:)?(?P<pci>{_PCI}):\s*(?P<msg>.*)$")
# Newer drivers: "NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system
# has fallen off the bus ..." (one kmsg record; dmesg splits it over three NVRM: lines).
_ANY_GPU_PCI_RE = re.compile(rf"\bGPU (?:at )?(?:PCI:)?(?P<pci>{_PCI})\b")
_NVRM = "NVRM:"


@dataclass(frozen=True)
class KernelLogResult:
    """The GPU events of a log, in order, and the lines that looked like events but were not."""

    events: list[KernelEvent]
    errors: list[ParseError]  # each carries its 1-based line_number


def parse_kernel_log(
    text: str, *, year_hint: int | None = None, tz: tzinfo = UTC
) -> KernelLogResult:
    """Every GPU event in ``text`` with its line number; unreadable Xid lines go to ``errors``."""
    events: list[KernelEvent] = []
    errors: list[ParseError] = []
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            event = parse_kernel_line(line, year_hint=year_hint, tz=tz)
        except ParseError as exc:
            errors.append(ParseError(str(exc), line_number=number))
            continue
        if event is not None:
            event.line_number = number
            events.append(event)
    return KernelLogResult(events, errors)


def parse_kernel_line(
    line: str, *, year_hint: int | None = None, tz: tzinfo = UTC
) -> KernelEvent | None:
    """The GPU event one kernel log line reports, or ``None`` if it reports none."""
    line = clean_text(line.rstrip())
    mark = _XID_MARK.search(line)
    if mark is not None:
        return _xid_event(line, mark.start(), year_hint, tz)
    start = line.find(_NVRM)
    if start >= 0 and _LOST_TEXT in line:
        return _lost_event(line, start, year_hint, tz)
    return None


def monotonic_seconds(line: str) -> float | None:
    """Seconds since boot from a ``[ 1234.567890]`` stamp or a raw kmsg record, if present."""
    return _monotonic_seconds(line, before=_NVRM)


def _xid_event(line: str, start: int, year_hint: int | None, tz: tzinfo) -> KernelEvent:
    match = _XID_RE.match(line, start)
    if match is None:
        raise ParseError(f"cannot read the Xid code and PCI id in {line[start:][:120]!r}")
    body = _BODY_RE.match(match["body"])
    assert body is not None  # every part of _BODY_RE is optional, so it matches any text
    pid, name = body["pid"], body["name"]
    process = name.strip() if name is not None else None
    return KernelEvent(
        kind="xid",
        xid=int(match["xid"]),
        pci_bus_id=_pci(match["pci"]),
        message=body["msg"].strip(),
        ts=_timestamp(line[:start], year_hint, tz),
        pid=int(pid) if pid is not None and pid.isdigit() else None,
        process=process if process and process != "<unknown>" else None,
    )


def _lost_event(line: str, start: int, year_hint: int | None, tz: tzinfo) -> KernelEvent:
    match = _LOST_RE.match(line, start)
    if match is not None:
        pci: str | None = _pci(match["pci"])
        message = match["msg"]
    else:
        named = _ANY_GPU_PCI_RE.search(line, start)
        pci = _pci(named["pci"]) if named is not None else None
        message = line[start + len(_NVRM) :]
    return KernelEvent(
        kind="gpu_lost",
        pci_bus_id=pci,
        message=message.strip(),
        ts=_timestamp(line[:start], year_hint, tz),
    )


def _pci(value: str) -> str:
    # The kernel prints the bus id without its function ("0000:3b:00"); a GPU is function 0.
    return pci_address(value)


def _timestamp(prefix: str, year_hint: int | None, tz: tzinfo) -> datetime | None:
    return line_time(prefix, year_hint=year_hint, tz=tz)
