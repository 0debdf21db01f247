"""The NVML adapter on a real GPU and driver: ``pytest -m gpu tests/hardware``.

Skips, with the reason, where nvidia-ml-py is missing or NVML does not initialise (no driver, no
GPU), so a CPU-only run stays green without pretending to have tested anything.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from fleetwatch.agent.collectors.nvml import NvmlCollector
from fleetwatch.agent.nvml import Nvml
from fleetwatch.telemetry import SAMPLE_FIELD_NAMES, GpuIdentity, GpuSample

pytestmark = pytest.mark.gpu

pynvml: Any = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")


def _nvml_skip_reason() -> str | None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"NVML does not initialise here ({exc}); run on a GPU node"
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            return "NVML sees no GPU"
    finally:
        pynvml.nvmlShutdown()
    return None


_REASON = _nvml_skip_reason()
if _REASON is not None:
    pytest.skip(_REASON, allow_module_level=True)


@pytest.fixture(scope="module")
def nvml() -> Iterator[Nvml]:
    with Nvml() as opened:
        yield opened


def test_real_nvml_reads_every_gpu_with_sane_values(nvml: Nvml) -> None:
    read = nvml.read_all(datetime.now(UTC))

    assert read.lost == []
    assert len(read.gpus) == len(read.samples) == pynvml.nvmlDeviceGetCount()
    for gpu, sample in zip(read.gpus, read.samples, strict=True):
        assert gpu.uuid.startswith("GPU-")
        assert gpu.uuid == sample.uuid
        assert gpu.pci_bus_id is not None and gpu.driver_version
        values = sample.values()
        assert 0 <= values["gpu_temp_c"] <= 120
        assert values["fb_total_mib"] > 0
        assert 0 <= values["fb_used_mib"] <= values["fb_total_mib"]
        assert 0 < values["power_w"] <= values.get("power_limit_w", 10_000) * 1.5
        assert set(values) <= set(SAMPLE_FIELD_NAMES)
        assert GpuSample.model_validate_json(sample.model_dump_json()) == sample
        assert GpuIdentity.model_validate_json(gpu.model_dump_json()) == gpu
    assert ("nvml", "nvml_error") not in nvml.errors


def test_real_nvml_counters_do_not_go_backwards(nvml: Nvml) -> None:
    first = {s.uuid: s.values() for s in nvml.read_all(datetime.now(UTC)).samples}
    second = {s.uuid: s.values() for s in nvml.read_all(datetime.now(UTC)).samples}
    for uuid, values in second.items():
        for name in ("energy_mj", "ecc_sbe_aggregate_total", "pcie_replay_total"):
            if name in values and name in first[uuid]:
                assert values[name] >= first[uuid][name], (uuid, name)


def test_real_nvml_event_watch_starts_and_stops() -> None:
    collector = NvmlCollector(event_timeout_ms=200)
    emitted: list[Any] = []
    collector.start_watch(emitted.extend)
    threading.Event().wait(0.5)
    collector.stop_watch()
    collector.close()
    assert all(e.kind in ("xid", "ecc_dbe") for e in emitted)
