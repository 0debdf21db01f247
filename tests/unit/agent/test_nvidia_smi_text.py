"""``nvidia-smi -q`` text parser, against real reports from gpud, thamada/gls, huggingface/m4-logs
and the nvidia_gpu_exporter captures (``../shared``)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fleetwatch.agent.parsers import GpuReading, ParseError
from fleetwatch.agent.parsers.nvidia_smi_text import parse_nvidia_smi_text
from fleetwatch.telemetry import SAMPLE_FIELD_NAMES, GpuIdentity, GpuSample

# Every file in nvidia_smi/text_q and how many "GPU 0000..." blocks it holds.
GPU_COUNTS = {
    "gpud__nvidia-smi-query.535.129.03.out.0.valid.a10.txt": 1,
    "gpud__nvidia-smi-query.535.154.05.out.0.valid.txt": 8,
    "gpud__nvidia-smi-query.535.161.08.out.0.valid.txt": 8,
    "gpud__nvidia-smi-query.535.183.01.out.0.valid.txt": 8,
    "m4-logs__A100-SXM4-80GB_x8_525.60.13_gpu.query.all.txt": 8,
    "thamada-gls__A100-SXM4-80GB_x4_555.42.02.q.txt": 4,
    "thamada-gls__A10_550.90.12.q.txt": 1,
    "thamada-gls__H100-80GB-HBM3_x8_565.57.01.q.txt": 8,
    "thamada-gls__H100-NVL_x2_550.54.14.q.txt": 2,
    "thamada-gls__H200_550.90.12.q.txt": 1,
    "thamada-gls__L4_550.90.07.q.txt": 1,
}
PCI_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
IDLE, SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_POWER_BRAKE = 0x1, 0x4, 0x8, 0x20, 0x80


@pytest.fixture(scope="module")
def smi_dir(fixtures_dir: Path) -> Path:
    return fixtures_dir / "nvidia_smi"


def parse(smi_dir: Path, name: str) -> list[GpuReading]:
    return parse_nvidia_smi_text((smi_dir / "text_q" / name).read_text(encoding="utf-8"))


def column(readings: list[GpuReading], field: str) -> list[object]:
    return [reading.values.get(field) for reading in readings]


def test_the_table_lists_every_text_fixture(smi_dir: Path) -> None:
    assert sorted(p.name for p in (smi_dir / "text_q").glob("*.txt")) == sorted(GPU_COUNTS)


@pytest.mark.parametrize(("name", "count"), sorted(GPU_COUNTS.items()))
def test_every_fixture_parses_into_valid_wire_models(smi_dir: Path, name: str, count: int) -> None:
    readings = parse(smi_dir, name)

    assert len(readings) == count
    assert len({reading.identity["uuid"] for reading in readings}) == count
    for position, reading in enumerate(readings):
        assert UUID_RE.match(reading.identity["uuid"])
        assert PCI_RE.match(reading.identity["pci_bus_id"])
        assert reading.identity["index"] == position
        assert reading.identity["driver_version"] in name
        assert set(reading.values) <= set(SAMPLE_FIELD_NAMES)
        assert {"gpu_temp_c", "power_w", "power_limit_w", "clocks_event_reasons"} <= set(
            reading.values
        )
        GpuIdentity(**reading.identity)
        GpuSample(uuid=reading.identity["uuid"], ts=datetime.now(UTC), **reading.values)


@pytest.mark.parametrize("name", sorted(GPU_COUNTS))
def test_mig_mode_disabled_or_na_records_no_mig(smi_dir: Path, name: str) -> None:
    for reading in parse(smi_dir, name):
        assert "mig" not in reading.identity


def test_mig_mode_enabled_is_recorded(smi_dir: Path) -> None:
    # The A100 report with its MIG Mode lines switched to Enabled: no real text report of a
    # MIG-enabled GPU is at hand; the section layout is the real one.
    text = (smi_dir / "text_q" / "thamada-gls__A100-SXM4-80GB_x4_555.42.02.q.txt").read_text()
    current = "    MIG Mode\n        Current                           : Disabled\n"
    assert text.count(current) == 4
    text = text.replace(current, current.replace("Disabled", "Enabled"), 1)  # GPU 0: MIG on
    readings = parse_nvidia_smi_text(text)
    assert readings[0].identity["mig"] == {
        "current": "enabled",
        "pending": "disabled",
        "instances": [],  # MIG devices are not read from the text report
    }
    assert all("mig" not in r.identity for r in readings[1:])
    GpuIdentity(**readings[0].identity)
    # MIG enabled only at the next reset is recorded too: it says what the GPU is about to be.
    pending = "        Pending                           : Disabled\n"
    later = parse_nvidia_smi_text(text.replace(pending, pending.replace("Disabled", "Enabled")))
    assert [r.identity["mig"]["pending"] for r in later] == ["enabled"] * 4
    assert later[1].identity["mig"]["current"] == "disabled"


def test_h200(smi_dir: Path) -> None:
    (gpu,) = parse(smi_dir, "thamada-gls__H200_550.90.12.q.txt")

    assert gpu.identity == {
        "index": 0,
        "uuid": "GPU-cb3dfa52-e2f3-9ca4-a399-7d16041c3732",
        "serial": "1753724031847",
        "name": "NVIDIA H200",
        "vbios_version": "96.00.A5.00.03",
        "driver_version": "550.90.12",
        "pci_bus_id": "0000:03:00.0",
    }
    # The default table of the same capture prints "28C P0 74W / 700W 1MiB / 143771MiB".
    assert gpu.values == {
        "gpu_temp_c": 28.0,
        "memory_temp_c": 25.0,
        "power_w": 74.58,
        "power_limit_w": 700.0,
        "sm_clock_mhz": 345.0,
        "mem_clock_mhz": 3199.0,
        "gpu_util_pct": 0.0,
        "mem_copy_util_pct": 0.0,
        "fb_used_mib": 1.0,
        "fb_total_mib": 143771.0,
        "pcie_link_gen": 5,
        "pcie_link_width": 16,
        "pcie_replay_total": 0,
        "remapped_rows_correctable": 0,
        "remapped_rows_uncorrectable": 0,
        "remapped_rows_pending": False,
        "remapped_rows_failure": False,
        "clocks_event_reasons": IDLE,
        # SRAM parity + SEC-DED + DRAM, all printed as 0: "no errors", which is not "no data".
        "ecc_sbe_volatile_total": 0,
        "ecc_dbe_volatile_total": 0,
        "ecc_sbe_aggregate_total": 0,
        "ecc_dbe_aggregate_total": 0,
    }
    # Retired pages and fan speed are N/A on an H200: absent, not 0.
    assert "retired_pages_sbe" not in gpu.values
    assert "retired_pages_pending" not in gpu.values
    assert "fan_speed_pct" not in gpu.values


def test_h100_x8_replays_and_recovery_action(smi_dir: Path) -> None:
    readings = parse(smi_dir, "thamada-gls__H100-80GB-HBM3_x8_565.57.01.q.txt")

    assert column(readings, "pcie_replay_total") == [7, 0, 0, 0, 0, 4, 15, 0]
    assert column(readings, "gpu_temp_c") == [30.0, 30.0, 31.0, 29.0, 28.0, 30.0, 29.0, 29.0]
    assert column(readings, "memory_temp_c") == [36.0, 36.0, 38.0, 37.0, 36.0, 38.0, 37.0, 36.0]
    assert set(column(readings, "power_limit_w")) == {700.0}
    assert set(column(readings, "gpu_recovery_action")) == {0}  # "None", new in R565
    assert readings[0].values["power_w"] == 100.89
    assert readings[0].values["fb_total_mib"] == 81559.0


def test_h100_throttled_by_the_power_brake(smi_dir: Path) -> None:
    readings = parse(smi_dir, "gpud__nvidia-smi-query.535.161.08.out.0.valid.txt")

    # "HW Power Brake Slowdown" is indented under "HW Slowdown"; both are Active on every GPU.
    assert set(column(readings, "clocks_event_reasons")) == {HW_SLOWDOWN | HW_POWER_BRAKE}
    assert column(readings, "pcie_replay_total") == [67, 63, 52, 43, 49, 53, 82, 67]
    assert readings[1].identity["pci_bus_id"] == "0000:3b:00.0"  # from "GPU 00000000:3B:00.0"


def test_h100_with_several_clocks_event_reasons(smi_dir: Path) -> None:
    readings = parse(smi_dir, "gpud__nvidia-smi-query.535.183.01.out.0.valid.txt")

    assert column(readings, "clocks_event_reasons") == [
        IDLE,
        IDLE,
        SW_POWER_CAP | HW_POWER_BRAKE | SW_THERMAL,
        IDLE,
        IDLE,
        IDLE,
        IDLE,
        IDLE,
    ]
    assert column(readings, "pcie_replay_total") == [120, 111, 58, 60, 63, 93, 69, 78]


def test_a10_with_uncorrectable_remapped_rows_pending(smi_dir: Path) -> None:
    (gpu,) = parse(smi_dir, "gpud__nvidia-smi-query.535.129.03.out.0.valid.a10.txt")

    assert gpu.values["remapped_rows_uncorrectable"] == 4
    assert gpu.values["remapped_rows_pending"] is True
    assert gpu.values["remapped_rows_failure"] is False
    assert gpu.values["fan_speed_pct"] == 0.0  # printed "0 %": a real 0, kept
    assert "memory_temp_c" not in gpu.values  # N/A on GDDR6


def test_a100_with_correctable_dram_errors_and_a_pending_remap(smi_dir: Path) -> None:
    readings = parse(smi_dir, "thamada-gls__A100-SXM4-80GB_x4_555.42.02.q.txt")

    assert column(readings, "ecc_sbe_volatile_total") == [0, 353, 0, 0]
    assert column(readings, "ecc_sbe_aggregate_total") == [0, 353, 0, 0]
    assert column(readings, "ecc_dbe_aggregate_total") == [0, 0, 0, 0]
    assert column(readings, "remapped_rows_correctable") == [0, 1, 1, 0]
    assert column(readings, "remapped_rows_pending") == [False, True, False, False]


def test_index_is_the_position_not_the_minor_number(smi_dir: Path) -> None:
    readings = parse(smi_dir, "m4-logs__A100-SXM4-80GB_x8_525.60.13_gpu.query.all.txt")

    # Minor numbers here run 2, 3, 0, 1, 6, 7, 4, 5; nvidia-smi and NVML number GPUs by position.
    assert [r.identity["index"] for r in readings] == list(range(8))
    assert readings[0].identity["uuid"] == "GPU-eb0003d2-77b4-70fd-4ab9-3ef1c9853c49"
    gpu = readings[5]
    assert gpu.identity["uuid"] == "GPU-783404ba-3094-6935-3135-d98bb3fa1f9e"
    assert gpu.values["ecc_sbe_aggregate_total"] == 21  # "SRAM Uncorrectable" (pre-R550) layout
    assert gpu.values["ecc_sbe_volatile_total"] == 0
    assert gpu.values["remapped_rows_correctable"] == 1
    assert readings[0].values["power_limit_w"] == 400.0  # "Power Readings/Enforced Power Limit"
    assert readings[0].values["fb_used_mib"] == 22377.0


def test_consumer_gpu_without_ecc_leaves_ecc_and_serial_out(smi_dir: Path) -> None:
    readings = parse(smi_dir, "gpud__nvidia-smi-query.535.154.05.out.0.valid.txt")

    for reading in readings:
        assert "serial" not in reading.identity  # N/A on GeForce
        assert not {name for name in reading.values if name.startswith("ecc_")}
    assert readings[1].values["gpu_util_pct"] == 100.0
    assert readings[1].values["fan_speed_pct"] == 40.0


# The nvidia_gpu_exporter captures hold idle and load `nvidia-smi -q` reports of R590-R610 drivers
# next to `--query-gpu` CSV from the same second, which lets us check the parser against
# nvidia-smi's own numbers, including the clocks-event bitmask it computes.
CAPTURES = {
    "geforce-rtx-2080-super__610.57.04": "610.57.04",
    "geforce-rtx-4080-super__595.71.05": "595.71.05",
    "h100-80gb-hbm3__590.48.01": "590.48.01",
    "h200__590.48.01": "590.48.01",
    "l40s__595.80": "595.80",
}
QUERY_GPU = r"--query-gpu=\S+ --format=csv"


def capture_sections(smi_dir: Path, name: str, arguments: str) -> list[str]:
    """The outputs of `nvidia-smi <arguments>` (a regex), each after its '# $ ...' banner."""
    path = smi_dir / "captures" / f"nvidia_gpu_exporter__linux-x86_64__nvidia-{name}.txt"
    pattern = rf"^# \$ nvidia-smi {arguments}\n#+\n(.*?)(?=^#{{10}}|\Z)"
    return re.findall(pattern, path.read_text(encoding="utf-8"), re.S | re.M)


@pytest.mark.parametrize(("name", "driver"), sorted(CAPTURES.items()))
def test_newest_drivers_agree_with_query_gpu_csv(smi_dir: Path, name: str, driver: str) -> None:
    reports = capture_sections(smi_dir, name, "-q")
    tables = capture_sections(smi_dir, name, QUERY_GPU)
    assert len(reports) == len(tables) == 2  # idle, then load

    for report, table in zip(reports, tables, strict=True):
        (gpu,) = parse_nvidia_smi_text(report)
        header, row = (line.split(", ") for line in table.strip().splitlines()[:2])
        csv = dict(zip(header, row, strict=True))
        assert gpu.identity["driver_version"] == driver  # the deprecation note is dropped
        assert gpu.values["clocks_event_reasons"] == int(csv["clocks_event_reasons.active"], 16)
        assert gpu.values["power_limit_w"] == float(csv["enforced.power.limit [W]"].split()[0])
        assert gpu.values["fb_total_mib"] == float(csv["memory.total [MiB]"].split()[0])
        assert gpu.values["pcie_link_gen"] == int(csv["pcie.link.gen.current"])
        assert gpu.values["gpu_recovery_action"] == 0 and csv["gpu_recovery_action"] == "None"
        assert GpuIdentity(**gpu.identity).pci_bus_id == csv["pci.bus_id"][4:].lower()


def test_r590_prints_average_and_instantaneous_power(smi_dir: Path) -> None:
    idle, load = (
        parse_nvidia_smi_text(text)[0]
        for text in capture_sections(smi_dir, "h100-80gb-hbm3__590.48.01", "-q")
    )

    assert idle.values["power_w"] == 69.85  # "Average Power Draw", not Instantaneous (69.62 W)
    assert load.values["power_w"] == 629.45
    assert load.values["gpu_util_pct"] == 100.0
    assert idle.values["pcie_replay_total"] == 9
    assert (idle.values["clocks_event_reasons"], load.values["clocks_event_reasons"]) == (IDLE, 0)


def test_r610_falls_back_to_instantaneous_power_and_the_ceiling_limit(smi_dir: Path) -> None:
    idle, _ = (
        parse_nvidia_smi_text(text)[0]
        for text in capture_sections(smi_dir, "geforce-rtx-2080-super__610.57.04", "-q")
    )

    assert idle.values["power_w"] == 38.89  # Average Power Draw is N/A on Turing
    assert idle.values["power_limit_w"] == 250.0  # under "GPU Ceiling Power Limit"


OLD_LAYOUT = """
==============NVSMI LOG==============

Driver Version                            : 418.87.01
Attached GPUs                             : 1
GPU 00000000:3B:00.0
    Product Name                          : Tesla V100-SXM2-32GB
    Serial Number                         : [Unknown Error]
    GPU UUID                              : GPU-5e1d2c3b-4a59-6877-8695-a4b3c2d1e0f9
    Clocks Throttle Reasons
        Idle                              : Not Active
        SW Power Cap                      : Active
        HW Slowdown                       : Not Active
            HW Thermal Slowdown           : N/A
    ECC Errors
        Volatile
            Single Bit
                Device Memory             : 2
                Total                     : 2
            Double Bit
                Device Memory             : 1
                Total                     : 1
        Aggregate
            Single Bit
                Total                     : N/A
            Double Bit
                Total                     : 7
    Retired Pages
        Single Bit ECC                    : 1
        Double Bit ECC                    : 0
        Pending                           : Yes
    Temperature
        GPU Current Temp                  : [Not Supported]
"""


def test_old_layout_and_placeholders() -> None:
    (gpu,) = parse_nvidia_smi_text(OLD_LAYOUT)

    assert gpu.identity == {
        "index": 0,
        "uuid": "GPU-5e1d2c3b-4a59-6877-8695-a4b3c2d1e0f9",
        "name": "Tesla V100-SXM2-32GB",
        "driver_version": "418.87.01",
        "pci_bus_id": "0000:3b:00.0",  # the block header, as there is no PCI section
    }
    assert gpu.values == {
        "clocks_event_reasons": SW_POWER_CAP,
        "ecc_sbe_volatile_total": 2,
        "ecc_dbe_volatile_total": 1,
        "ecc_dbe_aggregate_total": 7,
        "retired_pages_sbe": 1,
        "retired_pages_dbe": 0,
        "retired_pages_pending": True,
    }


def test_no_gpus_attached_is_an_empty_list() -> None:
    assert parse_nvidia_smi_text("Driver Version : 550.90.07\nAttached GPUs : 0\n") == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no 'GPU 00000000:3B:00.0' block"),
        ("NVIDIA-SMI has failed because it couldn't communicate with the driver", "no 'GPU"),
        ('<?xml version="1.0" ?>\n<nvidia_smi_log/>', "this is XML; use parse_nvidia_smi_xml"),
    ],
)
def test_text_that_is_not_a_report_raises_parse_error(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=re.escape(message)):
        parse_nvidia_smi_text(text)
