"""FakePynvml, NvmlLike and the adapter against the installed nvidia-ml-py: same names, parameters,
constants, error classes and struct fields. This is what a MagicMock could not promise."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from fleetwatch.agent import nvml as adapter
from fleetwatch.agent.nvml import NvmlLike
from fleetwatch.testing import FakePynvml
from fleetwatch.testing import _pynvml_api as mirror

pynvml: Any = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")

# getmembers, not vars: the MIG calls come from a mixin (fleetwatch.testing.fake_mig).
FAKE_FUNCTIONS = sorted(
    name
    for name, member in inspect.getmembers(FakePynvml, inspect.isfunction)
    if name.startswith("nvml")
)
MIG_FUNCTIONS = (
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
)
FAKE_CONSTANTS = sorted(
    name
    for name, value in vars(mirror.PynvmlConstants).items()
    if not name.startswith("_") and isinstance(value, int)
)
PROTOCOL_FUNCTIONS = sorted(
    name for name, member in vars(NvmlLike).items() if name.startswith("nvml") and callable(member)
)
STRUCTS = [
    (mirror.PciInfo, "nvmlPciInfo_t"),
    (mirror.Memory, "c_nvmlMemory_t"),
    (mirror.MemoryV2, "c_nvmlMemory_v2_t"),
    (mirror.Utilization, "c_nvmlUtilization_t"),
    (mirror.ViolationTime, "c_nvmlViolationTime_t"),
    (mirror.Value, "c_nvmlValue_t"),
    (mirror.FieldValue, "c_nvmlFieldValue_t"),
    (mirror.EventData, "c_nvmlEventData_t"),
]


def parameters(fn: Any) -> list[tuple[str, bool]]:
    """Names and whether each has a default; ``self`` left out."""
    params = inspect.signature(fn).parameters.values()
    return [(p.name, p.default is not p.empty) for p in params if p.name != "self"]


def test_fake_mirrors_enough_of_pynvml() -> None:
    assert len(FAKE_FUNCTIONS) >= 47
    assert len(FAKE_CONSTANTS) >= 62
    assert set(MIG_FUNCTIONS) <= set(FAKE_FUNCTIONS)


@pytest.mark.parametrize("name", FAKE_FUNCTIONS)
def test_fake_function_has_pynvml_name_and_parameters(name: str) -> None:
    assert hasattr(pynvml, name), f"pynvml has no {name}"
    assert parameters(getattr(FakePynvml, name)) == parameters(getattr(pynvml, name))


@pytest.mark.parametrize("name", PROTOCOL_FUNCTIONS)
def test_nvml_like_protocol_matches_pynvml(name: str) -> None:
    assert parameters(getattr(NvmlLike, name)) == parameters(getattr(pynvml, name))


@pytest.mark.parametrize("name", FAKE_CONSTANTS)
def test_fake_constant_has_pynvml_value(name: str) -> None:
    assert getattr(FakePynvml, name) == getattr(pynvml, name)


def test_nvml_like_constants_exist_in_pynvml() -> None:
    for name in NvmlLike.__annotations__:
        assert hasattr(pynvml, name), name
        assert hasattr(FakePynvml, name), name


@pytest.mark.parametrize("name", sorted(mirror.ERROR_CLASSES))
def test_fake_error_class_has_pynvml_name_and_code(name: str) -> None:
    fake_cls, real_cls = getattr(FakePynvml, name), getattr(pynvml, name)
    assert fake_cls().value == real_cls().value
    assert issubclass(fake_cls, FakePynvml.NVMLError)


def test_fake_nvml_error_maps_codes_to_the_same_subclasses() -> None:
    for code in range(0, 1000):
        real = type(pynvml.NVMLError(code)).__name__
        assert type(FakePynvml.NVMLError(code)).__name__ == real, code
    # and every error class pynvml generates is mirrored
    real_classes = {n for n in dir(pynvml) if n.startswith("NVMLError_")}
    assert real_classes == set(mirror.ERROR_CLASSES)


@pytest.mark.parametrize(("fake", "real"), STRUCTS, ids=[r for _, r in STRUCTS])
def test_fake_result_records_have_pynvml_struct_fields(fake: Any, real: str) -> None:
    real_fields = [f[0] for f in getattr(pynvml, real)._fields_]
    assert list(fake.__dataclass_fields__) == real_fields


def test_adapter_asks_only_for_what_pynvml_has() -> None:
    needed = {name for probe in adapter._PROBES + adapter._IDENTITY_PROBES for name in probe.needs}
    needed |= {const for const, _, _ in adapter._EVENT_KINDS}
    needed |= {const for _, const in adapter._FIELD_IDS}
    needed |= {
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    }
    needed |= {
        f"NVML_ERROR_{n}" for n in adapter._UNAVAILABLE + adapter._LOST + adapter._UNSUPPORTED
    }
    missing_in_real = sorted(n for n in needed if not hasattr(pynvml, n))
    missing_in_fake = sorted(n for n in needed if not hasattr(FakePynvml, n))
    assert (missing_in_real, missing_in_fake) == ([], [])
