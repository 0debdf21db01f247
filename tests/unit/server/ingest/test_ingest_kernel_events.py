"""The kernel-log event kinds beyond Xid (issue 13) on the wire: the server takes them as wire v1
events (any ``kind``, ``details`` kept as sent), stores them and shows them in the events API,
on SQLite and PostgreSQL. No server change was needed: the tests pin that down."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
from tests.factories import make_batch
from tests.unit.server.conftest import Push

Read = Callable[..., httpx.Response]

SXID_DETAILS = {
    "sxid": 20034,
    "severity": "fatal",
    "severity_from": "line",
    "catalog_class": "fatal",
    "catalog_name": "LTSSM Fault Up",
    "link": 48,
    "switch": "nvidia-nvswitch1",
    "source": "kernel",
}
AER_DETAILS = {
    "severity": "fatal",
    "layer": "Transaction Layer",
    "errors": ["SDES"],
    "error_bits": [5],
    "status": "00000020",
    "mask": "00100000",
    "reported_by": "0000:3a:00.0",
    "multiple": False,
}
MCE_DETAILS = {"source": "edac_skx", "severity": "uncorrected", "status": "0xac00000200a00090"}
EDAC_DETAILS = {
    "severity": "corrected",
    "count": 20,
    "memory_controller": 0,
    "label": "CPU_SrcID#0_Ha#0_Chan#2_DIMM#0",
    "location": {"channel": 2, "slot": 0, "page": "0x104e5c"},
    "overflow": True,
}


def _events(now: str) -> list[dict[str, Any]]:
    return [
        {"kind": "sxid", "ts": now, "pci_bus_id": "0000:06:00.0", "details": SXID_DETAILS,
         "message": "Fatal, Link 48 LTSSM Fault Up"},
        {"kind": "pcie_aer", "ts": now, "pci_bus_id": "00000000:3B:00.0", "details": AER_DETAILS,
         "message": "PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer"},
        {"kind": "mce", "ts": now, "details": MCE_DETAILS, "message": "CPU 0: Machine Check"},
        {"kind": "edac", "ts": now, "details": EDAC_DETAILS, "message": "EDAC MC0: 20 CE ..."},
    ]  # fmt: skip


def test_new_kernel_event_kinds_are_stored_and_shown(push: Push, read: Read) -> None:
    batch = make_batch("node-k", gpus=2)
    batch["gpus"][1]["pci_bus_id"] = "0000:3b:00.0"
    batch["events"] = _events(datetime.now(UTC).isoformat())

    response = push(batch)
    assert response.status_code == 200, response.text
    assert response.json()["accepted"]["events"] == 4
    shown = {
        kind: read("/v1/events", kind=kind).json()["data"]
        for kind in ("sxid", "pcie_aer", "mce", "edac")
    }
    (sxid,), (aer,), (mce,), (edac,) = shown.values()
    assert (sxid["details"], sxid["pci_bus_id"], sxid["gpu_uuid"]) == (
        SXID_DETAILS,
        "0000:06:00.0",
        None,  # an NVSwitch is none of the node's GPUs
    )
    # The AER device is GPU 1, whatever the spelling of its address.
    assert (aer["details"], aer["pci_bus_id"]) == (AER_DETAILS, "0000:3b:00.0")
    assert aer["gpu_uuid"] == batch["gpus"][1]["uuid"]
    assert (mce["details"], edac["details"]) == (MCE_DETAILS, EDAC_DETAILS)
    assert {e["node"] for e in (sxid, aer, mce, edac)} == {"node-k"}
    recent = read(f"/v1/gpus/{batch['gpus'][1]['uuid']}").json()["recent_events"]
    assert [e["kind"] for e in recent] == ["pcie_aer"]
