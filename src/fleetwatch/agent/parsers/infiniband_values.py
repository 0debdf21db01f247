"""The text of one ``/sys/class/infiniband`` file, read as a value.

The kernel's InfiniBand core prints each port attribute on one line: ``state`` as ``4: ACTIVE``,
``phys_state`` as ``5: LinkUp``, ``rate`` as ``400 Gb/sec (4X NDR)`` (``10 Gb/sec (4X)`` where it
knows no speed name, ``2.5 Gb/sec (1X SDR)`` with a fraction), counters as a decimal number and
the node GUID as ``0a7f:bc12:45ef:d23b``. Each function here takes the file's text and returns
its value, or raises :class:`~fleetwatch.agent.parsers.ParseError` saying what it expected.
"""

from __future__ import annotations

import re

from fleetwatch.agent.parsers import ParseError
from fleetwatch.storable import INT64_MAX, shown

__all__ = ["parse_counter", "parse_node_guid", "parse_port_state", "parse_rate"]

_STATE = re.compile(r"^(?P<code>\d{1,3}):\s*(?P<name>[A-Za-z][A-Za-z0-9_ ]{0,31})$")
_RATE = re.compile(
    r"^(?P<gbps>\d{1,5}(?:\.\d{1,6})?) Gb/sec"
    r"(?: \((?P<width>\d{1,2})X(?: (?P<speed>[A-Za-z0-9]{1,16}))?\))?$"
)
_GUID = re.compile(r"^[0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){3}$")


def parse_port_state(text: str) -> tuple[int, str]:
    """``4: ACTIVE`` -> ``(4, "ACTIVE")`` (``state`` and ``phys_state`` share the form)."""
    match = _STATE.match(text.strip())
    if match is None or int(match["code"]) > 255:
        raise ParseError(f"expected a port state like '4: ACTIVE', got {shown(text)}")
    return int(match["code"]), match["name"].strip()


def parse_rate(text: str) -> tuple[float, int | None, str | None]:
    """``400 Gb/sec (4X NDR)`` -> ``(400.0, 4, "NDR")``; width and speed name when printed."""
    match = _RATE.match(text.strip())
    if match is None:
        raise ParseError(f"expected a rate like '400 Gb/sec (4X NDR)', got {shown(text)}")
    width = int(match["width"]) if match["width"] else None
    if width is not None and not 1 <= width <= 64:
        raise ParseError(f"a link of {width} lanes: {shown(text)}")
    return float(match["gbps"]), width, match["speed"]


def parse_counter(text: str) -> int:
    """A counter file's decimal value; one beyond a signed 64-bit column is refused, not cut."""
    stripped = text.strip()
    if not stripped.isascii() or not stripped.isdigit():
        raise ParseError(f"expected a decimal counter, got {shown(text)}")
    value = int(stripped)
    if value > INT64_MAX:
        raise ParseError(f"counter {stripped} is beyond 64-bit storage")
    return value


def parse_node_guid(text: str) -> str:
    """``0A7F:BC12:45EF:D23B`` -> ``0a7f:bc12:45ef:d23b``."""
    stripped = text.strip()
    if _GUID.match(stripped) is None:
        raise ParseError(f"expected a node GUID like '0a7f:bc12:45ef:d23b', got {shown(text)}")
    return stripped.lower()
