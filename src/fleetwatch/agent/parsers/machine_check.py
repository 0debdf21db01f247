"""Machine checks and firmware hardware-error records in the kernel log (kind ``mce``).

Four printers tell of the same class of error, each in its own multi-line grammar:

- the mce core (``arch/x86/kernel/cpu/mce/core.c``)::

      mce: [Hardware Error]: CPU 0: Machine Check: 0 Bank 7: cc00050000010092
      mce: [Hardware Error]: TSC 0 ADDR 104e5c8c0 MISC 40584e86
      mce: [Hardware Error]: PROCESSOR 0:306e4 TIME 1743762241 SOCKET 0 APIC 0 microcode 42a

- AMD's decoder (``drivers/edac/mce_amd.c``): ``[Hardware Error]: Corrected error, no action
  required.`` then ``CPU:0 (19:61:2) MC21_STATUS[Over|CE|...]: 0xdc2040000400011b`` and more;
- Intel EDAC drivers' decoding (``EDAC sbridge MC0: HANDLING MCE MEMORY ERROR`` then ``CPU 0:
  Machine Check Event: 0 Bank 7: cc00...``, ``TSC``, ``ADDR``, ``MISC``, ``PROCESSOR`` lines);
- firmware-first records through APEI/GHES (``{3}[Hardware Error]: Hardware error from APEI
  Generic Hardware Error Source: 1``, then ``event severity``, ``section_type``, ... lines with
  the same ``{3}``). A GHES record whose section is a PCIe error is a ``pcie_aer`` event.

``mce: [Hardware Error]: Machine check events logged`` tells that records were queued: it joins
the record printed next to it, or stands alone (``severity`` unknown) when none is.

Severity (``corrected``, ``deferred``, ``uncorrected`` or ``fatal``): from the decoder's words
where it prints them, else from the status register's bits (Intel SDM vol. 3B, IA32_MCi_STATUS:
bit 61 UC, bit 57 PCC; UC clear is corrected, UC and PCC set is fatal); ``Machine check:
Processor context corrupt`` (printed before a panic) makes it fatal. A record's ``TIME`` (the
wall-clock second of the check) gives the event its time when the line prefix holds none.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, tzinfo
from typing import Any

from fleetwatch.agent.parsers import KernelEvent
from fleetwatch.agent.parsers.kernel_records import Head, Notice, Part, Record, unreadable
from fleetwatch.agent.parsers.log_time import line_time
from fleetwatch.agent.parsers.pci_address import PCI_PATTERN, pci_address

__all__ = ["read_machine_check_line", "status_severity"]

_HW = "[Hardware Error]: "
_CORE_MARK = "mce: [Hardware Error]: "
_CORE_HEAD_RE = re.compile(
    r"^CPU (?P<cpu>\d+): Machine Check(?P<exc> Exception)?: (?P<mcg>[0-9A-Fa-f]+) "
    r"Bank (?P<bank>\d+): (?P<status>[0-9A-Fa-f]+)"
)
_LOGGED = "Machine check events logged"
_PANIC_RE = re.compile(r"^Machine check: (?P<reason>.*?)\s*$")
_REGS_RE = re.compile(r"\b(?P<reg>TSC|ADDR|MISC|SYND|IPID|PPIN) (?:0x)?(?P<value>[0-9A-Fa-f]+)\b")
_PROCESSOR_RE = re.compile(
    r"^PROCESSOR (?P<vendor>\d+):(?:0x)?(?P<cpuid>[0-9A-Fa-f]+) TIME (?P<time>\d+) "
    r"SOCKET (?P<socket>\d+) APIC (?:0x)?(?P<apic>[0-9A-Fa-f]+)(?: microcode (?P<ucode>\S+))?"
)

# AMD decoder (drivers/edac/mce_amd.c, decode_error_status()).
_AMD_HEADS = {
    "Corrected error, no action required.": "corrected",
    "Deferred error, no action required.": "deferred",
    "Uncorrected, software containable error.": "uncorrected",
    "Uncorrected, software restartable error.": "uncorrected",
    "System Fatal error.": "fatal",
}
_AMD_STATUS_RE = re.compile(
    r"^CPU:(?P<cpu>\d+) \((?P<fms>[0-9A-Fa-f:]+)\) MC(?P<bank>\d+)_STATUS\[(?P<flags>[^\]]*)\]: "
    r"0x(?P<status>[0-9A-Fa-f]+)"
)
_AMD_ADDR_RE = re.compile(r"^(?:MC\d+ )?Error Addr(?:ess)?: 0x(?P<addr>[0-9A-Fa-f]+)")
_AMD_IPID_RE = re.compile(
    r"^IPID: 0x(?P<ipid>[0-9A-Fa-f]+)(?:, Syndrome: 0x(?P<synd>[0-9A-Fa-f]+))?"
)
_AMD_DESC_RE = re.compile(
    r"^(?:(?P<block>.+?) Ext\. Error Code: \d+,?\s*|MC\d+ Error: )(?P<desc>.*)$"
)

_EDAC_RE = re.compile(r"EDAC (?P<driver>[\w-]+) MC(?P<mc>\d+): (?P<rest>.*)$")
_EDAC_HEAD = "HANDLING MCE MEMORY ERROR"
_EDAC_EVENT_RE = re.compile(
    r"^CPU (?P<cpu>\d+): Machine Check Event: (?:0x)?(?P<mcg>[0-9A-Fa-f]+) Bank (?P<bank>\d+): "
    r"(?:0x)?(?P<status>[0-9A-Fa-f]+)"
)

_GHES_RE = re.compile(r"\{(?P<n>\d+)\}\[Hardware Error\]:\s*(?P<rest>.*?)\s*$")
_GHES_HEAD = "Hardware error from APEI Generic Hardware Error Source:"
_GHES_FIELD_RE = re.compile(
    r"^(?P<key>event severity|section_type|error_type|fru_text|DIMM location|physical_address"
    r"|device_id|port_type):\s*(?P<value>.*)$"
)
_GHES_SEVERITY = {"corrected": "corrected", "recoverable": "uncorrected", "fatal": "fatal"}
_GHES_AER_SEVERITY = {"corrected": "corrected", "recoverable": "non_fatal", "fatal": "fatal"}

_UC, _PCC = 1 << 61, 1 << 57


def status_severity(status: int) -> str:
    """``corrected``, ``uncorrected`` or ``fatal`` from an IA32_MCi_STATUS value."""
    if not status & _UC:
        return "corrected"
    return "fatal" if status & _PCC else "uncorrected"


def read_machine_check_line(
    line: str, year_hint: int | None, tz: tzinfo
) -> Head | Part | Notice | None:
    """What a machine-check or hardware-error line says, or ``None`` if it is not one."""
    if (start := line.find(_CORE_MARK)) >= 0:
        return _core(line, start, year_hint, tz)
    if (ghes := _GHES_RE.search(line)) is not None:
        return _ghes(line, ghes, year_hint, tz)
    if (start := line.find(_HW)) >= 0:
        return _amd(line, start, year_hint, tz)
    if "EDAC " in line and (edac := _EDAC_RE.search(line)) is not None:
        return _edac_decoder(line, edac, year_hint, tz)
    return None


def _record(key: str, source: str, ts: datetime | None, fields: dict[str, Any]) -> Record:
    return Record("mce", key, 0, ts, {"source": source, **fields}, _finish)


def _core(line: str, start: int, year_hint: int | None, tz: tzinfo) -> Head | Part | Notice | None:
    rest = line[start + len(_CORE_MARK) :].strip()
    ts = line_time(line[:start], year_hint=year_hint, tz=tz)
    if rest.startswith(_LOGGED):
        logged = KernelEvent(
            kind="mce", message=rest, ts=ts, details={"source": "mce", "events_logged": True}
        )
        return Notice("mce", logged)
    if head := _CORE_HEAD_RE.match(rest):
        return Head(_record("mce", "mce", ts, {"message": rest, **_check_fields(head)}))
    if rest.startswith("CPU ") and "Machine Check" in rest:
        raise unreadable("the bank and status of the machine check", rest)
    if panic := _PANIC_RE.match(rest):
        reason = panic["reason"]
        return Part("mce", lambda f: f.setdefault("panic", reason))
    if processor := _PROCESSOR_RE.match(rest):
        return Part("mce", _processor_update(processor))
    registers = {m["reg"].lower(): "0x" + m["value"].lower() for m in _REGS_RE.finditer(rest)}
    if registers and rest.split(" ", 1)[0] in ("TSC", "ADDR", "MISC"):
        return Part("mce", lambda f: _fill(f, registers))
    return None


def _amd(line: str, start: int, year_hint: int | None, tz: tzinfo) -> Head | Part | None:
    rest = line[start + len(_HW) :].strip()
    said = rest.removeprefix("Error Status: ")
    if said in _AMD_HEADS:
        ts = line_time(line[:start], year_hint=year_hint, tz=tz)
        fields = {"message": said, "severity": _AMD_HEADS[said], "severity_from": "decoder"}
        return Head(_record("mce_amd", "mce_amd", ts, fields))
    if status := _AMD_STATUS_RE.match(rest):
        ts = line_time(line[:start], year_hint=year_hint, tz=tz)
        found = {
            "cpu": int(status["cpu"]),
            "bank": int(status["bank"]),
            "status": "0x" + status["status"].lower(),
            "flags": [f for f in status["flags"].split("|") if f and f != "-"],
        }

        def orphan() -> Record:
            return _record("mce_amd", "mce_amd", ts, {"message": rest, "partial": True})

        return Part("mce_amd", lambda f: _fill(f, found), orphan)
    if addr := _AMD_ADDR_RE.match(rest):
        value = "0x" + addr["addr"].lower()
        return Part("mce_amd", lambda f: f.setdefault("addr", value))
    if ipid := _AMD_IPID_RE.match(rest):
        regs = {"ipid": "0x" + ipid["ipid"].lower()}
        if ipid["synd"]:
            regs["synd"] = "0x" + ipid["synd"].lower()
        return Part("mce_amd", lambda f: _fill(f, regs))
    if desc := _AMD_DESC_RE.match(rest):
        text = desc["desc"].strip() or (desc["block"] or "").strip()
        return Part("mce_amd", lambda f: f.setdefault("error", text))
    return None


def _edac_decoder(
    line: str, edac: re.Match[str], year_hint: int | None, tz: tzinfo
) -> Head | Part | None:
    key = f"edac:{edac['driver']}:{edac['mc']}"
    rest = edac["rest"].strip()
    source = f"edac_{edac['driver']}"
    if rest == _EDAC_HEAD:
        ts = line_time(line[: edac.start()], year_hint=year_hint, tz=tz)
        return Head(_record(key, source, ts, {"memory_controller": int(edac["mc"])}))
    if event := _EDAC_EVENT_RE.match(rest):
        found = {"message": rest, **_check_fields(event)}
        return Part(key, lambda f: _fill(f, found))
    if processor := _PROCESSOR_RE.match(rest):
        return Part(key, _processor_update(processor))
    registers = {m["reg"].lower(): "0x" + m["value"].lower() for m in _REGS_RE.finditer(rest)}
    if registers and rest.split(" ", 1)[0] in registers.keys() | {"TSC", "ADDR", "MISC"}:
        return Part(key, lambda f: _fill(f, registers))
    return None


def _ghes(line: str, ghes: re.Match[str], year_hint: int | None, tz: tzinfo) -> Head | Part | None:
    key = f"ghes:{ghes['n']}"
    rest = ghes["rest"]
    if rest.startswith(_GHES_HEAD):
        ts = line_time(line[: ghes.start()], year_hint=year_hint, tz=tz)
        return Head(_record(key, "ghes", ts, {"message": rest}))
    if field := _GHES_FIELD_RE.match(rest):
        name = field["key"].replace(" ", "_").lower()
        value = field["value"].strip()
        return Part(key, lambda f: f.setdefault(f"ghes_{name}", value))
    if rest.startswith("It has been corrected by h/w"):
        return Part(key, lambda f: f.setdefault("ghes_event_severity", "corrected"))
    if rest.startswith("node:"):
        return Part(key, lambda f: f.setdefault("location", rest))
    return None


def _check_fields(match: re.Match[str]) -> dict[str, Any]:
    status = int(match["status"], 16)
    fields: dict[str, Any] = {
        "cpu": int(match["cpu"]),
        "bank": int(match["bank"]),
        "mcg_status": "0x" + match["mcg"].lower(),
        "status": f"0x{status:016x}",
    }
    if "exc" in match.groupdict():
        fields["exception"] = match["exc"] is not None
    return fields


def _processor_update(processor: re.Match[str]) -> Any:
    found: dict[str, Any] = {
        "processor": f"{processor['vendor']}:{processor['cpuid'].lower()}",
        "time": int(processor["time"]),
        "socket": int(processor["socket"]),
        "apic": int(processor["apic"], 16),
    }
    if processor["ucode"]:
        found["microcode"] = processor["ucode"]
    return lambda f: _fill(f, found)


def _fill(fields: dict[str, Any], found: dict[str, Any]) -> None:
    for name, value in found.items():
        fields.setdefault(name, value)


_DETAIL_KEYS = tuple(
    "cpu bank mcg_status status exception flags addr misc synd ipid tsc ppin processor socket "
    "apic microcode time panic error memory_controller location partial".split()
)


def _finish(record: Record) -> KernelEvent:
    fields = record.fields
    if fields["source"] == "ghes":
        return _finish_ghes(record)
    severity, said_by = fields.get("severity"), fields.get("severity_from")
    if severity is None and "status" in fields:
        severity, said_by = status_severity(int(fields["status"], 16)), "status"
    if fields.get("panic", "").startswith("Processor context corrupt"):
        severity, said_by = "fatal", "panic"
    details: dict[str, Any] = {"source": fields["source"], "severity": severity}
    if said_by is not None:
        details["severity_from"] = said_by
    details |= {key: fields[key] for key in _DETAIL_KEYS if fields.get(key) is not None}
    if record.notices:
        details["events_logged"] = True
    ts = record.ts
    if ts is None and fields.get("time"):
        ts = datetime.fromtimestamp(fields["time"], UTC)
    return KernelEvent(
        kind="mce",
        message=fields.get("message") or "machine check",
        ts=ts,
        details={k: v for k, v in details.items() if v is not None},
    )


def _finish_ghes(record: Record) -> KernelEvent:
    fields = record.fields
    raw = fields.get("ghes_event_severity")
    section = fields.get("ghes_section_type")
    device = fields.get("ghes_device_id")
    details: dict[str, Any] = {
        "source": "ghes",
        "severity_text": raw,
        "section_type": section,
        "error_type": fields.get("ghes_error_type"),
        "fru_text": fields.get("ghes_fru_text"),
        "dimm_location": fields.get("ghes_dimm_location"),
        "physical_address": fields.get("ghes_physical_address"),
        "location": fields.get("location"),
    }
    if record.notices:
        details["events_logged"] = True
    pci: str | None = None
    if section is not None and "pcie" in section.lower():
        kind, severity = "pcie_aer", _GHES_AER_SEVERITY.get(raw or "")
        if device and re.fullmatch(PCI_PATTERN, device):
            pci = pci_address(device)
    else:
        kind, severity = "mce", _GHES_SEVERITY.get(raw or "")
    details["severity"] = severity
    message = (
        f"{section or 'hardware error'}, event severity {raw or 'unknown'}: {fields['message']}"
    )
    return KernelEvent(
        kind=kind,
        message=message,
        pci_bus_id=pci,
        ts=record.ts,
        details={k: v for k, v in details.items() if v is not None},
    )
