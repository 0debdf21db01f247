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
    name, driver_version, vbios_version, and ``mig``: the wire's ``MigIdentity`` as a dict, for a
    MIG-enabled GPU); ``values`` only the canonical sample fields it printed
    (names from :data:`fleetwatch.telemetry.SAMPLE_FIELDS`), already in canonical units.
    """

    identity: dict[str, Any] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)


@dataclass
class KernelEvent:
    """One event read from the kernel log (or the Fabric Manager log).

    ``kind``: ``xid`` (an ``NVRM: Xid`` line), ``gpu_lost`` (a GPU fallen off the bus), ``sxid``
    (an NVSwitch error), ``pcie_aer`` (a PCIe Advanced Error Reporting record), ``mce`` (a
    machine-check or firmware hardware-error record) or ``edac`` (a memory controller's error
    count). ``pci_bus_id`` is the reporting device's address (a GPU's for ``xid``, the NVSwitch's
    for ``sxid``, the reporting port or endpoint for ``pcie_aer``); ``uuid`` is set only once the
    address is known to be one of the node's GPUs. ``details`` holds what the kind adds (severity,
    link, error names, counts), JSON-ready; ``line_number`` is the record's first line.
    """

    kind: str
    message: str
    xid: int | None = None
    pci_bus_id: str | None = None
    ts: datetime | None = None
    pid: int | None = None
    process: str | None = None
    line_number: int | None = None
    uuid: str | None = None
    details: dict[str, Any] | None = None


class ParseError(ValueError):
    """Input that a parser cannot read; ``line_number`` says where (1-based), when known."""

    def __init__(self, message: str, *, line_number: int | None = None) -> None:
        where = f"line {line_number}: " if line_number is not None else ""
        super().__init__(f"{where}{message}")
        self.line_number = line_number
