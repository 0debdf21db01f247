"""dcgm-exporter scrapes of MIG-enabled GPUs (issue 13): real captures in
``tests/fixtures/mig_captures`` (Run:ai's A100 samples, see PROVENANCE.md) and NVIDIA's docs
capture in ``../shared``.

Expected values were read by hand from the files; :func:`_copies` is a second, independent reading
(a regular expression over the lines, not the Prometheus parser) that every choice among copies
is checked against.
"""

from __future__ import annotations

import gzip
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fleetwatch.agent.collectors.dcgm_exporter import DcgmExporterCollector
from fleetwatch.agent.loop import build_batch, encode
from fleetwatch.agent.parsers import GpuReading
from fleetwatch.agent.parsers.dcgm_exporter import parse_dcgm_scrape
from fleetwatch.telemetry import Batch, GpuIdentity, GpuSample, NodeInfo

CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "mig_captures"
A100 = "GPU-7099682b-a20d-2bcc-74ab-b9060454d81e"
A100_4 = "GPU-473571f2-fb37-ef7e-50fe-9885b74a23cd"
THREE = "runai__A100-SXM4-40GB_MIG_2x1g.5gb+2g.10gb_active.txt"
FOUR = "runai__A100-SXM4-40GB_MIG_3x1g.5gb+2g.10gb_4-active.txt"
ONE_ACTIVE = "runai__A100-SXM4-40GB_MIG_1g.5gb_active.txt"
ONE_IDLE = "runai__A100-SXM4-40GB_MIG_1g.5gb_idle-allocated.txt"
NO_INSTANCES = "runai__A100-SXM4-40GB_MIG_enabled_no-instances.txt"
MIG_OFF = "runai__A100-SXM4-40GB_MIG_disabled_2-scrapes.txt"
# What no MIG capture may carry as a whole-GPU value: each instance's own use.
PER_INSTANCE = ("fb_used_mib", "fb_total_mib", "gpu_util_pct", "mem_copy_util_pct")


def _scrapes(name: str) -> list[str]:
    """The scrapes in a capture: the first line is its title, and a line of dashes separates
    two scrapes (the files are notes, not one exposition)."""
    body = (CAPTURES / name).read_text().split("\n", 1)[1]
    return [part for part in re.split(r"\n-{20,}\n", body) if part.strip()]


_LINE = re.compile(r"^(DCGM_FI_\w+)\{([^}]*)\} (\S+)$", re.M)


def _copies(text: str, metric: str) -> dict[int | None, float]:
    """GPU instance id (None: a whole-GPU series) -> value of ``metric``, read independently."""
    out: dict[int | None, float] = {}
    for name, labels, value in _LINE.findall(text):
        if name == metric:
            gi = re.search(r'GPU_I_ID="(\d+)"', labels)
            out[int(gi[1]) if gi else None] = float(value)
    return out


def _only(text: str) -> GpuReading:
    (reading,) = parse_dcgm_scrape(text).readings
    return reading


@pytest.mark.parametrize(
    ("name", "uuid", "instances", "expected"),
    [
        (
            THREE,
            A100,
            [(5, "2g.10gb"), (7, "1g.5gb"), (9, "1g.5gb")],
            {"gpu_temp_c": 37.0, "memory_temp_c": 39.0, "power_w": 116.163,
             "energy_mj": 57585599, "sm_clock_mhz": 1410.0, "mem_clock_mhz": 1215.0,
             "pcie_replay_total": 0},
        ),
        (
            FOUR,
            A100_4,
            [(5, "2g.10gb"), (7, "1g.5gb"), (8, "1g.5gb"), (9, "1g.5gb")],
            {"gpu_temp_c": 35.0, "memory_temp_c": 36.0, "power_w": 112.252,
             "energy_mj": 6890956, "sm_clock_mhz": 1410.0, "mem_clock_mhz": 1215.0,
             "pcie_replay_total": 0},
        ),
        (
            ONE_ACTIVE,
            A100,
            [(9, "1g.5gb")],
            {"gpu_temp_c": 37.0, "memory_temp_c": 39.0, "power_w": 115.294,
             "energy_mj": 27151028, "sm_clock_mhz": 1410.0, "mem_clock_mhz": 1215.0,
             "pcie_replay_total": 0},
        ),
        (
            ONE_IDLE,
            A100,
            [(8, "1g.5gb")],
            {"gpu_temp_c": 32.0, "memory_temp_c": 30.0, "power_w": 75.69,
             "energy_mj": 4617218, "sm_clock_mhz": 1410.0, "mem_clock_mhz": 1215.0,
             "pcie_replay_total": 0},
        ),
    ],
)  # fmt: skip
def test_a_mig_gpu_gets_its_whole_gpu_readings_once_and_its_instances(
    name: str, uuid: str, instances: list[tuple[int, str]], expected: dict[str, object]
) -> None:
    (text,) = _scrapes(name)
    scrape = parse_dcgm_scrape(text)

    (reading,) = scrape.readings  # one GPU, however many instances repeat its series
    assert reading.identity["uuid"] == uuid
    assert reading.identity["name"] == "NVIDIA A100-SXM4-40GB"
    assert reading.identity["driver_version"] == "520.56.06"
    assert reading.identity["mig"] == {
        "current": "enabled",
        "instances": [{"gpu_instance_id": gi, "profile": p} for gi, p in instances],
    }
    assert reading.values == pytest.approx(expected)
    assert not set(PER_INSTANCE) & set(reading.values)
    assert scrape.last_xid == {uuid: 0}
    # Valid on the wire, identity and sample alike.
    GpuIdentity(**reading.identity)
    GpuSample(uuid=uuid, ts=datetime(2026, 1, 1, tzinfo=UTC), **reading.values)


@pytest.mark.parametrize("name", [THREE, FOUR, ONE_ACTIVE, ONE_IDLE])
def test_each_choice_among_copies_matches_an_independent_reading(name: str) -> None:
    (text,) = _scrapes(name)
    values = _only(text).values
    for metric, field, rule in (
        ("DCGM_FI_DEV_GPU_TEMP", "gpu_temp_c", "lowest instance"),
        ("DCGM_FI_DEV_POWER_USAGE", "power_w", "lowest instance"),
        ("DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz", "lowest instance"),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "energy_mj", "highest"),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "pcie_replay_total", "highest"),
    ):
        copies = _copies(text, metric)
        assert None not in copies  # these exporters print no whole-GPU series under MIG
        lowest = min(gi for gi in copies if gi is not None)
        want = copies[lowest] if rule == "lowest instance" else max(copies.values())
        assert values[field] == pytest.approx(want), (metric, copies)


def test_copies_of_a_whole_gpu_reading_can_differ_and_one_is_taken() -> None:
    # The board power, read for each instance at another instant: 5.8 W apart in one scrape.
    (text,) = _scrapes(FOUR)
    copies = _copies(text, "DCGM_FI_DEV_POWER_USAGE")
    assert copies == {5: 112.252, 7: 112.252, 8: 106.463, 9: 106.463}
    assert _only(text).values["power_w"] == 112.252  # GPU instance 5's, the lowest id


def test_the_same_gpu_with_mig_off_reports_more_and_no_mig_identity() -> None:
    first, second = _scrapes(MIG_OFF)
    readings = [_only(first), _only(second)]
    for reading in readings:
        assert reading.identity["uuid"] == A100
        assert "mig" not in reading.identity
    assert readings[0].values == readings[1].values
    off = readings[0].values
    # Without MIG the exporter also prints utilisation, framebuffer use and remapped rows.
    assert off["gpu_util_pct"] == 0.0 and off["fb_used_mib"] == 0.0
    assert off["remapped_rows_uncorrectable"] == 0 and off["remapped_rows_failure"] is False
    (three,) = _scrapes(THREE)
    with_mig = _only(three).values
    assert set(with_mig) < set(off)  # every field read under MIG is one read without it
    assert set(off) - set(with_mig) == {
        "gpu_util_pct",
        "mem_copy_util_pct",
        "fb_used_mib",
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
        "remapped_rows_failure",
    }


def test_mig_enabled_without_instances_gives_the_same_fields_and_no_identity() -> None:
    # No GPU instance, so no label says MIG is on: no MIG identity. The exporter prints the
    # series it prints for any MIG-enabled GPU (no utilisation, memory use or remapped rows).
    (text,) = _scrapes(NO_INSTANCES)
    reading = _only(text)
    assert "mig" not in reading.identity
    assert reading.values == pytest.approx(
        {"gpu_temp_c": 32.0, "memory_temp_c": 30.0, "power_w": 75.96, "energy_mj": 8981778,
         "sm_clock_mhz": 1410.0, "mem_clock_mhz": 1215.0, "pcie_replay_total": 0}
    )  # fmt: skip


def test_the_collector_sends_a_mig_gpu_as_a_valid_batch(tmp_path: Path) -> None:
    (text,) = _scrapes(FOUR)
    source = tmp_path / "metrics.prom"
    source.write_text(text)
    collector = DcgmExporterCollector(str(source))
    try:
        collection = collector.collect(datetime(2026, 11, 30, 5, 0, tzinfo=UTC))
    finally:
        collector.close()

    (gpu,) = collection.gpus
    assert gpu.mig is not None and gpu.mig.current == "enabled"
    assert [(i.gpu_instance_id, i.profile) for i in gpu.mig.instances] == [
        (5, "2g.10gb"), (7, "1g.5gb"), (8, "1g.5gb"), (9, "1g.5gb")
    ]  # fmt: skip
    (sample,) = collection.samples
    assert sample.gpu_temp_c == 35.0 and sample.fb_used_mib is None
    batch = build_batch(NodeInfo(name="node-m"), collection)
    assert Batch.model_validate_json(gzip.decompress(encode(batch))) == batch
