"""judge_health state and rate rules on constructed sample series, and on a real nvidia-smi file."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fleetwatch.agent.parsers.nvidia_smi_text import parse_nvidia_smi_text
from fleetwatch.rules.health import BootSample, HealthVerdict, judge_health
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.telemetry import GpuSample

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
UUID = "GPU-5e1d2c3b-4a59-6877-8695-a4b3c2d1e0f9"
T = HealthThresholds()


def s(seconds_ago: float, boot: str | None = "b1", /, **values: Any) -> BootSample:
    return BootSample(boot, GpuSample(uuid=UUID, ts=NOW - timedelta(seconds=seconds_ago), **values))


def judge(samples: list[BootSample], **kwargs: Any) -> list[HealthVerdict]:
    kwargs.setdefault("thresholds", T)
    return judge_health(samples, now=NOW, **kwargs)


def rules(samples: list[BootSample], **kwargs: Any) -> set[str]:
    return {v.rule for v in judge(samples, **kwargs)}


def one(samples: list[BootSample], rule: str, **kwargs: Any) -> HealthVerdict:
    found = [v for v in judge(samples, **kwargs) if v.rule == rule]
    assert len(found) == 1, found
    return found[0]


# --- state rules ---------------------------------------------------------------------------------


def test_dbe_volatile_fires_above_zero_with_evidence() -> None:
    assert "ecc_dbe_volatile" not in rules([s(0, ecc_dbe_volatile_total=0)])
    v = one([s(5, ecc_dbe_volatile_total=2)], "ecc_dbe_volatile")
    assert (v.action, v.severity, v.counts_against_gpu) == ("reset_gpu", "critical", True)
    assert v.evidence["ecc_dbe_volatile_total"] == 2
    assert v.evidence["threshold"] == 0 and v.evidence["boot_id"] == "b1"
    assert v.last_seen == NOW - timedelta(seconds=5)
    assert "DCGM" in v.source


def test_dbe_clears_after_reset_to_zero_or_new_boot() -> None:
    assert "ecc_dbe_volatile" not in rules(
        [s(20, ecc_dbe_volatile_total=2), s(10, ecc_dbe_volatile_total=0)]
    )
    # New boot reported, but without the DBE field yet: the reboot itself is the reset.
    assert "ecc_dbe_volatile" not in rules(
        [s(20, ecc_dbe_volatile_total=2), s(10, "b2", gpu_temp_c=40.0)]
    )
    # Errors again after the reboot fire again.
    assert "ecc_dbe_volatile" in rules(
        [s(20, ecc_dbe_volatile_total=2), s(10, "b2", ecc_dbe_volatile_total=1)]
    )


def test_absent_field_neither_fires_nor_clears() -> None:
    assert judge([s(0, gpu_temp_c=40.0)]) == []
    # A later sample on the same boot without the field does not clear the older reading.
    got = rules(
        [s(20, ecc_dbe_volatile_total=3, remapped_rows_pending=True), s(10, gpu_temp_c=40.0)]
    )
    assert {"ecc_dbe_volatile", "row_remap_pending"} <= got


def test_row_remap_failure_drains_and_survives_reboot() -> None:
    v = one([s(0, remapped_rows_failure=True)], "row_remap_failure")
    assert (v.action, v.severity) == ("drain_inspect", "critical")
    assert "row_remap_failure" in rules(
        [s(20, remapped_rows_failure=True), s(10, "b2", gpu_temp_c=1.0)]
    )
    assert "row_remap_failure" not in rules(
        [s(20, remapped_rows_failure=True), s(10, remapped_rows_failure=False)]
    )


@pytest.mark.parametrize("flag", ["remapped_rows_pending", "retired_pages_pending"])
def test_pending_flags_need_reset_and_clear(flag: str) -> None:
    rule = "row_remap_pending" if flag == "remapped_rows_pending" else "retired_pages_pending"
    v = one([s(0, **{flag: True})], rule)
    assert v.action == "reset_gpu"
    assert rule not in rules([s(10, **{flag: True}), s(0, **{flag: False})])
    assert rule not in rules([s(10, **{flag: True}), s(0, "b2", gpu_temp_c=40.0)])
    assert rule not in rules([s(0, **{flag: False})])


def test_uncorrectable_remapped_rows_at_limit() -> None:
    assert "remapped_rows_uncorrectable" not in rules([s(0, remapped_rows_uncorrectable=511)])
    v = one([s(0, remapped_rows_uncorrectable=512)], "remapped_rows_uncorrectable")
    assert (v.action, v.severity, v.evidence["threshold"]) == ("drain_inspect", "warning", 512)


def test_retired_pages_total_at_63() -> None:
    assert "retired_pages_total" not in rules([s(0, retired_pages_sbe=50, retired_pages_dbe=12)])
    v = one([s(0, retired_pages_sbe=50, retired_pages_dbe=13)], "retired_pages_total")
    assert v.evidence["total"] == 63
    # One of the two absent: no total to judge.
    assert "retired_pages_total" not in rules([s(0, retired_pages_sbe=80)])


def test_retired_dbe_over_15_only_while_growing() -> None:
    growing = [s(3600, retired_pages_dbe=15), s(0, retired_pages_dbe=16)]
    assert one(growing, "retired_pages_dbe").evidence["growth"] == 1
    assert "retired_pages_dbe" not in rules(
        [s(3600, retired_pages_dbe=16), s(0, retired_pages_dbe=16)]
    )
    assert "retired_pages_dbe" not in rules(
        [s(3600, retired_pages_dbe=14), s(0, retired_pages_dbe=15)]
    )
    # Growth older than the week-long window no longer counts.
    old = [s(8 * 86400, retired_pages_dbe=10), s(0, retired_pages_dbe=20)]
    assert "retired_pages_dbe" not in rules(old)


@pytest.mark.parametrize(
    ("value", "action"),
    [(1, "reset_gpu"), (2, "reboot_node"), (3, "drain_inspect"), (4, "drain_reset")],
)
def test_recovery_action_other_than_none(value: int, action: str) -> None:
    assert one([s(0, gpu_recovery_action=value)], "gpu_recovery_action").action == action


def test_recovery_action_none_and_clearing() -> None:
    assert judge([s(0, gpu_recovery_action=0)]) == []
    assert judge([s(10, gpu_recovery_action=1), s(0, gpu_recovery_action=0)]) == []
    assert judge([s(10, gpu_recovery_action=2), s(0, "b2", gpu_temp_c=30.0)]) == []


# --- thermal -------------------------------------------------------------------------------------


def test_temperature_margin_default_and_per_sku() -> None:
    assert "temperature_margin" not in rules([s(0, gpu_temp_c=84.9)])
    v = one([s(0, gpu_temp_c=85.0)], "temperature_margin")
    assert v.evidence["slowdown_temp_c"] == 87.0 and v.evidence["margin_c"] == 2.0
    assert not v.counts_against_gpu
    # An A10 slows down at 98 C: 85 C is fine there, 96 C is not.
    assert "temperature_margin" not in rules([s(0, gpu_temp_c=85.0)], gpu_name="NVIDIA A10")
    assert (
        one([s(0, gpu_temp_c=96.0)], "temperature_margin", gpu_name="NVIDIA A10").evidence["sku"]
        == "A10"
    )
    # Cooled down: clears.
    assert "temperature_margin" not in rules([s(10, gpu_temp_c=90.0), s(0, gpu_temp_c=60.0)])


def _throttle(reasons: list[int | None]) -> list[BootSample]:
    return [s((len(reasons) - 1 - i) * 60, clocks_event_reasons=r) for i, r in enumerate(reasons)]


@pytest.mark.parametrize("bit", [0x8, 0x20, 0x40, 0x80])
def test_persistent_throttle_at_half_the_window(bit: int) -> None:
    v = one(_throttle([bit, 0, bit, 0x1]), "persistent_throttle")  # 2 of 4
    assert v.evidence["fraction"] == 0.5 and v.evidence["bits"][f"0x{bit:x}"] == 2
    assert "persistent_throttle" not in rules(_throttle([bit, 0, 0, 0x4, 0x1]))  # 1 of 5
    # SW power cap (0x4) and idle (0x1) are normal operation, never throttling here.
    assert "persistent_throttle" not in rules(_throttle([0x4, 0x4, 0x1, 0x4]))


def test_throttle_needs_samples_ignores_absent_and_clears() -> None:
    assert "persistent_throttle" not in rules(_throttle([0x40, 0x40]))
    assert "persistent_throttle" not in rules(_throttle([0x40, 0x40, None, None]))
    assert "persistent_throttle" in rules(_throttle([0x40, 0x40, 0x40, None]))
    # Throttled long ago, fine for the last 10 minutes.
    old = [s(1800 + i * 60, clocks_event_reasons=0x40) for i in range(5)]
    assert "persistent_throttle" not in rules(old + _throttle([0, 0, 0]))


# --- real nvidia-smi output ----------------------------------------------------------------------


def test_real_a10_with_uncorrectable_remaps_pending(shared_dir: Path) -> None:
    path = (
        shared_dir
        / "fixtures/nvidia_smi/text_q/gpud__nvidia-smi-query.535.129.03.out.0.valid.a10.txt"
    )
    (reading,) = parse_nvidia_smi_text(path.read_text())
    assert reading.values["remapped_rows_uncorrectable"] == 4
    sample = GpuSample(uuid=reading.identity["uuid"], ts=NOW, **reading.values)
    verdicts = judge_health([sample], thresholds=T, now=NOW, gpu_name=reading.identity.get("name"))
    assert [(v.rule, v.action) for v in verdicts] == [("row_remap_pending", "reset_gpu")]
    assert verdicts[0].gpu == "GPU-73d12ef7-f589-f867-4259-c7090ab44736"
    # 4 uncorrectable rows is far below DCGM's 512; a fleet that wants any to count can say so.
    strict = HealthThresholds.from_mapping({"remapped_rows_uncorrectable_limit": 1})
    got = {v.rule for v in judge_health([sample], thresholds=strict, now=NOW)}
    assert got == {"row_remap_pending", "remapped_rows_uncorrectable"}
