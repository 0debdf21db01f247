"""InfiniBand and RoCE adapter ports as ``/sys/class/infiniband`` shows them.

The layout (the kernel's ``ib_core``; the same for mlx4, mlx5, hfi1 and RoCE bonds)::

    <root>/<device>/node_guid                      0a7f:bc12:45ef:d23b
    <root>/<device>/device/net/<netdev>/dev_port   0-based port of that netdev (multi-port HCAs)
    <root>/<device>/ports/<n>/state                4: ACTIVE
    <root>/<device>/ports/<n>/phys_state           5: LinkUp
    <root>/<device>/ports/<n>/rate                 400 Gb/sec (4X NDR)
    <root>/<device>/ports/<n>/link_layer           InfiniBand | Ethernet
    <root>/<device>/ports/<n>/counters/<name>      cumulative, decimal
    <root>/<device>/ports/<n>/hw_counters/<name>   driver-specific (RoCE retransmits, ...)

``root`` is injectable so that tests and ``fleetwatch parse`` read a captured tree. A file that is
absent or cannot be read (sysfs answers EINVAL for a counter the firmware does not support) leaves
its value absent, never 0. A file that reads but does not parse is reported in
:attr:`InfinibandTree.problems`, naming the file, and its value stays absent; the rest of the port
is still read.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from fleetwatch.agent.parsers import ParseError
from fleetwatch.agent.parsers.infiniband_values import (
    parse_counter,
    parse_node_guid,
    parse_port_state,
    parse_rate,
)

__all__ = ["SYSFS_INFINIBAND", "InfinibandTree", "PortReading", "read_infiniband_tree"]

SYSFS_INFINIBAND = Path("/sys/class/infiniband")
MOST_COUNTERS = 128  # per directory, as the wire format bounds it
# Not a counter: how long (ms) the driver caches hw_counters between reads.
_NOT_COUNTERS = frozenset({"lifespan"})
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_COUNTER_NAME = re.compile(r"^[A-Za-z0-9_]{1,64}$")
_NETDEV_NAME = re.compile(r"^[!-.0-~]{1,15}$")
_LINK_LAYER = re.compile(r"^[A-Za-z][A-Za-z0-9 _-]{0,31}$")
T = TypeVar("T")


@dataclass
class PortReading:
    """One port as sysfs showed it. ``values`` holds only what was read, under the wire's
    :class:`~fleetwatch.telemetry.PortSample` field names; a counter directory that is absent
    or empty is ``None``."""

    device: str
    port: int
    values: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, int] | None = None
    hw_counters: dict[str, int] | None = None


@dataclass
class InfinibandTree:
    ports: list[PortReading] = field(default_factory=list)
    problems: list[ParseError] = field(default_factory=list)


def read_infiniband_tree(root: Path = SYSFS_INFINIBAND) -> InfinibandTree:
    """Every port of every adapter under ``root``, by device name then port number.

    A node without InfiniBand (no ``root``) has no ports and no problems.
    """
    tree = InfinibandTree()
    for device in _entries(root):
        if not _DEVICE_NAME.match(device.name):
            tree.problems.append(ParseError(f"{device}: device name cannot be sent"))
            continue
        guid = _value(device / "node_guid", parse_node_guid, tree.problems)
        netdevs = _netdevs(device)
        ports = [p for p in _entries(device / "ports") if p.name.isascii() and p.name.isdigit()]
        for port_dir in sorted(ports, key=lambda p: int(p.name)):
            port = int(port_dir.name)
            if port > 255:
                tree.problems.append(ParseError(f"{port_dir}: port number out of range"))
                continue
            reading = _read_port(device.name, port, port_dir, tree.problems)
            if guid is not None:
                reading.values["node_guid"] = guid
            netdev = _netdev_of(port, netdevs)
            if netdev is not None:
                reading.values["netdev"] = netdev
            tree.ports.append(reading)
    return tree


def _read_port(device: str, port: int, path: Path, problems: list[ParseError]) -> PortReading:
    reading = PortReading(device=device, port=port)
    values = reading.values
    layer = _value(path / "link_layer", _link_layer, problems)
    if layer is not None:
        values["link_layer"] = layer
    for name in ("state", "phys_state"):
        state = _value(path / name, parse_port_state, problems)
        if state is not None:
            values[f"{name}_code"], values[name] = state
    rate = _value(path / "rate", parse_rate, problems)
    if rate is not None:
        values["rate_gbps"], width, speed = rate
        if width is not None:
            values["link_width"] = width
        if speed is not None:
            values["link_speed"] = speed
    reading.counters = _counters(path / "counters", problems)
    reading.hw_counters = _counters(path / "hw_counters", problems)
    return reading


def _counters(directory: Path, problems: list[ParseError]) -> dict[str, int] | None:
    counters: dict[str, int] = {}
    for path in _entries(directory):
        if path.name in _NOT_COUNTERS or not _COUNTER_NAME.match(path.name):
            continue
        if len(counters) == MOST_COUNTERS:
            problems.append(ParseError(f"{directory}: more than {MOST_COUNTERS} counters"))
            break
        value = _value(path, parse_counter, problems)
        if value is not None:
            counters[path.name] = value
    return counters or None


def _link_layer(text: str) -> str:
    if not _LINK_LAYER.match(text):
        raise ParseError(f"expected a link layer like InfiniBand or Ethernet, got {text!r}")
    return text


def _netdevs(device: Path) -> dict[str, int | None]:
    """The adapter's network interfaces and the 0-based port each serves, where it says."""
    found: dict[str, int | None] = {}
    for net in _entries(device / "device" / "net"):
        if _NETDEV_NAME.match(net.name):
            dev_port = _text(net / "dev_port", [])
            found[net.name] = int(dev_port) if dev_port and dev_port.isdigit() else None
    return found


def _netdev_of(port: int, netdevs: dict[str, int | None]) -> str | None:
    """The netdev of a port: the adapter's only one, else the one whose dev_port is the port's."""
    if len(netdevs) == 1:
        return next(iter(netdevs))
    matching = [name for name, dev_port in netdevs.items() if dev_port == port - 1]
    return matching[0] if len(matching) == 1 else None


def _entries(directory: Path) -> list[Path]:
    """The entries of ``directory``, sorted by name; none when it is absent or unreadable."""
    try:
        return sorted(directory.iterdir())
    except OSError:
        return []


def _text(path: Path, problems: list[ParseError]) -> str | None:
    """A sysfs attribute's text, stripped; ``None`` when absent or unreadable."""
    try:
        raw = path.read_bytes()
    except OSError:  # absent, a directory, permission, or EINVAL/EIO from the driver
        return None
    try:
        return raw.decode("ascii").strip()
    except UnicodeDecodeError:
        problems.append(ParseError(f"{path}: not ASCII text"))
        return None


def _value(path: Path, parse: Callable[[str], T], problems: list[ParseError]) -> T | None:
    """``parse`` of the file's text; a text it refuses is a problem naming the file."""
    text = _text(path, problems)
    if text is None:
        return None
    try:
        return parse(text)
    except ParseError as exc:
        problems.append(ParseError(f"{path}: {exc}"))
        return None
