"""``nvidia-smi -q -x`` parser, against real XML from netdata and telegraf (``../shared``).

Also home to the tests of the value rules both nvidia-smi parsers share (``smi_values``).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fleetwatch.agent.collectors.nvidia_smi import NvidiaSmiCollector
from fleetwatch.agent.parsers import GpuReading, ParseError
from fleetwatch.agent.parsers.nvidia_smi_xml import parse_nvidia_smi_xml
from fleetwatch.agent.parsers.smi_values import clean, clocks_event_bitmask, convert
from fleetwatch.telemetry import SAMPLE_FIELD_NAMES, GpuIdentity, GpuSample

# Every file in nvidia_smi/xml and how many <gpu> elements it holds. telegraf__a100-sxm4-v12 says
# <attached_gpus>4</attached_gpus> but its contributor kept one <gpu>: we count what is printed.
GPU_COUNTS = {
    "netdata__a100-sxm4-mig.xml": 1,
    "netdata__rtx-3060.xml": 1,
    "netdata__rtx-4090-driver-535.xml": 1,
    "netdata__tesla-p100.xml": 1,
    "telegraf__a100-sxm4-v12.xml": 1,
    "telegraf__a10g.xml": 1,
    "telegraf__gtx-1660-ti.xml": 1,
    "telegraf__quadro-p2000-v12.xml": 1,
    "telegraf__rtx-3060-v12.xml": 1,
    "telegraf__rtx-3080-v13.xml": 1,
    "telegraf__rtx-3090-v12.xml": 1,
    "telegraf__rtx-4000-sff-ada-v13.xml": 1,
    "telegraf__tesla-t4.xml": 1,
}
PCI_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@pytest.fixture(scope="module")
def xml_dir(fixtures_dir: Path) -> Path:
    return fixtures_dir / "nvidia_smi" / "xml"


def parse(xml_dir: Path, name: str) -> list[GpuReading]:
    return parse_nvidia_smi_xml((xml_dir / name).read_text(encoding="utf-8"))


def test_the_table_lists_every_xml_fixture(xml_dir: Path) -> None:
    assert sorted(p.name for p in xml_dir.glob("*.xml")) == sorted(GPU_COUNTS)


@pytest.mark.parametrize(("name", "count"), sorted(GPU_COUNTS.items()))
def test_every_fixture_parses_into_valid_wire_models(xml_dir: Path, name: str, count: int) -> None:
    readings = parse(xml_dir, name)

    assert len(readings) == count
    for position, reading in enumerate(readings):
        assert UUID_RE.match(reading.identity["uuid"])
        assert PCI_RE.match(reading.identity["pci_bus_id"])
        assert reading.identity["index"] == position
        assert reading.identity["driver_version"]
        assert set(reading.values) <= set(SAMPLE_FIELD_NAMES)
        assert {"gpu_temp_c", "power_w", "fb_total_mib", "pcie_replay_total"} <= set(reading.values)
        # The wire models are strict: this checks every type, unit range and identity key.
        GpuIdentity(**reading.identity)
        GpuSample(uuid=reading.identity["uuid"], ts=datetime.now(UTC), **reading.values)


def test_a100_with_mig_reports_the_parent_gpu_and_leaves_na_fields_out(xml_dir: Path) -> None:
    (gpu,) = parse(xml_dir, "netdata__a100-sxm4-mig.xml")  # two <mig_device>s, one reading

    assert gpu.identity == {
        "index": 0,
        "uuid": "GPU-27b94a00-ed54-5c24-b1fd-1054085de32a",
        "serial": "1324321002473",
        "name": "NVIDIA A100-SXM4-40GB",
        "vbios_version": "92.00.45.00.03",
        "driver_version": "510.47.03",
        "pci_bus_id": "0000:00:04.0",
        "mig": {
            "current": "enabled",
            "pending": "enabled",
            "instances": [
                {"gpu_instance_id": 1, "compute_instance_id": 0, "index": 0},
                {"gpu_instance_id": 2, "compute_instance_id": 0, "index": 1},
            ],
        },
    }
    assert gpu.values == {
        "gpu_temp_c": 36.0,
        "memory_temp_c": 44.0,
        "power_w": 66.92,
        "power_limit_w": 400.0,
        "sm_clock_mhz": 1410.0,
        "mem_clock_mhz": 1215.0,
        "fb_used_mib": 38.0,  # the whole GPU's, not a MIG instance's 19 MiB
        "fb_total_mib": 40960.0,
        "pcie_link_gen": 4,
        "pcie_link_width": 16,
        "pcie_replay_total": 0,
        "clocks_event_reasons": 0,
        "ecc_sbe_aggregate_total": 0,
        "ecc_dbe_aggregate_total": 0,
    }
    # N/A under MIG: utilisation, volatile ECC, remapped rows, retired pages; N/A fan on SXM.
    for absent in (
        "gpu_util_pct",
        "mem_copy_util_pct",
        "ecc_sbe_volatile_total",
        "ecc_dbe_volatile_total",
        "remapped_rows_pending",
        "retired_pages_sbe",
        "fan_speed_pct",
    ):
        assert absent not in gpu.values


def test_a100_v12_with_four_mig_devices_records_them_and_keeps_whole_gpu_values(
    xml_dir: Path,
) -> None:
    (gpu,) = parse(xml_dir, "telegraf__a100-sxm4-v12.xml")

    # Hand-read: <mig_device> index 0-3 in GPU instances 3-6, compute instance 0 each; no
    # profile or MIG UUID in the XML, so none is recorded.
    assert gpu.identity["mig"] == {
        "current": "enabled",
        "pending": "enabled",
        "instances": [
            {"gpu_instance_id": gi, "compute_instance_id": 0, "index": gi - 3}
            for gi in (3, 4, 5, 6)
        ],
    }
    GpuIdentity(**gpu.identity)
    # The GPU's own memory use (50 MiB), not the devices' 4 x 12 MiB.
    assert gpu.values["fb_used_mib"] == 50.0 and gpu.values["fb_total_mib"] == 81920.0
    # N/A under MIG: absent, never 0.
    for absent in (
        "gpu_util_pct",
        "mem_copy_util_pct",
        "retired_pages_sbe",
        "remapped_rows_pending",
    ):
        assert absent not in gpu.values


@pytest.mark.parametrize(
    "name", sorted(set(GPU_COUNTS) - {"netdata__a100-sxm4-mig.xml", "telegraf__a100-sxm4-v12.xml"})
)
def test_gpus_without_mig_carry_no_mig_identity(xml_dir: Path, name: str) -> None:
    # MIG mode Disabled or N/A (a GPU without MIG): nothing to record.
    for reading in parse(xml_dir, name):
        assert "mig" not in reading.identity


def test_a100_v12_reads_gpu_power_readings_and_indexes_by_position(xml_dir: Path) -> None:
    (gpu,) = parse(xml_dir, "telegraf__a100-sxm4-v12.xml")

    assert gpu.identity["index"] == 0  # <minor_number> is 1: the device node, not the NVML index
    assert gpu.values["power_w"] == 67.03  # <gpu_power_readings><power_draw>
    assert gpu.values["power_limit_w"] == 500.0  # <current_power_limit>, the enforced one
    assert gpu.values["memory_temp_c"] == 44.0
    assert gpu.values["mem_clock_mhz"] == 1593.0
    assert [gpu.values[f"ecc_{k}_total"] for k in ("sbe_volatile", "dbe_volatile")] == [0, 0]
    assert "remapped_rows_correctable" not in gpu.values  # <remapped_rows>N/A</remapped_rows>


def test_p100_uses_the_printed_single_and_double_bit_totals(xml_dir: Path) -> None:
    (gpu,) = parse(xml_dir, "netdata__tesla-p100.xml")

    assert gpu.values["ecc_sbe_aggregate_total"] == 3  # single_bit/total (all device_memory)
    assert gpu.values["ecc_dbe_aggregate_total"] == 0
    assert gpu.values["ecc_sbe_volatile_total"] == 0
    assert gpu.values["retired_pages_sbe"] == 0
    assert gpu.values["retired_pages_dbe"] == 0
    assert gpu.values["retired_pages_pending"] is False
    assert gpu.values["power_limit_w"] == 250.0
    assert gpu.values["clocks_event_reasons"] == 0x1  # clocks_throttle_reason_gpu_idle Active


def test_v13_prefers_average_power_and_reads_the_recovery_action(xml_dir: Path) -> None:
    (gpu,) = parse(xml_dir, "telegraf__rtx-3080-v13.xml")

    assert gpu.identity["driver_version"] == "595.58.03"
    assert "serial" not in gpu.identity  # printed as REDACTED
    assert gpu.values["power_w"] == 139.62  # average_power_draw, not instant (142.33 W)
    assert gpu.values["power_limit_w"] == 320.0
    assert gpu.values["gpu_util_pct"] == 65.0
    assert gpu.values["mem_copy_util_pct"] == 9.0
    assert gpu.values["fb_used_mib"] == 9184.0
    assert gpu.values["gpu_recovery_action"] == 0  # "None"
    assert gpu.values["clocks_event_reasons"] == 0


def test_remapped_rows_as_a_structure(xml_dir: Path) -> None:
    (gpu,) = parse(xml_dir, "telegraf__rtx-4000-sff-ada-v13.xml")

    assert gpu.values["remapped_rows_correctable"] == 0
    assert gpu.values["remapped_rows_uncorrectable"] == 0
    assert gpu.values["remapped_rows_pending"] is False
    assert gpu.values["remapped_rows_failure"] is False
    assert gpu.values["fan_speed_pct"] == 30.0
    assert gpu.values["clocks_event_reasons"] == 0x1  # <clocks_event_reasons>, R535+ name
    assert "ecc_sbe_volatile_total" not in gpu.values  # ECC disabled: every count N/A


def test_na_power_limits_and_serial_are_absent_not_zero(xml_dir: Path) -> None:
    (gpu,) = parse(xml_dir, "netdata__rtx-3060.xml")

    assert gpu.values["power_w"] == 8.7
    assert "power_limit_w" not in gpu.values
    assert "serial" not in gpu.identity
    assert "memory_temp_c" not in gpu.values


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("<nvidia_smi_log>\n  <gpu>\n</nvidia_smi_log>\n", 3),  # mismatched tag
        ("", 1),
        ("GPU 00000000:3B:00.0\n    Product Name : NVIDIA H100\n", 1),  # -q text, not XML
    ],
)
def test_malformed_xml_raises_parse_error_with_the_line(text: str, line: int) -> None:
    with pytest.raises(ParseError, match=f"line {line}: not valid XML") as caught:
        parse_nvidia_smi_xml(text)
    assert caught.value.line_number == line


def test_xml_that_is_not_nvidia_smi_raises_parse_error() -> None:
    with pytest.raises(ParseError, match=r"root is <html>, not <nvidia_smi_log>"):
        parse_nvidia_smi_xml("<html><body/></html>")


SYNTHETIC = """<?xml version="1.0" ?>
<nvidia_smi_log><driver_version>999.1</driver_version>
<gpu id="0000:3B:00.0"><uuid>GPU-5e1d2c3b-4a59-6877-8695-a4b3c2d1e0f9</uuid>
<gpu_recovery_action>Drain and Reset</gpu_recovery_action>
<fan_speed>[Unknown Error]</fan_speed>
<clocks_event_reasons>
  <clocks_event_reason_sw_power_cap>Active</clocks_event_reason_sw_power_cap>
  <clocks_event_reason_hw_slowdown>Active</clocks_event_reason_hw_slowdown>
  <clocks_event_reason_future_reason>Active</clocks_event_reason_future_reason>
</clocks_event_reasons>
<ecc_errors><volatile>
  <sram_correctable>2</sram_correctable><dram_correctable>5</dram_correctable>
  <sram_uncorrectable_parity>1</sram_uncorrectable_parity>
  <sram_uncorrectable_secded>N/A</sram_uncorrectable_secded>
  <dram_uncorrectable>3</dram_uncorrectable>
</volatile></ecc_errors>
<remapped_rows><remapped_row_pending>Yes</remapped_row_pending></remapped_rows>
</gpu></nvidia_smi_log>
"""


def test_synthetic_edge_cases() -> None:
    (gpu,) = parse_nvidia_smi_xml(SYNTHETIC)

    assert gpu.identity == {
        "index": 0,
        "uuid": "GPU-5e1d2c3b-4a59-6877-8695-a4b3c2d1e0f9",
        "driver_version": "999.1",
        "pci_bus_id": "0000:3b:00.0",  # from <gpu id=...> when <pci> is missing
    }
    assert gpu.values == {
        "gpu_recovery_action": 4,
        "clocks_event_reasons": 0x4 | 0x8,  # an unknown reason is ignored
        "ecc_sbe_volatile_total": 7,  # SRAM + DRAM correctable
        "ecc_dbe_volatile_total": 4,  # parity (SEC-DED N/A left out) + DRAM
        "remapped_rows_pending": True,
    }


# --- the value rules shared with the text parser (smi_values) ---


@pytest.mark.parametrize(
    "raw", ["N/A", "[N/A]", "[Not Supported]", "Not Supported", "[Unknown Error]", "", "  ", None]
)
def test_placeholders_are_absent(raw: str | None) -> None:
    assert clean(raw) is None
    assert convert("gpu_temp_c", raw) is None
    assert convert("ecc_dbe_volatile_total", raw) is None
    assert convert("remapped_rows_pending", raw) is None


@pytest.mark.parametrize(
    ("field", "raw", "value"),
    [
        ("gpu_temp_c", "45 C", 45.0),
        ("power_w", "312.50 W", 312.5),
        ("power_w", "1500 mW", 1.5),
        ("sm_clock_mhz", "1410 MHz", 1410.0),
        ("fb_total_mib", "81559 MiB", 81559.0),
        ("fb_total_mib", "80 GiB", 81920.0),
        ("gpu_util_pct", "30 %", 30.0),
        ("pcie_link_width", "16x", 16),
        ("pcie_link_gen", "4", 4),
        ("pcie_replay_total", "120", 120),
        ("remapped_rows_failure", "No", False),
        ("gpu_recovery_action", "None", 0),
        ("gpu_recovery_action", "GPU Reset", 1),
        ("gpu_recovery_action", "Node Reboot", 2),
        ("gpu_recovery_action", "Drain P2P", 3),
        ("gpu_recovery_action", "Some New Action", None),
        ("gpu_temp_c", "45 F", None),  # a unit we cannot convert is absent, not wrong
        ("pcie_replay_total", "-1", None),
        ("power_w", "Requested functionality has been deprecated", None),
    ],
)
def test_values_convert_to_canonical_units(field: str, raw: str, value: object) -> None:
    assert convert(field, raw) == value
    assert type(convert(field, raw)) is type(value)


def test_clocks_event_bitmask_needs_at_least_one_readable_flag() -> None:
    assert clocks_event_bitmask([]) is None
    assert clocks_event_bitmask([("gpu_idle", "N/A")]) is None
    assert clocks_event_bitmask([("gpu_idle", "Not Active")]) == 0
    assert clocks_event_bitmask([("hw_thermal_slowdown", "Active"), ("sync_boost", "Active")]) == (
        0x40 | 0x10
    )


def test_the_collector_sends_the_mig_layout_with_the_gpu(xml_dir: Path) -> None:
    collector = NvidiaSmiCollector(str(xml_dir / "telegraf__a100-sxm4-v12.xml"))
    collection = collector.collect(datetime(2026, 11, 30, 5, 0, tzinfo=UTC))

    (gpu,) = collection.gpus
    assert gpu.mig is not None
    assert (gpu.mig.current, gpu.mig.pending) == ("enabled", "enabled")
    assert [(i.gpu_instance_id, i.compute_instance_id, i.index) for i in gpu.mig.instances] == [
        (3, 0, 0),
        (4, 0, 1),
        (5, 0, 2),
        (6, 0, 3),
    ]
    (sample,) = collection.samples
    assert sample.gpu_temp_c is not None and sample.gpu_util_pct is None
