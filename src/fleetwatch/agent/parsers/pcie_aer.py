"""PCIe Advanced Error Reporting records in the kernel log.

The kernel's AER driver (``drivers/pci/pcie/aer.c``) prints, for each error a root port takes in,
an announcement by the port, then one record per device that logged the error::

    pcieport 0000:00:03.1: AER: Multiple Correctable error message received from 0000:00:00.0
    nvidia 0000:07:00.0: PCIe Bus Error: severity=Correctable, type=Data Link Layer, (Transmitt...
    nvidia 0000:07:00.0:   device [10de:2184] error status/mask=00001000/0000a000
    nvidia 0000:07:00.0:    [12] Timeout

Wording changed over the years and every variant is read: ``Corrected``/``Correctable``,
``Uncorrected``/``Uncorrectable`` ``(Non-Fatal)``/``(Fatal)``; the announcement's source as
``id=00e5`` (a requester id), ``0000:00:1c.5`` or ``from 0000:00:1c.5``; an ``AER:`` tag or none;
error names short (``RxErr``) or long (``Receiver Error``). A record's event is the device that
printed ``PCIe Bus Error`` (its ``pci_bus_id``; a GPU when that is one of the node's GPUs), with
the severity as ``corrected``, ``non_fatal`` or ``fatal``, the layer, the error names (the bits
of ``status & ~mask``), the TLP header, and the announcing port and source when the
announcement was seen. An announcement followed by no record is an event of its own.
"""

from __future__ import annotations

import re
from datetime import tzinfo
from typing import Any

from fleetwatch.agent.parsers import KernelEvent, ParseError
from fleetwatch.agent.parsers.kernel_records import Head, Notice, Part, Record, unreadable
from fleetwatch.agent.parsers.log_time import line_time
from fleetwatch.agent.parsers.pci_address import PCI_PATTERN, pci_address, requester_id_address

__all__ = ["aer_severity", "read_aer_line"]

_DEVICE_RE = re.compile(
    r"(?:(?P<driver>[\w.-]+) )?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]): "
    r"(?:AER: )?(?P<rest>.*)$"
)
_SEVERITY = r"(?:Corrected|Correctable|Uncorrect(?:ed|able) \((?:Non-)?Fatal\))"
_ANNOUNCE_RE = re.compile(
    rf"^(?P<multiple>Multiple )?(?P<sev>{_SEVERITY}) error (?:message )?received"
    rf"(?::| from) (?:id=(?P<id>[0-9A-Fa-f]{{4}})|(?P<src>{PCI_PATTERN}))"
)
_HEAD_MARK = "PCIe Bus Error:"
_HEAD_RE = re.compile(
    r"^PCIe Bus Error: severity=(?P<sev>[^,]+), type=(?P<type>[^,(]+?)"
    r"(?:,\s*(?:id=(?P<id>[0-9A-Fa-f]{4}))?\((?P<agent>[^)]*)\))?\s*$"
)
_STATUS_RE = re.compile(
    r"^(?:device \[(?P<vendor>[0-9A-Fa-f]{4}):(?P<device>[0-9A-Fa-f]{4})\] )?"
    r"error status/mask=(?P<status>[0-9A-Fa-f]{8})/(?P<mask>[0-9A-Fa-f]{8})"
)
_BIT_RE = re.compile(r"^\[\s*(?P<bit>\d+)\]\s*(?P<name>.*?)\s*(?P<first>\(First\))?\s*$")
_TLP_RE = re.compile(r"^TLP Header: (?P<tlp>.*?)\s*$")
_ADVISORY = "Uncorrectable errors that may cause Advisory Non-Fatal"


def aer_severity(text: str) -> str | None:
    """``corrected``, ``non_fatal`` or ``fatal`` for the kernel's wording; ``None`` if unknown."""
    lowered = text.strip().lower()
    if lowered in ("corrected", "correctable"):
        return "corrected"
    if lowered.startswith("uncorrect"):
        return "non_fatal" if "non-fatal" in lowered else "fatal" if "fatal" in lowered else None
    return None


def read_aer_line(line: str, year_hint: int | None, tz: tzinfo) -> Head | Part | Notice | None:
    """What a PCIe AER line says, or ``None`` if it is not one; raises on an unreadable head."""
    device = _DEVICE_RE.search(line)
    if device is None:
        if _HEAD_MARK in line:
            raise unreadable("the device of the PCIe Bus Error", line[line.find(_HEAD_MARK) :])
        return None
    rest = device["rest"].strip()
    pci = pci_address(device["pci"])
    key = f"aer:{pci}"
    if rest.startswith(_HEAD_MARK):
        return _head(line, device, pci, key, year_hint, tz)
    if announce := _ANNOUNCE_RE.match(rest):
        return _announcement(line, device, pci, announce, year_hint, tz)
    if status := _STATUS_RE.match(rest):
        fields = {
            "status": status["status"].lower(),
            "mask": status["mask"].lower(),
            "vendor_device": (
                f"{status['vendor']}:{status['device']}".lower() if status["vendor"] else None
            ),
        }
        return Part(key, lambda f: f.update({k: v for k, v in fields.items() if v is not None}))
    if bit := _BIT_RE.match(rest):
        number, name, first = int(bit["bit"]), bit["name"], bit["first"] is not None
        return Part(key, lambda f: _add_bit(f, number, name, first))
    if tlp := _TLP_RE.match(rest):
        header = tlp["tlp"]
        return Part(key, lambda f: f.setdefault("tlp_header", header))
    if rest.startswith(_ADVISORY):
        return Part(key, lambda f: f.update(advisory_mode=True))
    return None


def _head(
    line: str, device: re.Match[str], pci: str, key: str, year_hint: int | None, tz: tzinfo
) -> Head:
    rest = device["rest"].strip()
    head = _HEAD_RE.match(rest)
    if head is None:
        raise unreadable("the severity and type of the PCIe Bus Error", rest)
    severity = aer_severity(head["sev"])
    if severity is None:
        raise ParseError(f"unknown PCIe AER severity {head['sev']!r} in {rest[:120]!r}")
    fields: dict[str, Any] = {
        "pci": pci,
        "driver": device["driver"],
        "severity": severity,
        "severity_text": head["sev"].strip(),
        "layer": head["type"].strip(),
        "agent": head["agent"],
        "head": rest,
    }
    if head["id"]:
        fields["source"] = requester_id_address(head["id"], domain_of=pci)
    ts = line_time(line[: device.start()], year_hint=year_hint, tz=tz)
    return Head(Record("pcie_aer", key, 0, ts, fields, _finish))


def _announcement(
    line: str,
    device: re.Match[str],
    port: str,
    announce: re.Match[str],
    year_hint: int | None,
    tz: tzinfo,
) -> Notice:
    if announce["id"]:
        source = requester_id_address(announce["id"], domain_of=port)
    else:
        source = pci_address(announce["src"])
    severity = aer_severity(announce["sev"])
    details = {
        "severity": severity,
        "severity_text": announce["sev"],
        "reported_by": port,
        "source": source,
        "multiple": announce["multiple"] is not None,
        "announcement_only": True,
    }
    event = KernelEvent(
        kind="pcie_aer",
        message=device["rest"].strip(),
        pci_bus_id=source,
        ts=line_time(line[: device.start()], year_hint=year_hint, tz=tz),
        details=details,
    )
    return Notice("pcie_aer", event, before_only=True)


def _add_bit(fields: dict[str, Any], number: int, name: str, first: bool) -> None:
    target = "advisory_errors" if fields.get("advisory_mode") else "errors"
    fields.setdefault(target, []).append(name)
    if target == "errors":
        fields.setdefault("error_bits", []).append(number)
        if first:
            fields["first_error"] = name


def _finish(record: Record) -> KernelEvent:
    fields = record.fields
    names = fields.get("errors", [])
    message = fields["head"] + (f": {', '.join(names)}" if names else "")
    details: dict[str, Any] = {
        key: fields[key]
        for key in (
            "severity",
            "severity_text",
            "layer",
            "agent",
            "driver",
            "vendor_device",
            "status",
            "mask",
            "errors",
            "error_bits",
            "first_error",
            "advisory_errors",
            "tlp_header",
            "source",
        )
        if fields.get(key) is not None
    }
    if record.notices and record.notices[0].details:
        announcement = record.notices[0].details
        details["reported_by"] = announcement["reported_by"]
        details.setdefault("source", announcement["source"])
        details["multiple"] = announcement["multiple"]
    return KernelEvent(
        kind="pcie_aer", message=message, pci_bus_id=fields["pci"], ts=record.ts, details=details
    )
