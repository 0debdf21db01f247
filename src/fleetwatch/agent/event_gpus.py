"""Which of the node's GPUs a kernel-log event is about, when the event names a PCI device.

A PCIe AER record names the device that logged the error: a root port, a switch port, a NIC, or
one of the node's GPUs. The agent knows its GPUs' addresses (NVML, dcgm-exporter, nvidia-smi;
normalised on the wire, ``00000000:3B:00.0`` and ``0000:3b:00.0`` alike), so an AER event whose
device is a GPU leaves with that GPU's uuid. Only GPUs declared in the same batch are used, so the
server always knows the uuid it is sent. Xid and lost-GPU events keep their address alone (the
server maps it, as before); an NVSwitch's address is never a GPU's.
"""

from __future__ import annotations

from collections.abc import Iterable

from fleetwatch.telemetry import Event, GpuIdentity

__all__ = ["ADDRESSED_KINDS", "attach_gpu_uuids"]

ADDRESSED_KINDS = frozenset({"pcie_aer"})


def attach_gpu_uuids(events: list[Event], gpus: Iterable[GpuIdentity]) -> list[Event]:
    """``events``, each one of :data:`ADDRESSED_KINDS` at a GPU's address given that uuid."""
    by_address = {gpu.pci_bus_id: gpu.uuid for gpu in gpus if gpu.pci_bus_id}
    if not by_address:
        return events
    out = []
    for event in events:
        uuid = by_address.get(event.pci_bus_id) if event.pci_bus_id else None
        if event.kind in ADDRESSED_KINDS and event.uuid is None and uuid is not None:
            event = event.model_copy(update={"uuid": uuid})
        out.append(event)
    return out
