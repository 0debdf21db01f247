"""A hand-written stand-in for the ``pynvml`` module, driven by per-GPU snapshots.

``FakePynvml`` has nvidia-ml-py's function names, parameter names, constants and NVMLError classes
(``tests/unit/agent/test_nvml_fake_api.py`` holds it to the installed pynvml), so code under test
calls it exactly as it calls the real module; a misspelt call fails here as it would on a GPU.

A snapshot is one GPU as a dict (``tests/fixtures/nvml/*.json`` holds whole nodes)::

    {"uuid": "GPU-...", "serial": "...", "pci_bus_id": "00000000:18:00.0", "name": "...",
     "vbios_version": "...", "temperature_c": 41, "power_usage_mw": 312500,
     "enforced_power_limit_mw": 700000, "total_energy_mj": 1234567, "fan_speed_pct": 30,
     "clocks_mhz": {"sm": 1980, "mem": 2619}, "clocks_event_reasons": 1,
     "violation_ns": {"power": 0, "thermal": 0}, "utilization_pct": {"gpu": 97, "memory": 40},
     "memory_bytes": {"total": ..., "used": ..., "free": ...},
     "pcie": {"gen": 5, "width": 16, "max_gen": 5, "max_width": 16},
     "pcie_replay_counter": 0,
     "ecc_errors": {"volatile": {"corrected": 0, "uncorrected": 0}, "aggregate": {...}},
     "retired_pages": {"sbe": [addresses], "dbe": [], "pending": 0},
     "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": 0, "failure": 0},
     "nvlink": {"links": 18, "inactive": [], "errors": {"crc_flit": {"3": 12}, ...}},
     "field_values": {"NVML_FI_DEV_MEMORY_TEMP": 45},
     "supported_event_types": 11, "unsupported": ["nvmlDeviceGetFanSpeed"],
     "mig": {"current": 1, "pending": 1, "devices": [...]}}

``mig`` (a MIG-capable GPU, its mode and MIG devices) is described in
:mod:`fleetwatch.testing.fake_mig`, which holds the MIG calls.

A key that is absent makes its NVML call raise ``NVMLError_NotSupported`` (the field values entry
reports NOT_SUPPORTED), as NVML does for a GPU that lacks the reading. Node-wide,
``missing_functions`` names calls the emulated driver is too old for: they raise
``NVMLError_FunctionNotFound``.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from fleetwatch.testing._pynvml_api import (
    ERROR_CLASSES,
    EventData,
    FieldValue,
    Memory,
    MemoryV2,
    NVMLError,
    PciInfo,
    PynvmlConstants,
    Utilization,
    Value,
    ViolationTime,
)
from fleetwatch.testing.fake_mig import FakeMigDeviceHandle, FakeMigDevices

__all__ = ["FakeDeviceHandle", "FakeEventSet", "FakePynvml"]

_C = PynvmlConstants
_NVLINK_COUNTERS = {
    _C.NVML_NVLINK_ERROR_DL_REPLAY: "replay",
    _C.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
    _C.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
    _C.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data",
}
_FIELD_NAMES = {value: name for name, value in vars(_C).items() if name.startswith("NVML_FI_")}
_DEFAULT_EVENTS = (
    _C.nvmlEventTypeXidCriticalError
    | _C.nvmlEventTypeSingleBitEccError
    | _C.nvmlEventTypeDoubleBitEccError
)


@dataclass(eq=False)
class FakeDeviceHandle:
    """What ``nvmlDeviceGetHandleByIndex`` returns: one object per GPU, like a device pointer."""

    index: int


@dataclass(eq=False)
class FakeEventSet:
    registered: dict[int, int] = field(default_factory=dict)  # GPU index -> event type mask
    queue: deque[EventData] = field(default_factory=deque)
    freed: bool = False


class FakePynvml(FakeMigDevices, PynvmlConstants):
    """A pynvml-like module object over GPU snapshots, with knobs to make GPUs misbehave.

    ``call_cost_us`` makes every NVML call take that long (busy-waiting by default, since a
    sleep that short oversleeps), for benchmarks that want realistic per-call costs.
    ``calls`` counts calls by function name and ``device_calls`` by (function, GPU index).
    """

    NVMLError = NVMLError

    def __init__(
        self,
        gpus: list[dict[str, Any]],
        *,
        driver_version: str = "550.90.07",
        nvml_version: str = "12.550.90.07",
        missing_functions: tuple[str, ...] | list[str] = (),
        init_error: int | None = None,
        call_cost_us: float = 0.0,
        call_cost_mode: Literal["spin", "sleep"] = "spin",
    ) -> None:
        self.gpus = [copy.deepcopy(gpu) for gpu in gpus]
        self.driver_version = driver_version
        self.nvml_version = nvml_version
        self.missing_functions = set(missing_functions)
        self.init_error = init_error
        self.call_cost_us = call_cost_us
        self.call_cost_mode = call_cost_mode
        self.calls: Counter[str] = Counter()
        self.device_calls: Counter[tuple[str, int]] = Counter()
        self.lost: set[int] = set()
        self.event_wait_error: int | None = None  # nvmlEventSetWait_v2 raises this code
        self._refcount = 0
        self._handles = [FakeDeviceHandle(i) for i in range(len(self.gpus))]
        self._event_sets: list[FakeEventSet] = []
        self._events = threading.Condition()

    @classmethod
    def from_json(cls, path: str | Path, **options: Any) -> FakePynvml:
        """A fake node from a fixture file: ``{"driver_version": ..., "gpus": [...]}``."""
        node = json.loads(Path(path).read_text())
        for key in ("driver_version", "nvml_version", "missing_functions"):
            if key in node:
                options.setdefault(key, node[key])
        return cls(node["gpus"], **options)

    # -- knobs ------------------------------------------------------------------------------

    def lose_gpu(self, index: int) -> None:
        """From now on every call about this GPU raises ``NVMLError_GpuIsLost``."""
        self.lost.add(index)

    def restore_gpu(self, index: int) -> None:
        self.lost.discard(index)

    def set_unsupported(self, index: int, *names: str) -> None:
        """Make NVML functions (or ``NVML_FI_*`` field values) raise NotSupported for one GPU."""
        self.gpus[index].setdefault("unsupported", []).extend(names)

    def set_error(self, index: int, function: str, code: int | None) -> None:
        """Make one NVML function raise ``NVMLError(code)`` for one GPU (None: stop)."""
        errors = self.gpus[index].setdefault("errors", {})
        if code is None:
            errors.pop(function, None)
        else:
            errors[function] = code

    def set_value(self, index: int, path: str, value: Any) -> None:
        """Set a snapshot value by dotted path, e.g. ``"ecc_errors.volatile.corrected"``."""
        parent, key = self._walk(index, path)
        parent[key] = value

    def advance(self, index: int, path: str, by: int | float = 1) -> None:
        """Add to a counter by dotted path, e.g. ``"nvlink.errors.crc_flit.3"``."""
        parent, key = self._walk(index, path)
        parent[key] = parent.get(key, 0) + by

    def inject_xid(self, index: int, xid: int) -> None:
        """An Xid on this GPU, delivered to every event set registered for Xid events."""
        self.inject_event(index, self.nvmlEventTypeXidCriticalError, xid)

    def registered_event_types(self, index: int) -> int:
        """The event types some live event set waits for on this GPU."""
        with self._events:
            return _union(s.registered.get(index, 0) for s in self._event_sets)

    def inject_event(self, index: int, event_type: int, data: int = 0) -> None:
        with self._events:
            for event_set in self._event_sets:
                if event_set.registered.get(index, 0) & event_type:
                    event = EventData(
                        self._handles[index], event_type, data, 0xFFFFFFFF, 0xFFFFFFFF
                    )
                    event_set.queue.append(event)
            self._events.notify_all()

    # -- library and system -----------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlInitWithFlags(self, flags: int) -> None:
        self._spend("nvmlInitWithFlags")
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self._refcount += 1

    def nvmlShutdown(self) -> None:
        self._library("nvmlShutdown")
        self._refcount -= 1

    def nvmlErrorString(self, result: int) -> str:
        return str(NVMLError(result))

    def nvmlSystemGetDriverVersion(self) -> str:
        self._library("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._library("nvmlSystemGetNVMLVersion")
        return self.nvml_version

    def nvmlDeviceGetCount(self) -> int:
        self._library("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDeviceHandle:
        self._library("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return self._handles[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeDeviceHandle:
        self._library("nvmlDeviceGetHandleByUUID")
        for handle, gpu in zip(self._handles, self.gpus, strict=True):
            if gpu.get("uuid") == uuid:
                return handle
        raise NVMLError(self.NVML_ERROR_NOT_FOUND)

    # -- one GPU ----------------------------------------------------------------------------

    def nvmlDeviceGetIndex(self, handle: FakeDeviceHandle) -> int:
        self._gpu("nvmlDeviceGetIndex", handle)
        return handle.index

    def nvmlDeviceGetUUID(self, handle: FakeDeviceHandle) -> str:
        return str(self._get("nvmlDeviceGetUUID", handle, "uuid"))

    def nvmlDeviceGetSerial(self, handle: FakeDeviceHandle) -> str:
        return str(self._get("nvmlDeviceGetSerial", handle, "serial"))

    def nvmlDeviceGetName(self, handle: FakeDeviceHandle) -> str:
        return str(self._get("nvmlDeviceGetName", handle, "name"))

    def nvmlDeviceGetVbiosVersion(self, handle: FakeDeviceHandle) -> str:
        return str(self._get("nvmlDeviceGetVbiosVersion", handle, "vbios_version"))

    def nvmlDeviceGetPciInfo(self, handle: FakeDeviceHandle) -> PciInfo:
        return self.nvmlDeviceGetPciInfo_v3(handle)

    def nvmlDeviceGetPciInfo_v3(self, handle: FakeDeviceHandle) -> PciInfo:
        bus_id = str(self._get("nvmlDeviceGetPciInfo_v3", handle, "pci_bus_id"))
        domain, bus, rest = bus_id.split(":")
        device = int(rest.split(".")[0], 16)
        legacy = f"{int(domain, 16):04X}:{int(bus, 16):02X}:{device:02X}.0".encode()
        return PciInfo(legacy, int(domain, 16), int(bus, 16), device, 0, 0, bus_id.encode())

    def nvmlDeviceGetTemperature(self, handle: FakeDeviceHandle, sensor: int) -> int:
        if sensor != self.NVML_TEMPERATURE_GPU:
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return int(self._get("nvmlDeviceGetTemperature", handle, "temperature_c"))

    def nvmlDeviceGetFieldValues(
        self, handle: FakeDeviceHandle, fieldIds: list[int]
    ) -> list[FieldValue]:
        gpu = self._gpu("nvmlDeviceGetFieldValues", handle)
        values, unsupported = gpu.get("field_values", {}), gpu.get("unsupported", [])
        now_us = int(time.time() * 1_000_000)
        out = []
        for field_id in fieldIds:
            name = _FIELD_NAMES.get(field_id, str(field_id))
            if name in values and name not in unsupported:
                value = Value.of(values[name])
                entry = FieldValue(
                    field_id, 0, now_us, 0, self.NVML_VALUE_TYPE_UNSIGNED_INT, 0, value
                )
            else:
                entry = FieldValue(field_id, 0, now_us, 0, 0, self.NVML_ERROR_NOT_SUPPORTED)
            out.append(entry)
        return out

    def nvmlDeviceGetPowerUsage(self, handle: FakeDeviceHandle) -> int:
        return int(self._get("nvmlDeviceGetPowerUsage", handle, "power_usage_mw"))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeDeviceHandle) -> int:
        return int(self._get("nvmlDeviceGetEnforcedPowerLimit", handle, "enforced_power_limit_mw"))

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeDeviceHandle) -> int:
        return int(self._get("nvmlDeviceGetTotalEnergyConsumption", handle, "total_energy_mj"))

    def nvmlDeviceGetClockInfo(self, handle: FakeDeviceHandle, type: int) -> int:
        key = {self.NVML_CLOCK_SM: "sm", self.NVML_CLOCK_MEM: "mem"}.get(type)
        if key is None:
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return int(self._get("nvmlDeviceGetClockInfo", handle, "clocks_mhz", key))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeDeviceHandle) -> int:
        fn = "nvmlDeviceGetCurrentClocksEventReasons"
        return int(self._get(fn, handle, "clocks_event_reasons"))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeDeviceHandle) -> int:
        fn = "nvmlDeviceGetCurrentClocksThrottleReasons"
        return int(self._get(fn, handle, "clocks_event_reasons"))

    def nvmlDeviceGetViolationStatus(
        self, device: FakeDeviceHandle, perfPolicyType: int
    ) -> ViolationTime:
        policies = {self.NVML_PERF_POLICY_POWER: "power", self.NVML_PERF_POLICY_THERMAL: "thermal"}
        if perfPolicyType not in policies:
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        ns = self._get(
            "nvmlDeviceGetViolationStatus", device, "violation_ns", policies[perfPolicyType]
        )
        return ViolationTime(int(time.time() * 1_000_000), int(ns))

    def nvmlDeviceGetFanSpeed(self, handle: FakeDeviceHandle) -> int:
        return int(self._get("nvmlDeviceGetFanSpeed", handle, "fan_speed_pct"))

    def nvmlDeviceGetUtilizationRates(self, handle: FakeDeviceHandle) -> Utilization:
        util = self._get("nvmlDeviceGetUtilizationRates", handle, "utilization_pct")
        return Utilization(int(util["gpu"]), int(util["memory"]))

    def nvmlDeviceGetMemoryInfo(
        self, handle: FakeDeviceHandle, version: int | None = None
    ) -> Memory | MemoryV2:
        mem = self._get("nvmlDeviceGetMemoryInfo", handle, "memory_bytes")
        if version:
            reserved = int(mem.get("reserved", 0))
            return MemoryV2(version, mem["total"], reserved, mem["free"], mem["used"] - reserved)
        return Memory(int(mem["total"]), int(mem["free"]), int(mem["used"]))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: FakeDeviceHandle) -> int:
        return int(self._get("nvmlDeviceGetCurrPcieLinkGeneration", handle, "pcie", "gen"))

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: FakeDeviceHandle) -> int:
        return int(self._get("nvmlDeviceGetCurrPcieLinkWidth", handle, "pcie", "width"))

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: FakeDeviceHandle) -> int:
        return int(self._get("nvmlDeviceGetMaxPcieLinkGeneration", handle, "pcie", "max_gen"))

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: FakeDeviceHandle) -> int:
        return int(self._get("nvmlDeviceGetMaxPcieLinkWidth", handle, "pcie", "max_width"))

    def nvmlDeviceGetPcieReplayCounter(self, handle: FakeDeviceHandle) -> int:
        return int(self._get("nvmlDeviceGetPcieReplayCounter", handle, "pcie_replay_counter"))

    def nvmlDeviceGetTotalEccErrors(
        self, handle: FakeDeviceHandle, errorType: int, counterType: int
    ) -> int:
        kind = {0: "corrected", 1: "uncorrected"}.get(errorType)
        counter = {0: "volatile", 1: "aggregate"}.get(counterType)
        if kind is None or counter is None:
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return int(self._get("nvmlDeviceGetTotalEccErrors", handle, "ecc_errors", counter, kind))

    def nvmlDeviceGetRetiredPages(self, device: FakeDeviceHandle, sourceFilter: int) -> list[int]:
        cause = {0: "sbe", 1: "dbe"}.get(sourceFilter)
        if cause is None:
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return [
            int(a) for a in self._get("nvmlDeviceGetRetiredPages", device, "retired_pages", cause)
        ]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: FakeDeviceHandle) -> int:
        fn = "nvmlDeviceGetRetiredPagesPendingStatus"
        return int(self._get(fn, device, "retired_pages", "pending"))

    def nvmlDeviceGetRemappedRows(self, device: FakeDeviceHandle) -> tuple[int, int, int, int]:
        rows = self._get("nvmlDeviceGetRemappedRows", device, "remapped_rows")
        return (
            int(rows["correctable"]),
            int(rows["uncorrectable"]),
            int(rows["pending"]),
            int(rows["failure"]),
        )

    def nvmlDeviceGetNvLinkState(self, device: FakeDeviceHandle, link: int) -> int:
        nvlink = self._get("nvmlDeviceGetNvLinkState", device, "nvlink")
        self._check_link(nvlink, link)
        return self.NVML_FEATURE_DISABLED if link in nvlink.get("inactive", ()) else 1

    def nvmlDeviceGetNvLinkErrorCounter(
        self, device: FakeDeviceHandle, link: int, counter: int
    ) -> int:
        nvlink = self._get("nvmlDeviceGetNvLinkErrorCounter", device, "nvlink")
        self._check_link(nvlink, link)
        if counter not in _NVLINK_COUNTERS:
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return int(nvlink.get("errors", {}).get(_NVLINK_COUNTERS[counter], {}).get(str(link), 0))

    # -- events -----------------------------------------------------------------------------

    def nvmlDeviceGetSupportedEventTypes(self, handle: FakeDeviceHandle) -> int:
        gpu = self._gpu("nvmlDeviceGetSupportedEventTypes", handle)
        return int(gpu.get("supported_event_types", _DEFAULT_EVENTS))

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._library("nvmlEventSetCreate")
        event_set = FakeEventSet()
        with self._events:
            self._event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(
        self, handle: FakeDeviceHandle, eventTypes: int, eventSet: FakeEventSet
    ) -> None:
        gpu = self._gpu("nvmlDeviceRegisterEvents", handle)
        supported = int(gpu.get("supported_event_types", _DEFAULT_EVENTS))
        if eventTypes & ~supported:  # NVML refuses a mask with any type the GPU lacks
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        with self._events:
            eventSet.registered[handle.index] = (
                eventSet.registered.get(handle.index, 0) | eventTypes
            )

    def nvmlEventSetWait_v2(self, eventSet: FakeEventSet, timeoutms: int) -> EventData:
        self._library("nvmlEventSetWait_v2")
        with self._events:
            if eventSet.freed:
                raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
            if self.event_wait_error is not None:
                raise NVMLError(self.event_wait_error)
            if not self._events.wait_for(lambda: eventSet.queue, timeout=timeoutms / 1000):
                raise NVMLError(self.NVML_ERROR_TIMEOUT)
            return eventSet.queue.popleft()

    def nvmlEventSetWait(self, eventSet: FakeEventSet, timeoutms: int) -> EventData:
        return self.nvmlEventSetWait_v2(eventSet, timeoutms)

    def nvmlEventSetFree(self, eventSet: FakeEventSet) -> None:
        self._library("nvmlEventSetFree")
        with self._events:
            eventSet.freed = True
            self._event_sets.remove(eventSet)

    # -- internals --------------------------------------------------------------------------

    def _spend(self, fn: str) -> None:
        self.calls[fn] += 1
        if fn in self.missing_functions:
            raise NVMLError(self.NVML_ERROR_FUNCTION_NOT_FOUND)
        if self.call_cost_us <= 0:
            return
        if self.call_cost_mode == "sleep":
            time.sleep(self.call_cost_us / 1e6)
            return
        until = time.perf_counter() + self.call_cost_us / 1e6
        while time.perf_counter() < until:
            pass

    def _library(self, fn: str) -> None:
        self._spend(fn)
        if self._refcount <= 0:
            raise NVMLError(self.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, fn: str, handle: FakeDeviceHandle | FakeMigDeviceHandle) -> dict[str, Any]:
        if isinstance(handle, FakeMigDeviceHandle):
            return self._mig_device_snapshot(fn, handle)  # asks its parent GPU, just below
        self._library(fn)
        self.device_calls[(fn, handle.index)] += 1
        if handle.index in self.lost:
            raise NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        gpu = self.gpus[handle.index]
        if fn in gpu.get("errors", {}):
            raise NVMLError(gpu["errors"][fn])
        if fn in gpu.get("unsupported", ()):
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _get(self, fn: str, handle: FakeDeviceHandle, *path: str) -> Any:
        value: Any = self._gpu(fn, handle)
        for key in path:
            if not isinstance(value, dict) or key not in value:
                raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
            value = value[key]
        return value

    def _check_link(self, nvlink: dict[str, Any], link: int) -> None:
        if not 0 <= link < int(nvlink.get("links", 0)):
            raise NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)

    def _walk(self, index: int, path: str) -> tuple[dict[str, Any], str]:
        *parents, key = path.split(".")
        node = self.gpus[index]
        for part in parents:
            node = node.setdefault(part, {})
        return node, key


def _union(masks: Iterable[int]) -> int:
    out = 0
    for mask in masks:
        out |= mask
    return out


for _name, _cls in ERROR_CLASSES.items():
    setattr(FakePynvml, _name, _cls)

if TYPE_CHECKING:  # the fake must satisfy the protocol the adapter is written against
    from fleetwatch.agent.nvml import NvmlLike

    _check: NvmlLike = FakePynvml([])
