"""EDAC memory-controller error counts in the kernel log.

The kernel's EDAC core (``drivers/edac/edac_mc.c``) prints one line per report, with a count: a
report can stand for many errors, so a rate must add the counts, not the lines::

    EDAC MC0: 20 CE memory read error on CPU_SrcID#0_Ha#0_Chan#2_DIMM#0 (channel:2 ... OVERFLOW ...)
    EDAC MC3: 1 UE memory read error on CPU_SrcID#0_MC#3_Chan#0_DIMM#0 (channel:0 slot:0 ...)
    EDAC MC0: 1 CE Cannot decode normalized address on mc#0csrow#3channel#0 (csrow:3 channel:0 ...)

``CE`` is corrected, ``UE`` uncorrected. The text before `` on `` is the error, after it the DIMM
label (or ``mc#0csrow#3channel#0`` where the driver knows no label), and the parenthesis holds
``key:value`` location fields (channel, slot, rank, page, ...), with ``OVERFLOW`` when the
controller lost count. Old kernels print ``EDAC MC0: CE page 0x..., ... label "DIMM_A2": ...``
with no count (one error). A line cut before its location keeps its count and is marked
``incomplete``. Driver banners (``EDAC MC0: Giving out device ...``, chip-select sizes) and the
drivers' own decoding of a machine check (``EDAC sbridge MC0: HANDLING MCE MEMORY ERROR``, read
by :mod:`~fleetwatch.agent.parsers.machine_check`) are not counts.
"""

from __future__ import annotations

import re
from datetime import tzinfo
from typing import Any

from fleetwatch.agent.parsers import KernelEvent
from fleetwatch.agent.parsers.kernel_records import Single
from fleetwatch.agent.parsers.log_time import line_time
from fleetwatch.event_details import MAX_EVENT_COUNT

__all__ = ["read_edac_line"]

_COUNT_RE = re.compile(
    r"EDAC (?:(?P<driver>[\w-]+) )?MC(?P<mc>\d+): (?P<count>\d+) (?P<type>CE|UE) (?P<rest>.*)$"
)
_OLD_RE = re.compile(r"EDAC (?:(?P<driver>[\w-]+) )?MC(?P<mc>\d+): (?P<type>CE|UE) (?P<rest>.*)$")
_OLD_LABEL_RE = re.compile(r'labels? "(?P<label>[^"]*)"')
_FIELD_RE = re.compile(r"(?P<key>[A-Za-z_]\w*):(?P<value>[^\s)]+)")
_SEVERITY = {"CE": "corrected", "UE": "uncorrected"}
_MAX_FIELDS = 32


def read_edac_line(line: str, year_hint: int | None, tz: tzinfo) -> Single | None:
    """The error count an EDAC line reports, or ``None`` if it reports none."""
    if "EDAC " not in line:
        return None
    match = _COUNT_RE.search(line)
    if match is not None:
        # The kernel's count is 16 bits: a line claiming more than the server takes (it refuses
        # the batch beyond it) is damaged, and counts as that most, not as a batch never sent.
        digits = match["count"].lstrip("0") or "0"
        count = min(int(digits), MAX_EVENT_COUNT) if len(digits) < 20 else MAX_EVENT_COUNT
        if count == 0:
            return None  # a report of no errors
        details = _modern(match["rest"])
    else:
        match = _OLD_RE.search(line)
        if match is None:
            return None
        count = 1
        label = _OLD_LABEL_RE.search(match["rest"])
        details = {"label": label["label"] if label else None, "error": match["rest"].strip()}
    details = {
        "severity": _SEVERITY[match["type"]],
        "count": count,
        "memory_controller": int(match["mc"]),
        **details,
    }
    if match["driver"]:
        details["driver"] = match["driver"]
    return Single(
        KernelEvent(
            kind="edac",
            message=line[match.start() :].strip(),
            ts=line_time(line[: match.start()], year_hint=year_hint, tz=tz),
            details={k: v for k, v in details.items() if v is not None},
        )
    )


def _modern(rest: str) -> dict[str, Any]:
    paren = rest.find(" (")
    before = rest if paren < 0 else rest[:paren]
    error, on, label = (" " + before).rpartition(" on ")
    if not on or paren < 0:
        # Cut before "on <label> (<location>)": the count is known, where it happened is not.
        return {"error": rest.strip(), "incomplete": True}
    inside = rest[paren + 2 :].rstrip()
    inside = inside[:-1] if inside.endswith(")") else inside
    location: dict[str, Any] = {}
    for field in _FIELD_RE.finditer(inside):
        if len(location) >= _MAX_FIELDS:
            break
        value = field["value"]
        location.setdefault(
            field["key"], int(value) if value.isdigit() and len(value) < 18 else value
        )
    details: dict[str, Any] = {"error": error.strip() or None, "label": label.strip()}
    if location:
        details["location"] = location
    if re.search(r"\bOVERFLOW\b", inside):
        details["overflow"] = True
    return details
