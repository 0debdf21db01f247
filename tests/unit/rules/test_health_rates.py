"""judge_health rate rules, node-level rules, and per-fleet threshold overrides."""

from __future__ import annotations

import tomllib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fleetwatch.rules.health import BootSample, HealthVerdict, judge_health, judge_missing_gpus
from fleetwatch.rules.thresholds import HealthThresholds, source_of
from fleetwatch.telemetry import Event, GpuSample

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
UUID = "GPU-5e1d2c3b-4a59-6877-8695-a4b3c2d1e0f9"
UUID2 = "GPU-00000000-0000-0000-0000-000000000002"
T = HealthThresholds()


def s(seconds_ago: float, boot: str | None = "b1", /, **values: Any) -> BootSample:
    return BootSample(boot, GpuSample(uuid=UUID, ts=NOW - timedelta(seconds=seconds_ago), **values))


def rules(samples: list[Any], **kwargs: Any) -> set[str]:
    kwargs.setdefault("thresholds", T)
    return {v.rule for v in judge_health(samples, now=NOW, **kwargs)}


def one(samples: list[BootSample], rule: str, **kwargs: Any) -> HealthVerdict:
    kwargs.setdefault("thresholds", T)
    found = [v for v in judge_health(samples, now=NOW, **kwargs) if v.rule == rule]
    assert len(found) == 1, found
    return found[0]


def pair(
    name: str, before: int, after: int, ago: float = 0, span: float = 60, **extra: Any
) -> list[BootSample]:
    """Two readings ``span`` seconds apart, the later ``ago`` seconds before NOW."""
    return [s(ago + span, **{name: before}, **extra), s(ago, **{name: after}, **extra)]


# --- SBE -----------------------------------------------------------------------------------------


def test_sbe_rate_at_threshold_over_window() -> None:
    # 10/min over the 10 min window = 100 errors in the window.
    assert "ecc_sbe_rate" not in rules(pair("ecc_sbe_volatile_total", 1000, 1099, span=300))
    v = one(pair("ecc_sbe_volatile_total", 1000, 1100, span=300), "ecc_sbe_rate")
    assert v.evidence["increase"] == 100 and v.evidence["threshold"] == 10.0
    assert v.severity == "warning" and not v.counts_against_gpu


def test_sbe_counter_reset_is_not_a_spike() -> None:
    # A naive difference across the reboot would be -49_990 or, taken as absolute, a huge spike.
    series = [s(120, ecc_sbe_volatile_total=50_000), s(60, "b2", ecc_sbe_volatile_total=10)]
    assert "ecc_sbe_rate" not in rules(series)
    # A drop on the same boot (driver reload) is a reset as well.
    assert "ecc_sbe_rate" not in rules(pair("ecc_sbe_volatile_total", 50_000, 5))


def test_sbe_rate_clears_after_quiet_window() -> None:
    burst = pair("ecc_sbe_volatile_total", 0, 500, ago=700, span=10)
    quiet = [s(300, ecc_sbe_volatile_total=500), s(0, ecc_sbe_volatile_total=500)]
    assert "ecc_sbe_rate" in rules(pair("ecc_sbe_volatile_total", 0, 500, span=10))
    assert "ecc_sbe_rate" not in rules(burst + quiet)


# --- NVLink --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["nvlink_crc_flit_errors_total", "nvlink_crc_data_errors_total"])
def test_nvlink_crc_at_100_per_second(name: str) -> None:
    assert "nvlink_crc_rate" not in rules(pair(name, 0, 5999))
    v = one(pair(name, 0, 6000), "nvlink_crc_rate")
    assert v.evidence["field"] == name and v.evidence["per_s"] == 100.0
    assert (v.action, v.severity) == ("drain_inspect", "critical")


@pytest.mark.parametrize(
    ("name", "rule", "action"),
    [
        ("nvlink_replay_errors_total", "nvlink_replay", "investigate"),
        ("nvlink_recovery_errors_total", "nvlink_recovery", "drain_inspect"),
    ],
)
def test_nvlink_replay_recovery_one_per_minute(name: str, rule: str, action: str) -> None:
    assert rule not in rules(pair(name, 7, 7))
    assert one(pair(name, 7, 8), rule).action == action
    # The increase left the last minute: clear.
    assert rule not in rules(pair(name, 7, 8, ago=90) + [s(0, **{name: 8})])
    # Reboot in between: 3 -> 0 is not an increase.
    assert rule not in rules([s(30, **{name: 3}), s(0, "b2", **{name: 0})])


# --- PCIe ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gen", "width", "limit"), [(3, 16, 8), (4, 16, 16), (5, 16, 31), (4, 8, 8), (6, 4, 16)]
)
def test_pcie_replays_by_generation_and_width(gen: int, width: int, limit: int) -> None:
    link = {"pcie_link_gen": gen, "pcie_link_width": width}
    assert "pcie_replay_rate" not in rules(pair("pcie_replay_total", 100, 100 + limit, **link))
    v = one(pair("pcie_replay_total", 100, 101 + limit, **link), "pcie_replay_rate")
    assert v.evidence["threshold"] == limit and v.evidence["link_gen"] == gen


def test_pcie_needs_generation_and_assumes_x16_without_width() -> None:
    assert "pcie_replay_rate" not in rules(pair("pcie_replay_total", 0, 1000))
    assert "pcie_replay_rate" not in rules(pair("pcie_replay_total", 0, 16, pcie_link_gen=4))
    assert "pcie_replay_rate" in rules(pair("pcie_replay_total", 0, 17, pcie_link_gen=4))


def test_absent_counters_do_not_fire_or_make_zero_rates() -> None:
    series = [s(60, nvlink_replay_errors_total=5), s(30), s(0, nvlink_replay_errors_total=5)]
    assert rules(series) == set()
    # Present only once in the window: no interval, no rate.
    assert rules([s(0, nvlink_recovery_errors_total=9)]) == set()


def test_bare_gpu_samples_are_accepted() -> None:
    bare = [b.sample for b in pair("nvlink_recovery_errors_total", 0, 2)]
    assert rules(bare) == {"nvlink_recovery"}


# --- lost / missing GPUs -------------------------------------------------------------------------


def test_gpu_lost_event_until_reboot() -> None:
    lost = Event(kind="gpu_lost", ts=NOW - timedelta(seconds=30), uuid=UUID, message="fallen off")
    other = Event(kind="gpu_lost", ts=NOW - timedelta(seconds=30), uuid=UUID2)
    base = [s(60, gpu_temp_c=40.0)]
    v = one(base, "gpu_lost", events=[lost, other])
    assert (v.action, v.evidence["boot_id"]) == ("reboot_node", "b1")
    assert rules(base, events=[other]) == set()
    assert "gpu_lost" not in rules(base + [s(0, "b2", gpu_temp_c=35.0)], events=[lost])


def test_gpu_silent_only_when_expected() -> None:
    old = [s(600, gpu_temp_c=40.0)]
    assert "gpu_silent" in rules(old, expected_gpus={UUID})
    assert "gpu_silent" not in rules(old)
    assert "gpu_silent" not in rules([s(599, gpu_temp_c=40.0)], expected_gpus={UUID})


def test_judge_missing_gpus() -> None:
    seen = {UUID2: NOW - timedelta(minutes=3)}
    (v,) = judge_missing_gpus({UUID, UUID2}, {UUID}, now=NOW, last_seen=seen)
    assert (v.gpu, v.rule, v.action, v.counts_against_gpu) == (
        UUID2,
        "gpu_missing",
        "reboot_node",
        True,
    )
    assert v.last_seen == seen[UUID2] and "79" in v.source
    assert judge_missing_gpus({UUID, UUID2}, {UUID, UUID2}, now=NOW) == []
    # A node that reports nothing is a node problem, not two GPUs off the bus.
    assert judge_missing_gpus({UUID, UUID2}, set(), now=NOW) == []


# --- thresholds ----------------------------------------------------------------------------------


def test_every_default_cites_a_source() -> None:
    for name in ("ecc_dbe_volatile_max", "nvlink_crc_per_s", "pcie_replay_per_lane_per_min"):
        assert source_of(name)
    assert "DCGM" in source_of("retired_pages_total_limit")
    with pytest.raises(KeyError):
        source_of("nope")


def test_fleet_override_changes_the_verdict() -> None:
    strict = HealthThresholds.from_mapping({"nvlink_crc_per_s": 10, "nvlink_window_s": 60.0})
    series = pair("nvlink_crc_data_errors_total", 0, 600)
    assert "nvlink_crc_rate" not in rules(series)
    v = one(series, "nvlink_crc_rate", thresholds=strict)
    assert v.evidence["threshold"] == 10


def _from_toml(text: str) -> HealthThresholds:
    """The thresholds a rules file's ``[health]`` table gives, as ``load_rules`` reads them."""
    return HealthThresholds.from_mapping(tomllib.loads(text).get("health"))


def test_toml_overrides_extend_tables() -> None:
    t = _from_toml(
        '[health]\ntemp_margin_c = 5\n[health.slowdown_temp_by_sku]\n"H100" = 90\n'
        "[health.pcie_replay_per_lane_per_min]\n4 = 2.0\n"
    )
    assert t.temp_margin_c == 5
    assert t.slowdown_temp_by_sku["H100"] == 90 and t.slowdown_temp_by_sku["A10"] == 98.0
    assert t.pcie_replay_per_lane_per_min[4] == 2.0 and t.pcie_replay_per_lane_per_min[5] == 1.92
    assert _from_toml("[other]\nx = 1\n") == HealthThresholds()


@pytest.mark.parametrize(
    "bad",
    [
        {"nvlink_crc_per_sec": 1},
        {"ecc_dbe_volatile_max": 0.5},
        {"ecc_dbe_volatile_max": True},
        {"nvlink_crc_per_s": -1},
        {"nvlink_crc_per_s": "100"},
        {"throttle_fraction": 1.5},
        {"sbe_window_s": 0},
        {"slowdown_temp_by_sku": 90},
        {"pcie_replay_per_lane_per_min": {"gen4": 1.0}},
        {"pcie_replay_per_lane_per_min": {"4": 0}},
    ],
)
def test_invalid_overrides_are_rejected(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        HealthThresholds.from_mapping(bad)
