"""NVML events (Xid, ECC) for :meth:`fleetwatch.agent.nvml.Nvml.watch_events`, one event set.

Every NVML call goes through the adapter handed in (its lock and error mapping); this module never
imports ``pynvml`` nor, at import time, the adapter.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from fleetwatch.agent.nvml_fields import _Device, _pci_bus_id
from fleetwatch.errors import CollectorError, NvmlUnavailable
from fleetwatch.telemetry import Event

if TYPE_CHECKING:  # the adapter imports this module and hands itself over
    from fleetwatch.agent.nvml import Nvml

logger = logging.getLogger(__name__)

_EVENT_KINDS = (  # event type constant, Event.kind, message
    ("nvmlEventTypeXidCriticalError", "xid", "NVML Xid critical error event"),
    ("nvmlEventTypeDoubleBitEccError", "ecc_dbe", "NVML double-bit ECC error event"),
    ("nvmlEventTypeSingleBitEccError", "ecc_sbe", "NVML single-bit ECC error event"),
)


def _watch(
    nvml: Nvml,
    stop: threading.Event,
    kinds: Sequence[str],
    timeout_ms: int,
    clock: Callable[[], datetime],
) -> Iterator[Event]:
    """The body of :meth:`Nvml.watch_events`."""
    lib = nvml.lib
    wanted = [(getattr(lib, c, 0), k, m) for c, k, m in _EVENT_KINDS if k in kinds]
    try:
        event_set, devices = _register(nvml, sum(t for t, _, _ in wanted))
    except NvmlUnavailable as exc:
        logger.warning("no NVML events: %s", exc)
        return
    failing = False
    try:
        while not stop.is_set():
            try:
                data = nvml._wait(event_set, timeout_ms)
            except NvmlUnavailable:
                return
            except CollectorError as exc:
                nvml._bump("event_wait")
                if not failing:
                    logger.warning("waiting for NVML events failed: %s", exc)
                failing = True
                stop.wait(timeout_ms / 1000)
                continue
            failing = False
            if data is not None:
                yield _to_event(data, wanted, devices.get(_handle_key(data.device)), clock())
    finally:
        try:
            nvml._call(lib.nvmlEventSetFree, event_set)
        except CollectorError as exc:
            logger.debug("nvmlEventSetFree failed: %s", exc)


def _register(nvml: Nvml, mask: int) -> tuple[Any, dict[int, tuple[str | None, str | None]]]:
    lib = nvml.lib
    event_set = nvml._call(lib.nvmlEventSetCreate)
    devices: dict[int, tuple[str | None, str | None]] = {}
    for index in range(nvml._count):
        try:
            handle = nvml._handle(index)
            types = nvml._call(lib.nvmlDeviceGetSupportedEventTypes, handle, index=index)
            if types & mask:
                nvml._call(
                    lib.nvmlDeviceRegisterEvents, handle, types & mask, event_set, index=index
                )
            uuid = nvml._uuids.get(index) or nvml._call(lib.nvmlDeviceGetUUID, handle)
        except NvmlUnavailable:
            raise
        except CollectorError as exc:
            logger.warning("GPU index %d: no NVML events: %s", index, exc)
            continue
        if not types & mask:
            logger.warning("GPU %s (index %d) offers no Xid/ECC events", uuid, index)
        gpu = nvml._identities.get(index)
        pci = gpu.pci_bus_id if gpu else _pci_or_none(nvml, handle, index, uuid)
        devices[_handle_key(handle)] = (uuid, pci)
    return event_set, devices


def _pci_or_none(nvml: Nvml, handle: Any, index: int, uuid: str) -> str | None:
    try:
        return _pci_bus_id(_Device(nvml, nvml.lib, handle, index, uuid)).get("pci_bus_id")
    except CollectorError:
        return None


def _handle_key(handle: Any) -> int:
    # pynvml hands out a new ctypes pointer object per call; the address names the device.
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value or 0
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


def _to_event(
    data: Any,
    wanted: list[tuple[int, str, str]],
    gpu: tuple[str | None, str | None] | None,
    ts: datetime,
) -> Event:
    uuid, pci = gpu or (None, None)
    kind, message = next(
        ((k, m) for t, k, m in wanted if data.eventType & t), ("nvml", "NVML event")
    )
    code = int(data.eventData)
    if kind == "xid" and code <= 0xFFFF:
        return Event(kind="xid", xid=code, uuid=uuid, pci_bus_id=pci, ts=ts, message=message)
    details = {"event_type": int(data.eventType), "event_data": code}
    return Event(
        kind=kind if kind != "xid" else "nvml",
        uuid=uuid,
        pci_bus_id=pci,
        ts=ts,
        message=message,
        details=details,
    )
