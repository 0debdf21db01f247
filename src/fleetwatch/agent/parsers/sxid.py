"""NVSwitch SXid errors, from the kernel log and from the Fabric Manager log.

The NVSwitch driver prints a record per error (NVIDIA/open-gpu-kernel-modules,
``src/common/nvswitch/kernel/inc/intr_nvswitch.h`` and ``error_nvswitch.c``)::

    nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up
    nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Severity 1 Engine instance 48 Sub-engine ...
    nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Data {0x10000000, 0x10000000, ...}

The head says ``Fatal``, ``Non-fatal`` or ``Correctable`` (per occurrence: the driver decides by
whether the error was contained), the link, and the error; ``Severity`` is the driver's
``NVSWITCH_ERROR_SEVERITY_*`` (0 non-fatal, 1 fatal, ``ctrl_dev_nvswitch.h``). Records of several
switches interleave; one of the real captures starts with a ``Severity`` line whose head is not
in the log: such a record becomes an event marked ``partial``, its severity from that line.
Where no line of the record says, the severity comes from NVIDIA's catalog
(:mod:`~fleetwatch.agent.parsers.sxid_catalog`).

The Fabric Manager logs the errors it sees, with the port::

    [Jul 23 2024 07:53:55] [ERROR] [tid 841] detected NVSwitch fatal error 20034 on fid 0 on
    NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 33
"""

from __future__ import annotations

import re
from datetime import tzinfo
from typing import Any

from fleetwatch.agent.parsers import KernelEvent
from fleetwatch.agent.parsers.kernel_records import Head, Part, Record, Single, unreadable
from fleetwatch.agent.parsers.log_time import line_time
from fleetwatch.agent.parsers.pci_address import PCI_PATTERN, pci_address
from fleetwatch.agent.parsers.sxid_catalog import SXID_CATALOG

__all__ = ["read_sxid_line"]

_MARK = "SXid ("
_LINE_RE = re.compile(
    rf"(?:(?P<switch>nvidia-nvswitch\d+): )?SXid \(PCI:(?P<pci>{PCI_PATTERN})\): "
    r"(?P<code>\d+)\b,?\s*(?P<body>.*)$"
)
_LINK_RE = re.compile(
    r"^(?P<sev>Fatal|Non-fatal|Correctable), Link (?P<link>\d+)\s*(?P<msg>.*?)\s*"
    r"(?P<first>\(First\))?$"
)
_OTHER_HEAD_RE = re.compile(
    r"^(?P<sev>Fatal|Non-fatal|Correctable), (?P<msg>.*?)"
    r"(?:, instance=(?P<instance>\d+), chiplet=(?P<chiplet>\d+))?$"
)
_SEVERITY_RE = re.compile(
    r"^Severity (?P<sev>\d+) Engine instance (?P<instance>\d+) Sub-engine instance (?P<sub>\d+)"
)
_DATA_RE = re.compile(r"^Data \{(?P<data>[^}]*)\}")

_FM_MARK = "detected NVSwitch"
_FM_RE = re.compile(
    r"detected NVSwitch (?P<sev>fatal|non-fatal) error (?P<code>\d+) on fid (?P<fid>\d+) on "
    r"NVSwitch pci bus id (?P<pci>\S+) physical id (?P<phys>\d+) port (?P<port>\d+)"
)

_WORDS = {"Fatal": "fatal", "Non-fatal": "non_fatal", "Correctable": "correctable"}
# NVSWITCH_ERROR_SEVERITY_NONFATAL = 0, NVSWITCH_ERROR_SEVERITY_FATAL = 1 (ctrl_dev_nvswitch.h).
_SEVERITY_NUMBERS = {0: "non_fatal", 1: "fatal"}


def read_sxid_line(line: str, year_hint: int | None, tz: tzinfo) -> Head | Part | Single | None:
    """What an NVSwitch line says, or ``None`` if it is not one; raises on an unreadable one."""
    start = line.find(_MARK)
    if start >= 0:
        return _kernel_line(line, start, year_hint, tz)
    start = line.find(_FM_MARK)
    if start >= 0:
        return _fabric_manager_line(line, start, year_hint, tz)
    return None


def _kernel_line(line: str, start: int, year_hint: int | None, tz: tzinfo) -> Head | Part:
    match = _LINE_RE.search(line)  # from the start: the switch name sits before the mark
    if match is None:
        raise unreadable("the SXid code and PCI id", line[start:])
    pci = pci_address(match["pci"])
    code = int(match["code"])
    body = match["body"].strip()
    key = f"sxid:{pci}:{code}"
    ts = line_time(line[: match.start()], year_hint=year_hint, tz=tz)
    base = {"sxid": code, "switch": match["switch"], "source": "kernel", "pci": pci}

    if severity := _SEVERITY_RE.match(body):
        fields = {
            "severity_number": int(severity["sev"]),
            "engine_instance": int(severity["instance"]),
            "sub_engine_instance": int(severity["sub"]),
        }
        return Part(key, lambda f: _merge(f, fields), _orphan(key, base, body, ts))
    if data := _DATA_RE.match(body):
        words = [w.strip() for w in data["data"].split(",") if w.strip()]
        return Part(key, lambda f: _merge(f, {"data": words}), _orphan(key, base, body, ts))
    head: dict[str, Any] = {**base, "message": body}
    if link := _LINK_RE.match(body):
        head |= {"severity": _WORDS[link["sev"]], "link": int(link["link"])}
        head |= {"error": link["msg"], "first": link["first"] is not None}
    elif other := _OTHER_HEAD_RE.match(body):
        head |= {"severity": _WORDS[other["sev"]], "error": other["msg"]}
        if other["instance"] is not None:
            head |= {"instance": int(other["instance"]), "chiplet": int(other["chiplet"])}
    return Head(Record("sxid", key, 0, ts, head, _finish))


def _orphan(key: str, base: dict[str, Any], body: str, ts: Any) -> Any:
    def start() -> Record:
        return Record("sxid", key, 0, ts, {**base, "message": body, "partial": True}, _finish)

    return start


def _merge(fields: dict[str, Any], new: dict[str, Any]) -> None:
    for name, value in new.items():
        fields.setdefault(name, value)


def _finish(record: Record) -> KernelEvent:
    fields = dict(record.fields)
    code = fields["sxid"]
    name, klass = SXID_CATALOG.get(code, (None, None))
    severity, said_by = fields.pop("severity", None), "line"
    if severity is None and "severity_number" in fields:
        severity, said_by = _SEVERITY_NUMBERS.get(fields["severity_number"]), "severity_field"
    if severity is None and klass is not None:
        severity, said_by = ("non_fatal" if klass == "non_fatal" else "fatal"), "catalog"
    details: dict[str, Any] = {
        "sxid": code,
        "severity": severity,
        "severity_from": said_by if severity is not None else None,
        "catalog_class": klass,
        "catalog_name": name,
    }
    for key in ("link", "error", "first", "instance", "chiplet", "engine_instance"):
        if key in fields:
            details[key] = fields[key]
    for key in ("sub_engine_instance", "severity_number", "data", "switch", "partial", "source"):
        if fields.get(key) is not None:
            details[key] = fields[key]
    return KernelEvent(
        kind="sxid",
        message=fields["message"],
        pci_bus_id=fields["pci"],
        ts=record.ts,
        details={k: v for k, v in details.items() if v is not None},
    )


def _fabric_manager_line(line: str, start: int, year_hint: int | None, tz: tzinfo) -> Single:
    match = _FM_RE.search(line, start)
    if match is None:
        raise unreadable("the NVSwitch error code, PCI id and port", line[start:])
    code = int(match["code"])
    name, klass = SXID_CATALOG.get(code, (None, None))
    details: dict[str, Any] = {
        "sxid": code,
        "severity": "fatal" if match["sev"] == "fatal" else "non_fatal",
        "severity_from": "line",
        "catalog_class": klass,
        "catalog_name": name,
        "link": int(match["port"]),  # the Fabric Manager's port is the switch's NVLink
        "physical_id": int(match["phys"]),
        "fid": int(match["fid"]),
        "source": "fabric_manager",
    }
    return Single(
        KernelEvent(
            kind="sxid",
            message=line[start:].strip(),
            pci_bus_id=pci_address(match["pci"]),
            ts=line_time(line[:start], year_hint=year_hint, tz=tz),
            details={k: v for k, v in details.items() if v is not None},
        )
    )
