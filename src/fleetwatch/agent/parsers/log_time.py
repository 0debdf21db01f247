"""The time a log line was written, read from whatever prefix the line carries.

Absolute stamps become UTC datetimes: ISO 8601 (``dmesg --time-format=iso``, ``journalctl -o
short-iso``, rsyslog RFC 3339), ``dmesg -T`` (``[Fri Aug 30 11:43:09 2024]``), syslog (``Jan  1
12:00:00 host kernel:``) and the Fabric Manager log (``[Jul 23 2024 07:53:55]``). Stamps without a
zone are read in ``tz`` (default UTC); a syslog stamp has no year, so ``year_hint`` or else the
current year is used. Monotonic stamps (``[ 1234.5]``, a raw kmsg record's usec) give ``None``;
:func:`monotonic_seconds` reads them, so a caller who knows the boot time can convert them.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone, tzinfo

__all__ = ["line_time", "monotonic_seconds"]

_MONTHS = {
    name: number
    for number, name in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"),
        start=1,
    )
}
_MONTH = "(?P<mon>" + "|".join(_MONTHS) + ")"
_TIME = r"(?P<h>\d{2}):(?P<m>\d{2}):(?P<s>\d{2})"
_ISO_RE = re.compile(
    rf"(?P<y>\d{{4}})-(?P<mo>\d{{2}})-(?P<d>\d{{2}})[T ]{_TIME}(?:[.,](?P<frac>\d+))?"
    r"(?P<zone>Z|[+-]\d{2}:?\d{2})?"
)
_CTIME_RE = re.compile(
    rf"\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) {_MONTH} +(?P<d>\d{{1,2}}) {_TIME}(?: (?P<y>\d{{4}}))?\]"
)
_FABRIC_MANAGER_RE = re.compile(rf"\[{_MONTH} +(?P<d>\d{{1,2}}) (?P<y>\d{{4}}) {_TIME}\]")
_SYSLOG_RE = re.compile(
    rf"(?:^|\s){_MONTH} +(?P<d>\d{{1,2}}) {_TIME}(?:\.(?P<frac>\d+))?\s+(?:\S+\s+)?kernel:"
)
_UPTIME_RE = re.compile(r"\[\s*(?P<sec>\d+\.\d+)\]")
_KMSG_RE = re.compile(r"^\d+,\d+,(?P<usec>\d+),[^;]*;")


def line_time(prefix: str, *, year_hint: int | None = None, tz: tzinfo = UTC) -> datetime | None:
    """The absolute time in ``prefix`` (the text before a message), as UTC; ``None`` if none."""
    if iso := _ISO_RE.search(prefix):
        zone = _zone(iso["zone"]) or tz
        return _build((int(iso["y"]), int(iso["mo"]), int(iso["d"])), iso, zone)
    if ctime := _CTIME_RE.search(prefix):
        year = int(ctime["y"]) if ctime["y"] else _year(year_hint)
        return _build((year, _MONTHS[ctime["mon"]], int(ctime["d"])), ctime, tz)
    if fm := _FABRIC_MANAGER_RE.search(prefix):
        return _build((int(fm["y"]), _MONTHS[fm["mon"]], int(fm["d"])), fm, tz)
    if syslog := _SYSLOG_RE.search(prefix):
        return _build((_year(year_hint), _MONTHS[syslog["mon"]], int(syslog["d"])), syslog, tz)
    return None


def monotonic_seconds(line: str, *, before: str = "NVRM:") -> float | None:
    """Seconds since boot from a ``[ 1234.567890]`` stamp or a raw kmsg record, if present.

    Only the text before ``before`` is searched, so a bracketed number in the message is not
    taken for the stamp.
    """
    kmsg = _KMSG_RE.match(line)
    if kmsg is not None:
        return int(kmsg["usec"]) / 1_000_000
    start = line.find(before)
    uptime = _UPTIME_RE.search(line if start < 0 else line[:start])
    return float(uptime["sec"]) if uptime is not None else None


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
