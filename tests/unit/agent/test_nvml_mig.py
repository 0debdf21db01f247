"""MIG through NVML (issue 13), on the *fake* NVML: no MIG hardware here, so FakePynvml plays a
node (``tests/fixtures/nvml/h100_mig.json``) whose GPU 0 has MIG enabled. The fake keeps
nvidia-ml-py's names and error classes (``test_nvml_fake_api.py`` holds it to the installed
pynvml); the MIG calls' answers follow nvml.h's documentation of each (see
:mod:`fleetwatch.testing.fake_mig`)."""

from __future__ import annotations

import ctypes
import gzip
import logging
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fleetwatch.agent.collectors.base import Collection
from fleetwatch.agent.collectors.nvml import NvmlCollector
from fleetwatch.agent.loop import build_batch, encode
from fleetwatch.agent.nvml import Nvml
from fleetwatch.telemetry import Batch, NodeInfo
from fleetwatch.testing import FakeMigDeviceHandle, FakePynvml

NVML_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvml"
NOW = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)
MIG_GPU, PLAIN, PENDING = (
    "GPU-b4895dbf-9350-2524-a89b-98161ddd9fe4",
    "GPU-4f3a1c00-7c2d-4b3a-9f8e-1d2c3b4a5e61",
    "GPU-4f3a1c00-7c2d-4b3a-9f8e-1d2c3b4a5e62",
)
REFUSED_UNDER_MIG = {
    "gpu_util_pct",
    "mem_copy_util_pct",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "remapped_rows_pending",
    "remapped_rows_failure",
}


@pytest.fixture
def fake() -> FakePynvml:
    return FakePynvml.from_json(NVML_FIXTURES / "h100_mig.json")


@pytest.fixture
def collector(fake: FakePynvml) -> Iterator[NvmlCollector]:
    col = NvmlCollector(Nvml(fake))
    yield col
    col.close()


def _gpu(collection: Collection, uuid: str) -> Any:
    return next(g for g in collection.gpus if g.uuid == uuid)


def _values(collection: Collection, uuid: str) -> dict[str, Any]:
    return next(s for s in collection.samples if s.uuid == uuid).values()


# -- the fake's MIG calls -------------------------------------------------------------------


def test_fake_mig_mode_and_device_handles(fake: FakePynvml) -> None:
    fake.nvmlInit()
    gpu0, gpu1 = fake.nvmlDeviceGetHandleByIndex(0), fake.nvmlDeviceGetHandleByIndex(1)
    assert fake.nvmlDeviceGetMigMode(gpu0) == [fake.NVML_DEVICE_MIG_ENABLE] * 2
    assert fake.nvmlDeviceGetMigMode(gpu1) == [fake.NVML_DEVICE_MIG_DISABLE] * 2
    assert fake.nvmlDeviceGetMaxMigDeviceCount(gpu0) == 7

    mig = fake.nvmlDeviceGetMigDeviceHandleByIndex(gpu0, 1)
    assert isinstance(mig, FakeMigDeviceHandle)
    assert fake.nvmlDeviceGetUUID(mig) == "MIG-56c30729-347f-5dd6-8da0-c3cc59e969e0"
    assert fake.nvmlDeviceGetName(mig) == "NVIDIA H100 80GB HBM3 MIG 2g.20gb"
    assert (fake.nvmlDeviceGetGpuInstanceId(mig), fake.nvmlDeviceGetComputeInstanceId(mig)) == (
        3,
        0,
    )
    assert fake.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig) is gpu0
    # pynvml returns the ctypes object itself: truthy, with a .value.
    is_mig = fake.nvmlDeviceIsMigDeviceHandle(mig)
    assert isinstance(is_mig, ctypes.c_uint) and is_mig and is_mig.value == 1
    assert not fake.nvmlDeviceIsMigDeviceHandle(gpu0)


def _mig0(f: FakePynvml, g0: Any) -> Any:
    return f.nvmlDeviceGetMigDeviceHandleByIndex(g0, 0)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda f, g0, g1: f.nvmlDeviceGetMigDeviceHandleByIndex(g0, 4), "NotFound"),
        (lambda f, g0, g1: f.nvmlDeviceGetMigDeviceHandleByIndex(g0, 7), "InvalidArgument"),
        (lambda f, g0, g1: f.nvmlDeviceGetMigDeviceHandleByIndex(g1, 0), "NotSupported"),
        (lambda f, g0, g1: f.nvmlDeviceGetGpuInstanceId(g0), "NotSupported"),
        (lambda f, g0, g1: f.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(g0), "InvalidArgument"),
        (lambda f, g0, g1: f.nvmlDeviceGetTemperature(_mig0(f, g0), 0), "NotSupported"),
        (lambda f, g0, g1: f.nvmlDeviceGetMigMode(_mig0(f, g0)), "InvalidArgument"),
    ],
)
def test_fake_mig_calls_fail_as_nvml_documents(fake: FakePynvml, call: Any, error: str) -> None:
    fake.nvmlInit()
    g0, g1 = fake.nvmlDeviceGetHandleByIndex(0), fake.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(getattr(FakePynvml, f"NVMLError_{error}")):
        call(fake, g0, g1)


def test_fake_gpu_without_mig_refuses_every_mig_call() -> None:
    fake = FakePynvml.from_json(NVML_FIXTURES / "h100_8x.json")
    fake.nvmlInit()
    gpu = fake.nvmlDeviceGetHandleByIndex(0)
    for call in (fake.nvmlDeviceGetMigMode, fake.nvmlDeviceGetMaxMigDeviceCount):
        with pytest.raises(FakePynvml.NVMLError_NotSupported):
            call(gpu)


def test_fake_mig_device_of_a_lost_gpu_is_lost(fake: FakePynvml) -> None:
    fake.nvmlInit()
    mig = fake.nvmlDeviceGetMigDeviceHandleByIndex(fake.nvmlDeviceGetHandleByIndex(0), 0)
    fake.lose_gpu(0)
    with pytest.raises(FakePynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetUUID(mig)


# -- the adapter ----------------------------------------------------------------------------


def test_a_mig_gpu_is_read_whole_with_its_mig_devices(collector: NvmlCollector) -> None:
    collection = collector.collect(NOW)

    mig = _gpu(collection, MIG_GPU).mig
    assert (mig.current, mig.pending) == ("enabled", "enabled")
    assert [i.model_dump(exclude_none=True) for i in mig.instances] == [
        {"gpu_instance_id": 2, "compute_instance_id": 0, "index": 0, "profile": "3g.40gb",
         "uuid": "MIG-7089d0f3-293f-58c9-8f8c-5ea666eedbde"},
        {"gpu_instance_id": 3, "compute_instance_id": 0, "index": 1, "profile": "2g.20gb",
         "uuid": "MIG-56c30729-347f-5dd6-8da0-c3cc59e969e0"},
        {"gpu_instance_id": 9, "compute_instance_id": 0, "index": 2, "profile": "1g.10gb",
         "uuid": "MIG-9d14fb21-4ae1-546f-a636-011582899c39"},
        {"gpu_instance_id": 10, "compute_instance_id": 0, "index": 3, "profile": "1g.10gb",
         "uuid": "MIG-0f709664-740c-52b0-ae79-3e4c9ede6d3b"},
    ]  # fmt: skip
    assert _gpu(collection, PLAIN).mig is None  # MIG disabled now and after reset
    pending = _gpu(collection, PENDING).mig
    assert (pending.current, pending.pending, pending.instances) == ("disabled", "enabled", [])
    # The same whole-GPU readings as its twin without MIG, less what NVML refuses under MIG.
    plain = _values(collection, PLAIN)
    assert _values(collection, MIG_GPU) == {
        k: v for k, v in plain.items() if k not in REFUSED_UNDER_MIG
    }
    assert REFUSED_UNDER_MIG <= set(plain)


def test_the_fake_node_matches_nvidias_nvidia_smi_L_example(
    collector: NvmlCollector, shared_dir: Path
) -> None:
    # An independent reading of the fixture's source: the real `nvidia-smi -L` output.
    listing = (
        shared_dir
        / "fixtures/mig/nvidia-cloud-native-docs__nvidia-smi-L_H100-80GB_MIG-mixed-3g-2g-1g.txt"
    ).read_text()
    printed = re.findall(r"MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[0-9a-f-]+)\)", listing)
    assert MIG_GPU in listing and len(printed) == 4
    mig = _gpu(collector.collect(NOW), MIG_GPU).mig
    assert [(i.profile, str(i.index), i.uuid) for i in mig.instances] == printed


def _refusals_per_plain_h100() -> int:
    """How many fields an H100 without MIG does not offer (no fan, no page retirement)."""
    fake = FakePynvml.from_json(NVML_FIXTURES / "h100_8x.json")
    collector = NvmlCollector(Nvml(fake))
    try:
        collector.collect(NOW)
        return collector.errors[("nvml", "field_not_supported")] // len(fake.gpus)
    finally:
        collector.close()


def test_fields_refused_under_mig_are_absent_not_faults(
    fake: FakePynvml, collector: NvmlCollector, caplog: pytest.LogCaptureFixture
) -> None:
    per_plain_h100 = _refusals_per_plain_h100()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fleetwatch.agent"):
        collector.collect(NOW)
        collector.collect(NOW)

    # Only the two GPUs without MIG count what they lack (an SXM H100 has no fan reading).
    assert collector.errors[("nvml", "field_not_supported")] == 2 * per_plain_h100
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 2 and not any(MIG_GPU in w for w in warned)
    (info,) = [r.getMessage() for r in caplog.records if "MIG enabled" in r.getMessage()]
    assert MIG_GPU in info and "gpu_util_pct" in info and "remapped_rows_pending" in info
    # Asked once, not every cycle.
    assert fake.device_calls[("nvmlDeviceGetUtilizationRates", 0)] == 1
    assert fake.device_calls[("nvmlDeviceGetRemappedRows", 0)] == 1


def test_mig_devices_are_read_again_each_cycle(fake: FakePynvml, collector: NvmlCollector) -> None:
    collector.collect(NOW)
    fake.gpus[0]["mig"]["devices"].pop(1)  # nvidia-smi mig -dci/-dgi: no reset needed

    mig = _gpu(collector.collect(NOW), MIG_GPU).mig
    assert [i.gpu_instance_id for i in mig.instances] == [2, 9, 10]


def test_turning_mig_off_asks_again_for_what_mig_hid(
    fake: FakePynvml, collector: NvmlCollector
) -> None:
    collector.collect(NOW)
    # MIG disabled and the GPU reset: the driver reports utilisation and remapped rows again.
    fake.set_value(0, "mig.current", 0)
    fake.set_value(0, "mig.pending", 0)
    fake.set_value(0, "utilization_pct", {"gpu": 55, "memory": 20})
    fake.set_value(
        0, "remapped_rows", {"correctable": 0, "uncorrectable": 0, "pending": 0, "failure": 0}
    )

    collection = collector.collect(NOW)
    assert _gpu(collection, MIG_GPU).mig is None
    values = _values(collection, MIG_GPU)
    assert values["gpu_util_pct"] == 55 and values["remapped_rows_pending"] is False
    # What it lacks with or without MIG (no fan on an SXM board) now counts like any GPU's.
    assert collector.errors[("nvml", "field_not_supported")] == 3 * _refusals_per_plain_h100()


def test_an_nvidia_ml_py_without_mig_calls_reads_the_gpu_all_the_same() -> None:
    fake = FakePynvml.from_json(
        NVML_FIXTURES / "h100_mig.json", missing_functions=["nvmlDeviceGetMigMode"]
    )
    collector = NvmlCollector(Nvml(fake))
    try:
        collection = collector.collect(NOW)
        collector.collect(NOW)
    finally:
        collector.close()
    assert all(g.mig is None for g in collection.gpus)
    assert _values(collection, MIG_GPU)["gpu_temp_c"] == 38
    assert fake.calls["nvmlDeviceGetMigMode"] == 3  # once per GPU, never again


def test_a_mig_gpu_travels_as_a_valid_batch(collector: NvmlCollector) -> None:
    batch = build_batch(NodeInfo(name="node-m"), collector.collect(NOW))
    sent = Batch.model_validate_json(gzip.decompress(encode(batch)))
    assert sent == batch
    assert next(g for g in sent.gpus if g.uuid == MIG_GPU).mig is not None
