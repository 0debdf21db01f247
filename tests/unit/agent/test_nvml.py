"""NvmlCollector and the NVML adapter, over FakePynvml and the fake nodes in tests/fixtures/nvml."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fleetwatch.agent import nvml as nvml_module
from fleetwatch.agent.collectors.base import Collection, Watcher
from fleetwatch.agent.collectors.nvml import NvmlCollector
from fleetwatch.agent.nvml import Nvml
from fleetwatch.errors import NvmlUnavailable
from fleetwatch.telemetry import GpuSample
from fleetwatch.testing import FakePynvml

NVML_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvml"
NOW = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)
H100_0 = "GPU-4f3a1c00-7c2d-4b3a-9f8e-1d2c3b4a5e60"
MIB = 1024 * 1024


def fake_node(name: str, **options: Any) -> FakePynvml:
    return FakePynvml.from_json(NVML_FIXTURES / f"{name}.json", **options)


@pytest.fixture
def h100() -> FakePynvml:
    return fake_node("h100_8x")


@pytest.fixture
def collector(h100: FakePynvml) -> Iterator[NvmlCollector]:
    col = NvmlCollector(Nvml(h100))
    yield col
    col.close()


def sample_of(collection: Collection, uuid: str) -> dict[str, Any]:
    return next(s for s in collection.samples if s.uuid == uuid).values()


def warnings_about(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and text in r.getMessage()
    ]


def test_nvml_collector_is_a_collector_and_watcher(collector: NvmlCollector) -> None:
    assert collector.name == "nvml"
    assert isinstance(collector, Watcher)


def test_nvml_reads_every_h100_field_in_canonical_units(collector: NvmlCollector) -> None:
    collection = collector.collect(NOW)

    assert len(collection.gpus) == len(collection.samples) == 8
    assert collection.events == []
    gpu = collection.gpus[0]
    assert gpu.model_dump(exclude_none=True) == {
        "uuid": H100_0,
        "index": 0,
        "serial": "1652423010593",
        "pci_bus_id": "0000:18:00.0",  # NVML's 00000000:18:00.0, normalised
        "name": "NVIDIA H100 80GB HBM3",
        "driver_version": "550.90.07",
        "vbios_version": "96.00.99.00.01",
    }
    assert collection.samples[0].ts == NOW
    assert sample_of(collection, H100_0) == {
        "gpu_temp_c": 38,
        "memory_temp_c": 45,  # NVML_FI_DEV_MEMORY_TEMP through nvmlDeviceGetFieldValues
        "power_w": 312.5,  # 312500 mW
        "power_limit_w": 700.0,  # 700000 mW
        "energy_mj": 9876543210,
        "sm_clock_mhz": 1980,
        "mem_clock_mhz": 2619,
        "clocks_event_reasons": 0,
        "power_violation_us": 1234567,  # 1234567890 ns
        "thermal_violation_us": 0,
        "gpu_util_pct": 97,
        "mem_copy_util_pct": 40,
        "fb_used_mib": 1024.0,  # bytes / 2**20
        "fb_total_mib": 81559.0,
        "pcie_link_gen": 5,
        "pcie_link_width": 16,
        "ecc_sbe_volatile_total": 0,
        "ecc_dbe_volatile_total": 0,
        "ecc_sbe_aggregate_total": 100,
        "ecc_dbe_aggregate_total": 0,
        "remapped_rows_correctable": 0,
        "remapped_rows_uncorrectable": 0,
        "remapped_rows_pending": False,
        "remapped_rows_failure": False,
        "nvlink_crc_flit_errors_total": 0,
        "nvlink_crc_data_errors_total": 0,
        "nvlink_replay_errors_total": 0,
        "nvlink_recovery_errors_total": 0,
        "pcie_replay_total": 0,
        "gpu_recovery_action": 0,
    }
    # Hopper has no fan and no page retirement: absent, never 0.
    assert collector._nvml.disabled[H100_0] == {
        "fan_speed_pct",
        "retired_pages_sbe",
        "retired_pages_dbe",
        "retired_pages_pending",
    }


def test_nvml_sums_nvlink_errors_over_active_links_only(collector: NvmlCollector) -> None:
    values = sample_of(collector.collect(NOW), "GPU-4f3a1c03-7c2d-4b3a-9f8e-1d2c3b4a5e63")

    assert values["nvlink_crc_flit_errors_total"] == 5 + 7  # link 17 (1000 errors) is down
    assert values["nvlink_crc_data_errors_total"] == 2
    assert values["nvlink_replay_errors_total"] == 3 + 1
    assert values["nvlink_recovery_errors_total"] == 1


def test_nvml_counters_advance_between_reads(h100: FakePynvml, collector: NvmlCollector) -> None:
    collector.collect(NOW)
    h100.advance(0, "ecc_errors.volatile.corrected", 5)
    h100.advance(0, "nvlink.errors.replay.2", 3)
    h100.advance(0, "total_energy_mj", 1000)
    h100.set_value(0, "power_usage_mw", 650_250)

    values = sample_of(collector.collect(NOW), H100_0)

    assert values["ecc_sbe_volatile_total"] == 5
    assert values["nvlink_replay_errors_total"] == 3
    assert values["energy_mj"] == 9876543210 + 1000
    assert values["power_w"] == 650.25


def test_nvml_a100_reports_a_pending_row_remap() -> None:
    collector = NvmlCollector(Nvml(fake_node("a100_remap_pending")))
    collection = collector.collect(NOW)
    collector.close()

    values = collection.samples[0].values()
    assert values["remapped_rows_correctable"] == 1
    assert values["remapped_rows_uncorrectable"] == 2
    assert values["remapped_rows_pending"] is True
    assert values["remapped_rows_failure"] is False
    assert values["ecc_dbe_volatile_total"] == 1
    assert values["power_violation_us"] == 7_000_000
    assert values["nvlink_crc_flit_errors_total"] == 1
    assert "gpu_recovery_action" not in values  # driver 535 lacks the field
    assert collection.gpus[0].driver_version == "535.161.08"


def test_nvml_old_gpu_without_row_remapping_or_nvlink() -> None:
    fake = fake_node("p100_no_remap")
    collector = NvmlCollector(Nvml(fake))
    collector.collect(NOW)
    values = collector.collect(NOW).samples[0].values()
    collector.close()

    assert values["retired_pages_sbe"] == 2
    assert values["retired_pages_dbe"] == 1
    assert values["retired_pages_pending"] is False
    assert values["pcie_link_gen"] == 3
    for absent in ("remapped_rows_pending", "nvlink_crc_flit_errors_total", "memory_temp_c"):
        assert absent not in values
    # Driver 470 predates nvmlDeviceGetCurrentClocksEventReasons: asked once, then the older call.
    assert values["clocks_event_reasons"] == 1
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 2
    assert fake.device_calls[("nvmlDeviceGetNvLinkState", 0)] == 1  # no NVLink: asked once


def test_nvml_unsupported_field_is_turned_off_once_with_one_warning(
    h100: FakePynvml, collector: NvmlCollector, caplog: pytest.LogCaptureFixture
) -> None:
    h100.set_unsupported(1, "nvmlDeviceGetPowerUsage")

    samples = [collector.collect(NOW) for _ in range(3)]

    gpu1 = "GPU-4f3a1c01-7c2d-4b3a-9f8e-1d2c3b4a5e61"
    assert h100.device_calls[("nvmlDeviceGetPowerUsage", 1)] == 1  # never asked again
    assert h100.device_calls[("nvmlDeviceGetPowerUsage", 0)] == 3
    assert all("power_w" not in sample_of(c, gpu1) for c in samples)  # absent, not 0
    assert all(sample_of(c, H100_0)["power_w"] == 312.5 for c in samples)
    [warning] = warnings_about(caplog, gpu1)  # one line for all this GPU lacks (fan, ...)
    assert "power_w (nvmlDeviceGetPowerUsage: Not Supported [NVML_ERROR_NOT_SUPPORTED])" in warning
    assert "fan_speed_pct" in warning
    assert "power_w" in collector._nvml.disabled[gpu1]
    assert "power_w" not in collector._nvml.disabled[H100_0]
    # 4 fixture gaps (fan, 3 retired pages fields) x 8 GPUs, plus power_w on GPU 1
    assert collector.errors[("nvml", "field_not_supported")] == 33


@pytest.mark.parametrize("code", ["NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_NO_PERMISSION"])
def test_nvml_missing_function_or_permission_turns_the_field_off(
    h100: FakePynvml, collector: NvmlCollector, code: str
) -> None:
    h100.set_error(0, "nvmlDeviceGetTotalEccErrors", getattr(h100, code))
    for _ in range(2):
        values = sample_of(collector.collect(NOW), H100_0)
    assert not any(name.startswith("ecc_") for name in values)
    assert h100.device_calls[("nvmlDeviceGetTotalEccErrors", 0)] == 4  # once per ECC field


def test_nvml_unsupported_field_value_turns_off_only_that_field(
    h100: FakePynvml, collector: NvmlCollector
) -> None:
    h100.set_unsupported(0, "NVML_FI_DEV_MEMORY_TEMP")
    for _ in range(3):
        values = sample_of(collector.collect(NOW), H100_0)
    assert "memory_temp_c" not in values
    assert values["gpu_recovery_action"] == 0
    assert h100.device_calls[("nvmlDeviceGetFieldValues", 0)] == 3  # one call per read


def test_nvml_lost_gpu_is_skipped_and_reported_once(
    h100: FakePynvml, collector: NvmlCollector, caplog: pytest.LogCaptureFixture
) -> None:
    collector.collect(NOW)
    h100.lose_gpu(2)

    first = collector.collect(NOW)
    second = collector.collect(NOW)

    lost_uuid = "GPU-4f3a1c02-7c2d-4b3a-9f8e-1d2c3b4a5e62"
    assert len(first.samples) == len(second.samples) == 7
    assert lost_uuid not in {s.uuid for s in first.samples}
    [event] = first.events
    assert (event.kind, event.uuid, event.pci_bus_id, event.ts) == (
        "gpu_lost",
        lost_uuid,
        "0000:3a:00.0",
        NOW,
    )
    assert "NVML_ERROR_GPU_IS_LOST" in (event.message or "")
    assert second.events == []
    assert collector.errors[("nvml", "device_lost")] == 2
    assert len(warnings_about(caplog, "is lost")) == 1


def test_nvml_lost_gpu_coming_back_is_logged_once_and_read_again(
    h100: FakePynvml, collector: NvmlCollector, caplog: pytest.LogCaptureFixture
) -> None:
    h100.lose_gpu(5)
    collector.collect(NOW)
    h100.restore_gpu(5)

    back = [collector.collect(NOW) for _ in range(2)]

    assert all(len(c.samples) == 8 and c.events == [] for c in back)
    assert len(warnings_about(caplog, "answers again")) == 1
    h100.lose_gpu(5)
    assert [e.kind for e in collector.collect(NOW).events] == ["gpu_lost"]  # a new loss


def test_nvml_gpu_lost_before_its_first_read_has_an_index_but_no_uuid(
    h100: FakePynvml,
) -> None:
    h100.lose_gpu(7)
    collector = NvmlCollector(Nvml(h100))
    [event] = collector.collect(NOW).events
    collector.close()
    assert event.uuid is None
    assert "GPU index 7 is lost" in (event.message or "")


@pytest.mark.parametrize(
    "code", ["NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_UNKNOWN", "NVML_ERROR_GPU_NOT_FOUND"]
)
def test_nvml_lost_codes_skip_the_device(
    h100: FakePynvml, collector: NvmlCollector, code: str
) -> None:
    collector.collect(NOW)
    h100.set_error(4, "nvmlDeviceGetTemperature", getattr(h100, code))
    collection = collector.collect(NOW)
    assert len(collection.samples) == 7
    assert [e.kind for e in collection.events] == ["gpu_lost"]


def test_nvml_transient_error_leaves_the_field_out_once_and_retries(
    h100: FakePynvml, collector: NvmlCollector, caplog: pytest.LogCaptureFixture
) -> None:
    h100.set_error(0, "nvmlDeviceGetPcieReplayCounter", h100.NVML_ERROR_TIMEOUT)
    failing = [sample_of(collector.collect(NOW), H100_0) for _ in range(2)]
    h100.set_error(0, "nvmlDeviceGetPcieReplayCounter", None)
    recovered = sample_of(collector.collect(NOW), H100_0)

    assert all("pcie_replay_total" not in v and "power_w" in v for v in failing)
    assert recovered["pcie_replay_total"] == 0
    assert collector.errors[("nvml", "nvml_error")] == 2
    [warning] = warnings_about(caplog, "pcie_replay_total")
    assert "nvmlDeviceGetPcieReplayCounter: Timeout [NVML_ERROR_TIMEOUT]" in warning


def test_nvml_implausible_value_is_dropped_not_the_sample(
    h100: FakePynvml, collector: NvmlCollector
) -> None:
    h100.set_value(0, "temperature_c", 4000)  # a driver glitch
    values = sample_of(collector.collect(NOW), H100_0)
    assert "gpu_temp_c" not in values
    assert values["power_w"] == 312.5
    assert collector.errors[("nvml", "invalid_value")] == 1


@pytest.mark.parametrize(
    "code",
    ["NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_NO_PERMISSION"],
)
def test_nvml_unavailable_when_the_library_fails_to_init(code: str) -> None:
    fake = fake_node("p100_no_remap")
    fake.init_error = getattr(fake, code)
    with pytest.raises(NvmlUnavailable, match="cannot initialise NVML"):
        NvmlCollector(Nvml(fake))


def test_nvml_unavailable_without_nvidia_ml_py(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    with pytest.raises(NvmlUnavailable, match="nvidia-ml-py is not installed"):
        Nvml().open()


def test_nvml_uninitialised_library_mid_run_fails_the_whole_collect(
    h100: FakePynvml, collector: NvmlCollector
) -> None:
    h100.set_error(0, "nvmlDeviceGetTemperature", h100.NVML_ERROR_UNINITIALIZED)
    with pytest.raises(NvmlUnavailable):
        collector.collect(NOW)


def test_nvml_close_shuts_nvml_down_once(h100: FakePynvml) -> None:
    collector = NvmlCollector(Nvml(h100))
    collector.close()
    collector.close()
    assert h100.calls["nvmlShutdown"] == 1
    with pytest.raises(NvmlUnavailable):
        collector.collect(NOW)


def test_nvml_field_this_library_lacks_is_off_from_the_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class OldPynvml(FakePynvml):
        def __getattribute__(self, name: str) -> Any:
            if name in ("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", "nvmlDeviceGetRemappedRows"):
                raise AttributeError(name)
            return super().__getattribute__(name)

    fake = OldPynvml(FakePynvml.from_json(NVML_FIXTURES / "h100_8x.json").gpus)
    collector = NvmlCollector(Nvml(fake))
    values = sample_of(collector.collect(NOW), H100_0)
    collector.close()

    assert "gpu_recovery_action" not in values and "remapped_rows_pending" not in values
    assert collector._nvml.unavailable_fields == (
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
        "remapped_rows_pending",
        "remapped_rows_failure",
        "gpu_recovery_action",
    )
    assert len(warnings_about(caplog, "nvidia-ml-py lacks")) == 1


def test_nvml_holds_the_lock_for_every_call(h100: FakePynvml) -> None:
    unlocked: list[str] = []
    spend = h100._spend

    def checked(fn: str) -> None:
        if not nvml_module._LOCK.locked():
            unlocked.append(fn)
        spend(fn)

    h100._spend = checked  # type: ignore[method-assign]
    collector = NvmlCollector(Nvml(h100))
    collector.collect(NOW)
    collector.close()
    assert sum(h100.calls.values()) > 100
    assert unlocked == []


class _CountingTime:
    """Stands in for the fake's ``time`` module: sleeps are recorded, not slept, and
    ``perf_counter`` advances 0.125 s per read, so a busy-wait ends after a known number of
    reads. Exact binary fractions keep the arithmetic exact; no test reads a real clock."""

    STEP = 0.125

    def __init__(self) -> None:
        self.slept: list[float] = []
        self.reads = 0

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)

    def perf_counter(self) -> float:
        self.reads += 1
        return self.reads * self.STEP

    def time(self) -> float:
        return 1_700_000_000.0


def _read_all_counting(mode: str, monkeypatch: pytest.MonkeyPatch) -> tuple[int, _CountingTime]:
    """NVML calls made by one ``read_all`` with a 0.5 s call cost, and the fake clock."""
    from fleetwatch.testing import fake_nvml

    fake = fake_node("p100_no_remap", call_cost_us=500_000, call_cost_mode=mode)
    clock = _CountingTime()
    monkeypatch.setattr(fake_nvml, "time", clock)
    nvml = Nvml(fake).open()
    before, reads_before = sum(fake.calls.values()), clock.reads
    clock.slept.clear()
    nvml.read_all(NOW)
    calls = sum(fake.calls.values()) - before
    nvml.close()
    clock.reads -= reads_before
    assert calls > 10
    return calls, clock


def test_nvml_fake_call_cost_is_slept_once_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    calls, clock = _read_all_counting("sleep", monkeypatch)
    assert clock.slept == [0.5] * calls
    assert clock.reads == 0


def test_nvml_fake_call_cost_is_spun_until_spent_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    calls, clock = _read_all_counting("spin", monkeypatch)
    # Per call: one read to set the target (t + 0.5 s), then four 0.125 s reads until it is reached.
    assert clock.reads == calls * 5
    assert clock.slept == []


def test_nvml_every_sample_validates_on_the_wire(collector: NvmlCollector) -> None:
    for sample in collector.collect(NOW).samples:
        assert GpuSample.model_validate_json(sample.model_dump_json()) == sample


def test_nvml_fb_units_are_mebibytes() -> None:
    fake = fake_node("p100_no_remap")
    fake.set_value(0, "memory_bytes.used", 1536 * MIB)
    nvml = Nvml(fake).open()
    values = nvml.read_all(NOW).samples[0].values()
    nvml.close()
    assert (values["fb_used_mib"], values["fb_total_mib"]) == (1536.0, 16384.0)


def test_nvml_probe_script_reports_fields_disabled_and_timing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util
    import json

    path = Path(__file__).resolve().parents[3] / "scripts" / "nvml_probe.py"
    spec = importlib.util.spec_from_file_location("nvml_probe", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    fake = fake_node("a100_remap_pending")
    monkeypatch.setattr(script, "Nvml", lambda: Nvml(fake))

    assert script.main(["--repeat", "3", "--watch", "0.3"]) == 0

    report = json.loads(capsys.readouterr().out)
    [gpu] = report["gpus"]
    assert gpu["values"]["remapped_rows_pending"] is True
    assert "gpu_recovery_action" in gpu["disabled"] and "fan_speed_pct" in gpu["absent"]
    assert report["read_seconds"]["repeats"] == 3
    assert report["driver_version"] == "535.161.08" and report["events"] == []
