"""Judge a node's kernel-log hardware errors outside the Xid stream: NVSwitch SXid, PCIe AER,
machine checks and EDAC counts.

:func:`judge_host_errors` is pure: events in (``details.severity`` as the agent's parsers set it,
see :class:`fleetwatch.telemetry.Event`), :class:`HostVerdict` list out, time from ``now``. A
verdict has a **scope**: ``gpu`` (the error is on that GPU's own PCIe function) or ``node`` (the
NVSwitch fabric, the CPUs or the host memory, which every GPU of the node depends on).

=======================  ======================================================  ==============
rule                     when                                                    verdict
=======================  ======================================================  ==============
``sxid_fatal``           a fatal SXid on an NVSwitch (Fabric Manager guide D.5    node, fatal,
                         and D.6: the fabric must be reset with its GPUs)         reboot_node
``sxid_repeat``          >= ``sxid_non_fatal_limit`` non-fatal SXids on one       node, warning,
                         switch within ``sxid_window_s``                          investigate
``aer_gpu_uncorrected``  an uncorrected AER record (fatal or non-fatal) on a GPU  gpu, fatal or
                         (PCIe spec: a fatal one leaves the link unreliable, a    critical,
                         non-fatal one lost a transaction)                        drain_reset
``aer_uncorrected``      the same on another device (a root port, a NIC): the     node, warning,
                         GPU behind it is not known from the record               investigate
``aer_corrected_burst``  >= ``aer_corrected_limit`` corrected records on one      gpu or node,
                         device within ``aer_corrected_window_s``                 warning
``mce_uncorrected``      a fatal or uncorrected machine check (the CPU or its     node, fatal or
                         memory lost data)                                        critical,
                                                                                  drain_inspect
``mce_deferred``         a deferred machine check (uncorrectable, not consumed)   node, warning
``edac_uncorrected``     an uncorrected EDAC count                                node, critical,
                                                                                  drain_inspect
``edac_ce_repeat``       >= ``edac_corrected_limit`` corrected errors (the counts  node, warning,
                         summed, not the lines) on one DIMM in the window         investigate
``unreadable_host_       an event whose details the rules cannot read (stored    node, warning,
events``                 before ingest checked them): skipped, and named         investigate
                         (:mod:`fleetwatch.rules.unreadable`)
=======================  ======================================================  ==============

Correctable SXids and corrected machine checks make no verdict: the hardware fixed them, and the
EDAC count of the same memory errors is the one thresholded. Each fatal rule makes one verdict
per switch, device or source however many records the error printed, with the SXids, links,
error names and counts in its evidence.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from fleetwatch.rules.host_evidence import (
    Component,
    HostRecord,
    HostVerdict,
    aer_evidence,
    densest,
    edac_evidence,
    error_count,
    errors,
    group,
    mce_evidence,
    sxid_evidence,
)
from fleetwatch.rules.thresholds import HealthThresholds, source_of
from fleetwatch.rules.unreadable import (
    UNREADABLE_HOST,
    Unreadable,
    readable_recent,
    unreadable_verdict,
)
from fleetwatch.rules.xid_catalog import Action, Severity

__all__ = [
    "HOST_KINDS",
    "Component",
    "HostEventLike",
    "HostVerdict",
    "is_urgent_host_event",
    "judge_host_errors",
    "mce_component",
]

HOST_KINDS = frozenset({"sxid", "pcie_aer", "mce", "edac"})
# Severities (details.severity) that take a GPU or a node out of service at once.
_URGENT = {
    "sxid": frozenset({"fatal"}),
    "pcie_aer": frozenset({"fatal", "non_fatal"}),
    "mce": frozenset({"fatal", "uncorrected"}),
    "edac": frozenset({"uncorrected"}),
}
_MAX_TIMESTAMPS = 20
_FM_GUIDE = "NVIDIA Fabric Manager User Guide, appendix D (D.5/D.6 fatal NVSwitch SXid errors)"
_AER_SPEC = "PCIe Base Specification 6.2 error classification; Linux PCI/pcieaer-howto.rst"
_MCE_SRC = "Linux x86 machine-check handling (uncorrected = data lost; fatal = panic)"
_EDAC_SRC = "Linux EDAC driver-api/edac.rst (UE: uncorrected error, data lost)"


class HostEventLike(Protocol):
    """What the rules read: :class:`fleetwatch.telemetry.Event` or a parser's ``KernelEvent``."""

    @property
    def kind(self) -> str: ...
    @property
    def ts(self) -> datetime | None: ...
    @property
    def pci_bus_id(self) -> str | None: ...
    @property
    def details(self) -> Mapping[str, Any] | None: ...


def is_urgent_host_event(kind: str, details: Mapping[str, Any] | None) -> bool:
    """Whether an event of these kind and details may take a GPU or node out of service now."""
    severity = (details or {}).get("severity")
    return isinstance(severity, str) and severity in _URGENT.get(kind, frozenset())


def judge_host_errors(
    events: Iterable[HostEventLike],
    *,
    gpus: Mapping[str, str],
    now: datetime,
    thresholds: HealthThresholds | None = None,
    lookback: timedelta = timedelta(hours=24),
) -> list[HostVerdict]:
    """Verdicts for the node's SXid, AER, MCE and EDAC events of the last ``lookback``.

    ``gpus`` maps the node's GPU PCI bus ids to their UUIDs (an AER record on one of those
    addresses, or naming one of those UUIDs, is on that GPU). Events without a time are taken
    as happening at ``now``, as :func:`fleetwatch.rules.xid.judge_xids` does.
    """
    t = thresholds or HealthThresholds()
    since = now - lookback
    by_uuid = {uuid: pci for pci, uuid in gpus.items()}
    evs: dict[str, list[HostRecord]] = defaultdict(list)
    skipped: list[Unreadable] = []
    for e, ts in readable_recent(events, HOST_KINDS, since=since, now=now, skipped=skipped):
        uuid = getattr(e, "uuid", None)
        evs[e.kind].append(HostRecord(e.kind, ts, e.pci_bus_id, uuid, e.details or {}))
    for items in evs.values():
        items.sort(key=lambda e: e.ts)
    verdicts = [
        *_sxid(evs["sxid"], t),
        *_aer(evs["pcie_aer"], gpus, by_uuid, t),
        *_mce(evs["mce"]),
        *_edac(evs["edac"], t),
    ]
    if skipped:
        verdicts.append(unreadable_verdict(UNREADABLE_HOST, skipped))
    verdicts.sort(key=lambda v: (v.first_seen, v.rule, v.gpu or ""))
    return verdicts


def _sxid(evs: Sequence[HostRecord], t: HealthThresholds) -> list[HostVerdict]:
    out: list[HostVerdict] = []
    for switch, items in group(evs, _switch_of).items():
        fatal = [e for e in items if e.severity == "fatal"]
        if fatal:
            out.append(
                _verdict(
                    "sxid_fatal",
                    fatal,
                    component="nvlink",
                    action="reboot_node",
                    severity="fatal",
                    source=_FM_GUIDE,
                    evidence={"switch": switch, **sxid_evidence(fatal)},
                    note="drain the node and reset its NVSwitch fabric with the GPUs (reboot); "
                    "inspect the link's trays and cables if it returns",
                )
            )
        non_fatal = [e for e in items if e.severity == "non_fatal"]
        window = timedelta(seconds=t.sxid_window_s)
        burst = densest(non_fatal, window)
        if len(burst) >= t.sxid_non_fatal_limit:
            out.append(
                _verdict(
                    "sxid_repeat",
                    burst,
                    component="nvlink",
                    action="investigate",
                    severity="warning",
                    source=source_of("sxid_non_fatal_limit"),
                    evidence={
                        "switch": switch,
                        "limit": t.sxid_non_fatal_limit,
                        "window_s": t.sxid_window_s,
                        **sxid_evidence(burst),
                    },
                    note="non-fatal SXids keep coming on this switch: check its links",
                )
            )
    return out


def _aer(
    evs: Sequence[HostRecord],
    gpus: Mapping[str, str],
    by_uuid: Mapping[str, str],
    t: HealthThresholds,
) -> list[HostVerdict]:
    def device(e: HostRecord) -> str:
        if e.uuid and e.uuid in by_uuid:
            return by_uuid[e.uuid]
        return e.pci or str(e.details.get("source") or e.details.get("reported_by") or "unknown")

    out: list[HostVerdict] = []
    window = timedelta(seconds=t.aer_corrected_window_s)
    for dev, items in group(evs, device).items():
        on_gpu = dev in gpus
        where: dict[str, Any] = {"gpu": dev, "uuid": gpus[dev]} if on_gpu else {}
        uncorrected = [e for e in items if e.severity in ("fatal", "non_fatal")]
        if uncorrected and on_gpu:
            fatal = any(e.severity == "fatal" for e in uncorrected)
            out.append(
                _verdict(
                    "aer_gpu_uncorrected",
                    uncorrected,
                    component="gpu",
                    action="drain_reset",
                    severity="fatal" if fatal else "critical",
                    counts_against_gpu=True,
                    source=_AER_SPEC,
                    evidence={"device": dev, **aer_evidence(uncorrected)},
                    note="uncorrected PCIe error on the GPU: drain, then reset the GPU; "
                    "reseat or inspect the slot if it returns",
                    **where,
                )
            )
        elif uncorrected:
            out.append(
                _verdict(
                    "aer_uncorrected",
                    uncorrected,
                    component="host",
                    action="investigate",
                    severity="warning",
                    source=_AER_SPEC,
                    evidence={"device": dev, **aer_evidence(uncorrected)},
                    note="uncorrected PCIe error on a device that is not a GPU of this node "
                    "(a root port or switch above a GPU would drop it: check lspci -t)",
                )
            )
        corrected = [e for e in items if e.severity == "corrected"]
        burst = densest(corrected, window)
        if len(burst) >= t.aer_corrected_limit:
            out.append(
                _verdict(
                    "aer_corrected_burst",
                    burst,
                    component="gpu" if on_gpu else "host",
                    action="investigate",
                    severity="warning",
                    source=source_of("aer_corrected_limit"),
                    evidence={
                        "device": dev,
                        "limit": t.aer_corrected_limit,
                        "window_s": t.aer_corrected_window_s,
                        **aer_evidence(burst),
                    },
                    note="corrected PCIe errors above the replay rate: a marginal link",
                    **where,
                )
            )
    return out


def _mce(evs: Sequence[HostRecord]) -> list[HostVerdict]:
    out: list[HostVerdict] = []
    bad = [e for e in evs if e.severity in ("fatal", "uncorrected")]
    for items in group(bad, _mce_component).values():
        fatal = any(e.severity == "fatal" for e in items)
        out.append(
            _verdict(
                "mce_uncorrected",
                items,
                component=_mce_component(items[0]),
                action="drain_inspect",
                severity="fatal" if fatal else "critical",
                source=_MCE_SRC,
                evidence=mce_evidence(items),
                note="the host lost data (CPU or memory): drain and inspect before it returns",
            )
        )
    deferred = [e for e in evs if e.severity == "deferred"]
    if deferred:
        out.append(
            _verdict(
                "mce_deferred",
                deferred,
                component=_mce_component(deferred[0]),
                action="investigate",
                severity="warning",
                source="AMD deferred errors: uncorrectable, not yet consumed by a process",
                evidence=mce_evidence(deferred),
            )
        )
    return out


def _edac(evs: Sequence[HostRecord], t: HealthThresholds) -> list[HostVerdict]:
    out: list[HostVerdict] = []
    ue = [e for e in evs if e.severity == "uncorrected"]
    if ue:
        out.append(
            _verdict(
                "edac_uncorrected",
                ue,
                component="memory",
                action="drain_inspect",
                severity="critical",
                source=_EDAC_SRC,
                evidence=edac_evidence(ue),
                note="uncorrected host memory error: drain, replace the DIMM",
                count=errors(ue),
            )
        )
    window = timedelta(seconds=t.edac_corrected_window_s)
    ce = [e for e in evs if e.severity == "corrected"]
    for dimm, items in group(ce, _dimm_of).items():
        burst = densest(items, window, weight=error_count)
        if errors(burst) >= t.edac_corrected_limit:
            out.append(
                _verdict(
                    "edac_ce_repeat",
                    burst,
                    component="memory",
                    action="investigate",
                    severity="warning",
                    source=source_of("edac_corrected_limit"),
                    evidence={
                        "dimm": dimm,
                        "limit": t.edac_corrected_limit,
                        "window_s": t.edac_corrected_window_s,
                        **edac_evidence(burst),
                    },
                    note="corrected errors keep coming on this DIMM: schedule its replacement",
                    count=errors(burst),
                )
            )
    return out


def _verdict(
    rule: str,
    evs: Sequence[HostRecord],
    *,
    component: Component,
    action: Action,
    severity: Severity,
    source: str,
    evidence: Mapping[str, Any],
    counts_against_gpu: bool = False,
    note: str = "",
    gpu: str | None = None,
    uuid: str | None = None,
    count: int | None = None,
) -> HostVerdict:
    return HostVerdict(
        rule=rule,
        scope="gpu" if gpu is not None else "node",
        component=component,
        action=action,
        severity=severity,
        counts_against_gpu=counts_against_gpu,
        source=source,
        count=len(evs) if count is None else count,
        first_seen=evs[0].ts,
        last_seen=evs[-1].ts,
        timestamps=tuple(e.ts for e in evs[:_MAX_TIMESTAMPS]),
        gpu=gpu,
        uuid=uuid,
        evidence=evidence,
        note=note,
    )


def _switch_of(e: HostRecord) -> str:
    return e.pci or str(e.details.get("switch") or "unknown")


def mce_component(details: Mapping[str, Any]) -> Component:
    """Memory when a machine-check record says it decoded a memory error, else the host (CPU,
    caches, bus)."""
    text = " ".join(str(details.get(k, "")) for k in ("section_type", "error", "source")).lower()
    memory = "memory" in text or "dram" in text or details.get("memory_controller") is not None
    decoded_by_edac = str(details.get("source", "")).startswith("edac")
    return "memory" if memory or decoded_by_edac else "host"


def _mce_component(e: HostRecord) -> Component:
    return mce_component(e.details)


def _dimm_of(e: HostRecord) -> str:
    label = e.details.get("label")
    if label:
        return str(label)
    return f"mc{e.details.get('memory_controller', '?')}"
