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

Time: ``ts`` is a UTC datetime only when the prefix holds an absolute time. Stamps without a zone
(``dmesg -T``, syslog) are read in ``tz`` (default UTC); a syslog stamp has no year, so
``year_hint`` or else the current year is used. Monotonic stamps (``[ 1234.5]``, kmsg's usec)
give ``ts=None``; :func:`monotonic_seconds` reads them so a caller who knows the boot time can
convert them.

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
from datetime import UTC, datetime, timedelta, timezone, tzinfo

from fleetwatch.agent.parsers import KernelEvent, ParseError
from fleetwatch.agent.textclean import clean_text
from fleetwatch.telemetry import normalize_pci_bus_id

__all__ = [
    "KernelLogResult",
    "monotonic_seconds",
    "parse_kernel_line",
    "parse_kernel_log",
]

_MONTHS = {
    name: number
    for number, name in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"),
        start=1,
    )
}
_MONTH = "(?P<mon>" + "|".join(_MONTHS) + ")"
_PCI = r"[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}(?:\.[0-7])?"

_XID_MARK = re.compile(r"NVRM: Xid\b")
_XID_RE = re.compile(rf"NVRM: Xid \((?:PCI:)?(?P<pci>{_PCI})\):\s*(?P<xid>\d+)\b(?P<body>.*)$")
# Fields after the code, each optional and in this order; whatever follows is the message.
_BODY_RE = re.compile(
    r"^(?:,\s*pid=(?P<pid>'?<unknown>'?|\d+))?(?:,\s*name=(?P<name>[^,]*))?[,\s]*(?P<msg>.*)$"
)
_LOST_TEXT = "fallen off the bus"
_LOST_RE = re.compile(rf"NVRM: GPU (?:at )?(?:PCI:)?(?P<pci>{_PCI}):\s*(?P<msg>.*)$")
_NVRM = "NVRM:"

_TIME = r"(?P<h>\d{2}):(?P<m>\d{2}):(?P<s>\d{2})"
_ISO_RE = re.compile(
    rf"(?P<y>\d{{4}})-(?P<mo>\d{{2}})-(?P<d>\d{{2}})[T ]{_TIME}(?:[.,](?P<frac>\d+))?"
    r"(?P<zone>Z|[+-]\d{2}:?\d{2})?"
)
_CTIME_RE = re.compile(
    rf"\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) {_MONTH} +(?P<d>\d{{1,2}}) {_TIME}(?: (?P<y>\d{{4}}))?\]"
)
_SYSLOG_RE = re.compile(
    rf"(?:^|\s){_MONTH} +(?P<d>\d{{1,2}}) {_TIME}(?:\.(?P<frac>\d+))?\s+(?:\S+\s+)?kernel:"
)
_UPTIME_RE = re.compile(r"\[\s*(?P<sec>\d+\.\d+)\]")
_KMSG_RE = re.compile(r"^\d+,\d+,(?P<usec>\d+),[^;]*;")


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
    kmsg = _KMSG_RE.match(line)
    if kmsg is not None:
        return int(kmsg["usec"]) / 1_000_000
    start = line.find(_NVRM)
    uptime = _UPTIME_RE.search(line if start < 0 else line[:start])
    return float(uptime["sec"]) if uptime is not None else None


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
    return KernelEvent(
        kind="gpu_lost",
        pci_bus_id=_pci(match["pci"]) if match is not None else None,
        message=(match["msg"] if match is not None else line[start + len(_NVRM) :]).strip(),
        ts=_timestamp(line[:start], year_hint, tz),
    )


def _pci(value: str) -> str:
    # The kernel prints the bus id without its function ("0000:3b:00"); a GPU is function 0.
    if "." not in value:
        value += ".0"
    try:
        return normalize_pci_bus_id(value)
    except ValueError as exc:
        raise ParseError(str(exc)) from exc


def _timestamp(prefix: str, year_hint: int | None, tz: tzinfo) -> datetime | None:
    """The absolute time in the text before ``NVRM:``, as UTC; ``None`` if it holds none."""
    if iso := _ISO_RE.search(prefix):
        zone = _zone(iso["zone"]) or tz
        fields = (int(iso["y"]), int(iso["mo"]), int(iso["d"]))
        return _build(fields, iso, zone)
    if ctime := _CTIME_RE.search(prefix):
        year = int(ctime["y"]) if ctime["y"] else _year(year_hint)
        return _build((year, _MONTHS[ctime["mon"]], int(ctime["d"])), ctime, tz)
    if syslog := _SYSLOG_RE.search(prefix):
        date = (_year(year_hint), _MONTHS[syslog["mon"]], int(syslog["d"]))
        return _build(date, syslog, tz)
    return None


def _build(date: tuple[int, int, int], match: re.Match[str], tz: tzinfo) -> datetime | None:
    frac = match.groupdict().get("frac") or "0"
    try:
        stamp = datetime(
            *date, int(match["h"]), int(match["m"]), int(match["s"]), int(frac[:6].ljust(6, "0"))
        )
    except ValueError:
        return None  # an impossible date (e.g. Feb 29 in a guessed year): keep the event, no time
    return stamp.replace(tzinfo=tz).astimezone(UTC)


def _zone(text: str | None) -> tzinfo | None:
    if text is None:
        return None
    if text == "Z":
        return UTC
    sign = -1 if text[0] == "-" else 1
    digits = text[1:].replace(":", "")
    return timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))


def _year(year_hint: int | None) -> int:
    # Syslog stamps carry no year; a log read across New Year needs the caller's hint.
    return year_hint if year_hint is not None else datetime.now(UTC).year
