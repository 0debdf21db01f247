"""The parts of nvidia-ml-py's ``pynvml`` that :class:`~fleetwatch.testing.FakePynvml` mirrors.

Constants carry pynvml's names and values, the error classes its names and codes (built the way
pynvml builds them: ``NVML_ERROR_GPU_IS_LOST`` becomes ``NVMLError_GpuIsLost``, and
``NVMLError(15)`` returns an ``NVMLError_GpuIsLost``), and the result records its structs' field
names. ``tests/unit/agent/test_nvml_fake_api.py`` checks all three against the installed pynvml,
which is what keeps a misspelt NVML call from passing in tests (a MagicMock accepts anything).
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Any, ClassVar

__all__ = [
    "ERROR_CLASSES",
    "EventData",
    "FieldValue",
    "Memory",
    "MemoryV2",
    "NVMLError",
    "PciInfo",
    "PynvmlConstants",
    "Utilization",
    "Value",
    "ViolationTime",
]


class PynvmlConstants:
    """pynvml's module constants that FleetWatch uses, with pynvml's values."""

    NVML_SUCCESS = 0
    NVML_ERROR_UNINITIALIZED = 1
    NVML_ERROR_INVALID_ARGUMENT = 2
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NO_PERMISSION = 4
    NVML_ERROR_ALREADY_INITIALIZED = 5
    NVML_ERROR_NOT_FOUND = 6
    NVML_ERROR_INSUFFICIENT_SIZE = 7
    NVML_ERROR_INSUFFICIENT_POWER = 8
    NVML_ERROR_DRIVER_NOT_LOADED = 9
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_IRQ_ISSUE = 11
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_FUNCTION_NOT_FOUND = 13
    NVML_ERROR_CORRUPTED_INFOROM = 14
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_ERROR_RESET_REQUIRED = 16
    NVML_ERROR_OPERATING_SYSTEM = 17
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
    NVML_ERROR_IN_USE = 19
    NVML_ERROR_MEMORY = 20
    NVML_ERROR_NO_DATA = 21
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
    NVML_ERROR_DEPRECATED = 26
    NVML_ERROR_NOT_READY = 27
    NVML_ERROR_GPU_NOT_FOUND = 28
    NVML_ERROR_INVALID_STATE = 29
    NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
    NVML_ERROR_UNKNOWN = 999

    NVML_FEATURE_DISABLED = 0
    NVML_FEATURE_ENABLED = 1
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_PERF_POLICY_POWER = 0
    NVML_PERF_POLICY_THERMAL = 1
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_AGGREGATE_ECC = 1
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    NVML_NVLINK_MAX_LINKS = 36
    NVML_NVLINK_ERROR_DL_REPLAY = 0
    NVML_NVLINK_ERROR_DL_RECOVERY = 1
    NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
    NVML_NVLINK_ERROR_DL_CRC_DATA = 3
    NVML_FI_DEV_MEMORY_TEMP = 82
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
    NVML_VALUE_TYPE_DOUBLE = 0
    NVML_VALUE_TYPE_UNSIGNED_INT = 1
    NVML_VALUE_TYPE_UNSIGNED_LONG = 2
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
    NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
    NVML_VALUE_TYPE_SIGNED_INT = 5
    NVML_VALUE_TYPE_UNSIGNED_SHORT = 6
    nvmlEventTypeSingleBitEccError = 0x0000000000000001
    nvmlEventTypeDoubleBitEccError = 0x0000000000000002
    nvmlEventTypeXidCriticalError = 0x0000000000000008
    nvmlEventTypeNone = 0x0000000000000000


_ERROR_STRINGS = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    5: "Already Initialized",
    6: "Not Found",
    7: "Insufficient Size",
    8: "Insufficient External Power",
    9: "Driver Not Loaded",
    10: "Timeout",
    11: "Interrupt Request Issue",
    12: "NVML Shared Library Not Found",
    13: "Function Not Found",
    14: "Corrupted infoROM",
    15: "GPU is lost",
    16: "GPU requires restart",
    17: "The operating system has blocked the request.",
    18: "RM has detected an NVML/RM version mismatch.",
    20: "Insufficient Memory",
    999: "Unknown Error",
}


class NVMLError(Exception):
    """pynvml's ``NVMLError``: ``NVMLError(code)`` returns the subclass registered for the code."""

    _valClassMapping: ClassVar[dict[int, type[NVMLError]]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:
        klass: type[NVMLError] = cls
        if klass is NVMLError:
            klass = NVMLError._valClassMapping.get(value, klass)
        obj = Exception.__new__(klass)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return _ERROR_STRINGS.get(self.value, f"NVML Error with code {self.value}")


def _error_class(code: int, name: str) -> type[NVMLError]:
    def new(cls: type[NVMLError], *args: object) -> NVMLError:
        return NVMLError.__new__(cls, code)

    return type(name, (NVMLError,), {"__new__": new, "__module__": __name__})


def _build_error_classes() -> dict[str, type[NVMLError]]:
    classes = {}
    for const, code in vars(PynvmlConstants).items():
        if const.startswith("NVML_ERROR_"):
            # The same naming rule as pynvml's _extractNVMLErrorsAsClasses.
            words = string.capwords(const.removeprefix("NVML_ERROR_"), "_").replace("_", "")
            cls = _error_class(code, "NVMLError_" + words)
            NVMLError._valClassMapping[code] = cls
            classes[cls.__name__] = cls
    return classes


ERROR_CLASSES: dict[str, type[NVMLError]] = _build_error_classes()


# Result records: attribute names are those of pynvml's ctypes structs (nvmlPciInfo_t, ...).
@dataclass
class PciInfo:
    busIdLegacy: bytes
    domain: int
    bus: int
    device: int
    pciDeviceId: int
    pciSubSystemId: int
    busId: bytes


@dataclass
class Memory:
    total: int
    free: int
    used: int


@dataclass
class MemoryV2:
    version: int
    total: int
    reserved: int
    free: int
    used: int


@dataclass
class Utilization:
    gpu: int
    memory: int


@dataclass
class ViolationTime:
    referenceTime: int
    violationTime: int


@dataclass
class Value:
    """pynvml's ``c_nvmlValue_t`` union: every member holds the one value."""

    dVal: float = 0.0
    uiVal: int = 0
    ulVal: int = 0
    ullVal: int = 0
    sllVal: int = 0
    siVal: int = 0
    usVal: int = 0

    @classmethod
    def of(cls, value: Any) -> Value:
        number = int(value)
        return cls(float(value), number, number, number, number, number, number)


@dataclass
class FieldValue:
    fieldId: int
    scopeId: int
    timestamp: int
    latencyUsec: int
    valueType: int
    nvmlReturn: int
    value: Value = field(default_factory=Value)


@dataclass
class EventData:
    device: object
    eventType: int
    eventData: int
    gpuInstanceId: int
    computeInstanceId: int
