"""A MIG-enabled GPU is judged exactly as a GPU without MIG with the same whole-GPU readings
(issue 13). What MIG hides (utilisation, remapped rows, on some drivers volatile ECC) is absent
from its samples, and an absent field is no evidence either way: no verdict, never a fault.

The twins come from the agent's own readers: the *fake* NVML node ``h100_mig.json`` (GPU 0 with
MIG, GPU 1 without, the same readings; no MIG hardware here) and the real A100 MIG capture of
telegraf's nvidia-smi XML in ``../shared``.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fleetwatch.agent.collectors.nvml import NvmlCollector
from fleetwatch.agent.nvml import Nvml
from fleetwatch.agent.parsers.nvidia_smi_xml import parse_nvidia_smi_xml
from fleetwatch.rules.health import BootSample, HealthVerdict, judge_health
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.telemetry import GpuSample
from fleetwatch.testing import FakePynvml

NVML_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvml"
START = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
T = HealthThresholds()
MIG_GPU = "GPU-b4895dbf-9350-2524-a89b-98161ddd9fe4"
PLAIN = "GPU-4f3a1c00-7c2d-4b3a-9f8e-1d2c3b4a5e61"


def _same_but_gpu(verdicts: list[HealthVerdict]) -> list[HealthVerdict]:
    return sorted((replace(v, gpu="") for v in verdicts), key=lambda v: v.rule)


def _series_from_fake(fake: FakePynvml, ticks: int) -> dict[str, list[BootSample]]:
    """Every GPU's samples over ``ticks`` collections 10 s apart; ``fake`` may change between."""
    collector = NvmlCollector(Nvml(fake))
    out: dict[str, list[BootSample]] = {}
    try:
        for t in range(ticks):
            for sample in collector.collect(START + timedelta(seconds=10 * t)).samples:
                out.setdefault(sample.uuid, []).append(BootSample("boot-1", sample))
            for index in (0, 1):  # the same corrected-ECC burst on both GPUs, 30 a tick
                fake.advance(index, "ecc_errors.volatile.corrected", 30)
    finally:
        collector.close()
    return out


@pytest.mark.parametrize(
    ("faults", "expected"),
    [
        ({"ecc_errors.volatile.uncorrected": 2}, {"ecc_dbe_volatile", "ecc_sbe_rate"}),
        ({"temperature_c": 87, "clocks_event_reasons": 0x40},
         {"temperature_margin", "persistent_throttle", "ecc_sbe_rate"}),
        ({"field_values.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION": 1},
         {"gpu_recovery_action", "ecc_sbe_rate"}),
        ({}, {"ecc_sbe_rate"}),
    ],
)  # fmt: skip
def test_a_mig_gpu_and_its_twin_without_mig_get_the_same_verdicts(
    faults: dict[str, Any], expected: set[str]
) -> None:
    fake = FakePynvml.from_json(NVML_FIXTURES / "h100_mig.json")
    for path, value in faults.items():
        for index in (0, 1):
            fake.set_value(index, path, value)
    series = _series_from_fake(fake, ticks=12)
    now = series[MIG_GPU][-1].sample.ts

    mig = judge_health(series[MIG_GPU], thresholds=T, now=now, gpu_name="NVIDIA H100 80GB HBM3")
    plain = judge_health(series[PLAIN], thresholds=T, now=now, gpu_name="NVIDIA H100 80GB HBM3")

    assert {v.rule for v in mig} == expected
    assert _same_but_gpu(mig) == _same_but_gpu(plain)
    # The MIG GPU's samples really lacked what MIG hides; its twin's had them.
    assert series[MIG_GPU][-1].sample.remapped_rows_pending is None
    assert series[PLAIN][-1].sample.remapped_rows_pending is False


def test_remapped_rows_hidden_by_mig_are_no_evidence(shared_dir: Path) -> None:
    xml = shared_dir / "fixtures/nvidia_smi/xml/telegraf__a100-sxm4-v12.xml"
    (reading,) = parse_nvidia_smi_xml(xml.read_text())
    assert "mig" in reading.identity and "remapped_rows_pending" not in reading.values

    def series(**extra: Any) -> list[BootSample]:
        return [
            BootSample(
                "b1",
                GpuSample(
                    uuid=reading.identity["uuid"],
                    ts=START + timedelta(seconds=10 * t),
                    **(reading.values | extra),
                ),
            )
            for t in range(6)
        ]

    now = START + timedelta(seconds=50)
    name = reading.identity["name"]
    as_read = judge_health(series(), thresholds=T, now=now, gpu_name=name)
    # A twin without MIG whose row remapper reports nothing wrong: the same (empty) judgement.
    healthy_twin = series(
        remapped_rows_correctable=0,
        remapped_rows_uncorrectable=0,
        remapped_rows_pending=False,
        remapped_rows_failure=False,
    )
    assert as_read == judge_health(healthy_twin, thresholds=T, now=now, gpu_name=name) == []
    # Uncorrectable ECC on the MIG GPU is judged as on any GPU (R535 reads volatile ECC under MIG).
    faulty = judge_health(series(ecc_dbe_volatile_total=1), thresholds=T, now=now, gpu_name=name)
    assert [v.rule for v in faulty] == ["ecc_dbe_volatile"]
