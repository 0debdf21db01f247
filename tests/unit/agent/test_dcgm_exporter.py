from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from fleetwatch.agent.collectors.dcgm_exporter import DcgmExporterCollector
from fleetwatch.agent.loop import build_batch
from fleetwatch.agent.parsers import GpuReading, ParseError
from fleetwatch.agent.parsers.dcgm_exporter import (
    last_xids,
    parse_dcgm_exporter,
    parse_dcgm_scrape,
)
from fleetwatch.telemetry import SAMPLE_FIELDS, GpuSample, NodeInfo

DATADOG = "datadog__dcgm_tests_fixtures_metrics.txt"
LEGACY_2GPU = "legacy-1.x_pod-gpu-metrics-exporter_2gpu.prom"
LEGACY_README = "legacy-1.x_prometheus-dcgm_README_sample.prom"
MIG = "nvidia-docs_A100_MIG_ub20-a100-k8s.prom"

T4_460 = "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e"
T4_470 = "GPU-9ef1b6d0-3643-5dd7-b823-c0ec20dcf2d5"
A100_MIG = "GPU-34319582-d595-d1c7-d1d2-179bcfa61660"


def _read(fixtures_dir: Path, name: str) -> str:
    return (fixtures_dir / "dcgm_exporter" / "metrics" / name).read_text()


def _by_uuid(readings: list[GpuReading]) -> dict[str, GpuReading]:
    return {r.identity["uuid"]: r for r in readings}


def _as_sample(reading: GpuReading) -> GpuSample:
    ts = datetime(2026, 1, 1, tzinfo=UTC)
    return GpuSample(uuid=reading.identity["uuid"], ts=ts, **reading.values)


def test_dcgm_exporter_parses_every_fixture(fixtures_dir: Path) -> None:
    files = sorted((fixtures_dir / "dcgm_exporter" / "metrics").iterdir())
    assert {f.name for f in files} >= {DATADOG, LEGACY_2GPU, LEGACY_README, MIG}
    for path in files:
        readings = parse_dcgm_exporter(path.read_text())
        assert readings, path.name
        for reading in readings:
            _as_sample(reading)  # every value has the type and range ingest accepts


def test_dcgm_exporter_datadog_values(fixtures_dir: Path) -> None:
    gpus = _by_uuid(parse_dcgm_exporter(_read(fixtures_dir, DATADOG)))

    # Three labelled GPUs; the unlabelled dummy series ("NAME 0") create none.
    assert set(gpus) == {T4_460, T4_470, "GPU-abc"}
    t4 = gpus[T4_460]
    assert t4.identity == {
        "uuid": T4_460,
        "index": 0,
        "name": "Tesla T4",
        "driver_version": "460.106.00",
    }
    assert t4.values == {
        "sm_clock_mhz": 300.0,
        "mem_clock_mhz": 405.0,
        "gpu_temp_c": 25.0,
        "power_w": 8.969,
        "energy_mj": 128996013,
        "pcie_replay_total": 0,
        "gpu_util_pct": 0.0,
        "mem_copy_util_pct": 0.0,
        "fb_used_mib": 0.0,
    }
    assert type(t4.values["energy_mj"]) is int
    # The dummy unlabelled DCGM_FI_DEV_MEMORY_TEMP 0 must not land on any GPU.
    assert all("memory_temp_c" not in gpu.values for gpu in gpus.values())
    assert all("remapped_rows_uncorrectable" not in gpu.values for gpu in gpus.values())


def test_dcgm_exporter_datadog_identity_labels(fixtures_dir: Path) -> None:
    gpus = _by_uuid(parse_dcgm_exporter(_read(fixtures_dir, DATADOG)))

    t4 = gpus[T4_470]
    assert t4.identity == {
        "uuid": T4_470,
        "index": 0,
        "name": "Tesla T4",
        "serial": "1565220008176",
        "driver_version": "470.182.03",
        "vbios_version": "90.04.96.00.02",
    }
    # The legacy CLOCK_THROTTLE_REASONS name maps onto the bitmask, as an int.
    assert t4.values == {"power_limit_w": 70.0, "fb_total_mib": 15109.0, "clocks_event_reasons": 1}
    # Only DCP metrics for the A10G: the GPU is known, no canonical value is.
    assert gpus["GPU-abc"].values == {}
    assert gpus["GPU-abc"].identity["name"] == "NVIDIA A10G"


def test_dcgm_scrape_datadog_last_xid_and_ignored(fixtures_dir: Path) -> None:
    scrape = parse_dcgm_scrape(_read(fixtures_dir, DATADOG))

    assert scrape.last_xid == {T4_460: 0}
    assert all("xid" not in str(v) for r in scrape.readings for v in r.values)
    assert {"DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_PSTATE", "DCGM_FI_DEV_COUNT"} <= (
        scrape.ignored_metrics
    )
    assert "DCGM_FI_DEV_GPU_TEMP" not in scrape.ignored_metrics


def test_dcgm_exporter_legacy_two_gpus(fixtures_dir: Path) -> None:
    readings = parse_dcgm_exporter(_read(fixtures_dir, LEGACY_2GPU))

    assert [r.identity for r in readings] == [
        {"uuid": "GPU-2b399198-c670-a848-173b-d3400051a200", "index": 0},
        {"uuid": "GPU-9567a9e7-341e-bb7e-fcf5-788d8caa50f9", "index": 1},
    ]
    assert [r.values["gpu_temp_c"] for r in readings] == [33.0, 34.0]
    assert [r.values["mem_clock_mhz"] for r in readings] == [810.0, 810.0]
    assert readings[0].values == {
        "gpu_temp_c": 33.0,
        "gpu_util_pct": 0.0,
        "mem_copy_util_pct": 0.0,
        "mem_clock_mhz": 810.0,
    }


def test_dcgm_exporter_legacy_energy_in_scientific_notation(fixtures_dir: Path) -> None:
    text = _read(fixtures_dir, LEGACY_README)
    (reading,) = parse_dcgm_exporter(text)

    assert reading.identity == {"uuid": "GPU-8f640a3c-7e9a-608d-02a3-f4372d72b323", "index": 0}
    assert reading.values["energy_mj"] == 7_824_041  # printed as 7.824041e+06
    assert type(reading.values["energy_mj"]) is int
    assert reading.values["power_w"] == pytest.approx(31.737)
    assert reading.values["sm_clock_mhz"] == 135.0
    assert last_xids(text) == {"GPU-8f640a3c-7e9a-608d-02a3-f4372d72b323": 0}


def test_dcgm_exporter_mig_keeps_whole_gpu_values(fixtures_dir: Path) -> None:
    text = _read(fixtures_dir, MIG)
    (reading,) = parse_dcgm_exporter(text)

    # The whole-GPU series give the values; the 1g.5gb instance (id 13) only the MIG identity.
    assert reading.identity == {
        "uuid": A100_MIG,
        "index": 0,
        "mig": {"current": "enabled", "instances": [{"gpu_instance_id": 13, "profile": "1g.5gb"}]},
    }
    assert reading.values == {
        "sm_clock_mhz": 1215.0,
        "mem_clock_mhz": 1215.0,
        "memory_temp_c": 69.0,
        "gpu_temp_c": 61.0,
        "power_w": pytest.approx(409.692),
        "energy_mj": 319159391,
        "pcie_replay_total": 0,
        "fb_used_mib": 4845.0,
    }
    assert last_xids(text) == {A100_MIG: 0}


def test_dcgm_exporter_mig_copies_fill_only_what_whole_gpu_series_lack() -> None:
    mig = 'GPU_I_ID="13",GPU_I_PROFILE="1g.5gb",gpu="0",UUID="GPU-1"'
    text = (
        f"DCGM_FI_DEV_GPU_TEMP{{{mig}}} 99\n"
        f"DCGM_FI_DEV_XID_ERRORS{{{mig}}} 31\n"
        f"DCGM_FI_DEV_POWER_USAGE{{{mig}}} 250\n"
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1"} 40\n'
        'DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-2",GPU_I_ID="1"} 10\n'
        'DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-2",GPU_I_ID="x"} 10\n'
    )
    scrape = parse_dcgm_scrape(text)

    gpus = _by_uuid(scrape.readings)
    # The whole-GPU series wins; the copy gives what no whole-GPU series did.
    assert gpus["GPU-1"].values == {"gpu_temp_c": 40.0, "power_w": 250.0}
    assert scrape.last_xid == {"GPU-1": 31}
    # Framebuffer use under MIG is the instance's own: no whole-GPU value made of it.
    assert gpus["GPU-2"].values == {}
    assert gpus["GPU-2"].identity["mig"] == {
        "current": "enabled",
        "instances": [{"gpu_instance_id": 1}],  # no profile printed, none guessed; "x" is no id
    }


def test_dcgm_exporter_new_unit_suffixed_names() -> None:
    labels = '{gpu="2",UUID="GPU-new",pci_bus_id="00000000:3B:00.0"}'
    text = "\n".join(
        f"{name}{labels} {value}"
        for name, value in [
            ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", "51"),
            ("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", "60"),
            ("DCGM_FI_DEV_BOARD_POWER_WATTS", "250.5"),
            ("DCGM_FI_DEV_ROW_REMAP_FAILED", "1"),
            ("DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", "3"),
            ("DCGM_FI_DEV_PAGE_RETIRED_PENDING", "0"),
            ("DCGM_FI_DEV_PCIE_REPLAY_TOTAL", "12"),
            ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL", "4"),
            ("DCGM_FI_DEV_XID_ERROR", "79"),
            ("DCGM_FI_DEV_GPU_UTIL_RATIO", "0.5"),  # scale differs by DCGM version: unmapped
        ]
    )
    scrape = parse_dcgm_scrape(text)

    (reading,) = scrape.readings
    assert reading.identity == {"uuid": "GPU-new", "index": 2, "pci_bus_id": "0000:3b:00.0"}
    assert reading.values == {
        "gpu_temp_c": 51.0,
        "memory_temp_c": 60.0,
        "power_w": 250.5,
        "remapped_rows_failure": True,
        "remapped_rows_uncorrectable": 3,
        "retired_pages_pending": False,
        "pcie_replay_total": 12,
        "nvlink_crc_flit_errors_total": 4,
    }
    assert scrape.last_xid == {"GPU-new": 79}
    assert "DCGM_FI_DEV_GPU_UTIL_RATIO" in scrape.ignored_metrics


def test_dcgm_exporter_classic_name_wins_over_alias_in_any_order() -> None:
    text = (
        'DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS{UUID="GPU-1",gpu="0"} 300\n'
        'DCGM_FI_DEV_POWER_MGMT_LIMIT{UUID="GPU-1",gpu="0"} 350\n'
        'DCGM_FI_DEV_GPU_TEMP{UUID="GPU-1",gpu="0"} 40\n'
        'DCGM_FI_DEV_GPU_TEMP_CELSIUS{UUID="GPU-1",gpu="0"} 41\n'
    )
    (reading,) = parse_dcgm_exporter(text)

    assert reading.values == {"power_limit_w": 350.0, "gpu_temp_c": 40.0}


def test_dcgm_exporter_counter_type_lines_keep_names() -> None:
    # prometheus_client renames counters ("_total" appended or stripped); both spellings resolve.
    text = (
        "# TYPE DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL counter\n"
        'DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{UUID="GPU-1",gpu="0"} 7\n'
        "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"
        'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{UUID="GPU-1",gpu="0"} 1.5e+12\n'
        "# TYPE dcgm_ecc_dbe_volatile_total counter\n"
        'dcgm_ecc_dbe_volatile_total{uuid="GPU-1",gpu="0"} 2\n'
    )
    (reading,) = parse_dcgm_exporter(text)

    assert reading.values == {
        "nvlink_crc_flit_errors_total": 7,
        "energy_mj": 1_500_000_000_000,
        "ecc_dbe_volatile_total": 2,
    }


def test_dcgm_exporter_maps_every_canonical_dcgm_field() -> None:
    specs = [spec for spec in SAMPLE_FIELDS if spec.dcgm is not None]
    text = "\n".join(f'{spec.dcgm}{{UUID="GPU-1",gpu="0"}} 1' for spec in specs)
    (reading,) = parse_dcgm_exporter(text)

    assert set(reading.values) == {spec.name for spec in specs}
    sample = _as_sample(reading)  # strict types: ints stay ints, flags are bools
    assert sample.pcie_link_gen == 1
    assert sample.remapped_rows_pending is True


def test_dcgm_exporter_nan_is_absent_not_zero() -> None:
    text = 'DCGM_FI_DEV_GPU_TEMP{UUID="GPU-1",gpu="0"} NaN\nDCGM_FI_DEV_FB_USED{UUID="GPU-1"} 5\n'
    (reading,) = parse_dcgm_exporter(text)

    assert reading.values == {"fb_used_mib": 5.0}
    assert "gpu_temp_c" not in reading.values


def test_dcgm_exporter_falls_back_to_host_and_index_without_uuid() -> None:
    text = (
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="a",pci_bus_id="garbage"} 30\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",Hostname="b"} 31\n'
        'DCGM_FI_DEV_POWER_USAGE{gpu="0",Hostname="a"} 100\n'
    )
    readings = parse_dcgm_exporter(text)

    assert [r.identity for r in readings] == [{"index": 0}, {"index": 0}]
    assert [r.values for r in readings] == [
        {"gpu_temp_c": 30.0, "power_w": 100.0},
        {"gpu_temp_c": 31.0},
    ]


def test_dcgm_exporter_empty_scrape_has_no_gpus() -> None:
    assert parse_dcgm_exporter("") == []
    assert parse_dcgm_exporter("# HELP DCGM_FI_DEV_GPU_TEMP x\nDCGM_FI_DEV_GPU_TEMP 1\n") == []


@pytest.mark.parametrize(
    ("text", "line_number"),
    [
        ('DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1"} 40\nnot prometheus at all\n', 2),
        ("name, index, temperature.gpu\nTesla T4, 0, 25\n", 1),
        ('{"gpus": [{"uuid": "GPU-1"}]}', 1),
        ('# HELP x y\n# TYPE DCGM_FI_DEV_GPU_TEMP\nDCGM_FI_DEV_GPU_TEMP{gpu="0"} 1\n', 2),
        ('DCGM_FI_DEV_GPU_TEMP{gpu="0",gpu="1"} 1\n', 1),
    ],
)
def test_dcgm_exporter_rejects_non_prometheus_text(text: str, line_number: int) -> None:
    with pytest.raises(ParseError, match="not Prometheus exposition format") as info:
        parse_dcgm_exporter(text)
    assert info.value.line_number == line_number
    assert str(info.value).startswith(f"line {line_number}: ")


def test_dcgm_exporter_label_with_a_nul_is_sent_cleaned(fixtures_dir: Path, tmp_path: Path) -> None:
    """A real scrape whose modelName label holds a NUL: the GPU is kept, the NUL sent as U+FFFD."""
    text = _read(fixtures_dir, "datadog__dcgm_tests_fixtures_metrics.txt")
    assert 'modelName="Tesla T4"' in text
    scrape = tmp_path / "metrics.prom"
    scrape.write_text(text.replace('modelName="Tesla T4"', 'modelName="Tesla\x00T4"'))
    collection = DcgmExporterCollector(str(scrape)).collect(datetime(2026, 11, 30, tzinfo=UTC))
    assert collection.gpus
    batch = build_batch(NodeInfo(name="node-1"), collection)
    assert "Tesla\ufffdT4" in {gpu.name for gpu in batch.gpus}
    assert "\\u0000" not in batch.model_dump_json()
