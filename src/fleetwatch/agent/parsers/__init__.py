"""Parsers of what GPUs, drivers and exporters print, onto the canonical telemetry.

Each parser is a pure function from text to :class:`GpuReading` or :class:`KernelEvent` values, so
that collectors (which add I/O) and ``fleetwatch parse`` (which adds a CLI) share them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = ["GpuReading", "KernelEvent", "ParseError"]


@dataclass
class GpuReading:
    """One GPU as one source saw it.

    ``identity`` holds only the identity keys the source printed (uuid, index, pci_bus_id, serial,
    name, driver_version, vbios_version); ``values`` only the canonical sample fields it printed
    (names from :data:`fleetwatch.telemetry.SAMPLE_FIELDS`), already in canonical units.
    """

    identity: dict[str, Any] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)


@dataclass
class KernelEvent:
    """One GPU event read from the kernel log: an ``NVRM: Xid`` line, or a GPU lost from the bus."""

    kind: str  # "xid" or "gpu_lost"
    message: str
    xid: int | None = None
    pci_bus_id: str | None = None
    ts: datetime | None = None
    pid: int | None = None
    process: str | None = None
    line_number: int | None = None


class ParseError(ValueError):
    """Input that a parser cannot read; ``line_number`` says where (1-based), when known."""

    def __init__(self, message: str, *, line_number: int | None = None) -> None:
        where = f"line {line_number}: " if line_number is not None else ""
        super().__init__(f"{where}{message}")
        self.line_number = line_number
