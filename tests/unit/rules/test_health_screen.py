"""The vectorised screen never passes over a window that judge_health gives a verdict on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from fleetwatch.rules import health, health_rates, health_state
from fleetwatch.rules.health import BootSample, judge_health
from fleetwatch.rules.health_evidence import Rule
from fleetwatch.rules.health_screen import JUDGED_FIELDS, SCREENED_RULES, may_fire
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.telemetry import SAMPLE_FIELDS, GpuSample

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
UUID = "GPU-11111111-2222-3333-4444-555555555555"
SEED = 20261201
# Judged elsewhere: gpu_lost from events (the judge picks those GPUs itself), gpu_silent only
# with expected_gpus, gpu_missing by judge_missing_gpus.
NOT_SCREENED = {"gpu_lost", "gpu_silent", "gpu_missing"}
KIND = {spec.name: spec.kind for spec in SAMPLE_FIELDS}
COUNTERS = [name for name in JUDGED_FIELDS if KIND[name] == "counter"]
RATE_COUNTERS = [name for name in COUNTERS if "nvlink" in name or "volatile" in name]
RATE_COUNTERS = [n for n in RATE_COUNTERS if "dbe" not in n] + ["pcie_replay_total"]


def _rules_defined() -> set[str]:
    names = set()
    for module in (health, health_state, health_rates):
        for value in vars(module).values():
            if isinstance(value, Rule):
                names.add(value.name)
    names.update(rule.name for _, _, rule in health_state.FLAG_RULES)
    return names


def test_every_health_rule_is_screened_or_judged_elsewhere() -> None:
    assert _rules_defined() - NOT_SCREENED <= SCREENED_RULES
    assert SCREENED_RULES <= _rules_defined()


def _window(rng: np.random.Generator) -> list[BootSample]:
    n = int(rng.integers(1, 25))
    ts = NOW - timedelta(seconds=float(rng.integers(0, 900)))
    boots = ["a", "b", None]
    boot = boots[int(rng.integers(0, 3))]
    kind_of_window = rng.random()
    # Quiet windows change nothing a rule reads; in rebooting ones (quiet too otherwise) the
    # rate counters stand still at a high reading while the node reboots: a reset, read as an
    # increase of the whole reading.
    rebooting = kind_of_window < 0.15
    quiet = kind_of_window < 0.6
    counters = {name: 0 if quiet else int(rng.integers(0, 3)) for name in COUNTERS}
    if rebooting:
        counters |= {name: int(rng.integers(0, 200)) for name in RATE_COUNTERS}
    out = []
    for i in range(n):
        if (not quiet and rng.random() < 0.05) or (rebooting and i == n // 2):
            boot = boots[(boots.index(boot) + 1) % 2] if boot else "a"
        values: dict[str, Any] = {}
        for name in JUDGED_FIELDS:
            if rng.random() < 0.15:
                continue  # not reported
            kind = KIND[name]
            if kind == "counter":
                if not quiet and rng.random() < 0.2:
                    step = int(rng.integers(-2, 40))
                    counters[name] = max(0, counters[name] + step)
                values[name] = counters[name]
            elif kind == "flag":
                values[name] = bool(not quiet and rng.random() < 0.03)
            elif name == "clocks_event_reasons":
                values[name] = int(rng.choice([0, 0x1, 0x4, 0x8, 0x40, 0x80])) if not quiet else 1
            elif name == "gpu_temp_c":
                values[name] = float(rng.integers(40, 80 if quiet else 95))
            elif name == "pcie_link_gen":
                values[name] = float(rng.integers(1, 7))
            elif name == "pcie_link_width":
                values[name] = float(rng.choice([1, 4, 8, 16]))
            elif name == "gpu_recovery_action":
                values[name] = float(0 if quiet or rng.random() < 0.9 else rng.integers(1, 5))
        sample = GpuSample.model_construct(uuid=UUID, ts=ts, **values)
        out.append(BootSample(boot, sample))
        ts += timedelta(seconds=float(rng.integers(1, 60)))
    return out


def _columns(windows: list[list[BootSample]]) -> tuple[dict[str, Any], Any, Any]:
    codes: dict[str | None, float] = {None: np.nan}
    columns: dict[str, list[float]] = {name: [] for name in JUDGED_FIELDS}
    boots: list[float] = []
    starts: list[int] = []
    for window in windows:
        starts.append(len(boots))
        for s in window:
            boots.append(codes.setdefault(s.boot_id, float(len(codes))))
            for name in JUDGED_FIELDS:
                value = getattr(s.sample, name)
                columns[name].append(np.nan if value is None else float(value))
    arrays = {name: np.array(values, np.float64) for name, values in columns.items()}
    return arrays, np.array(boots, np.float64), np.array(starts, np.int64)


THRESHOLDS = [
    HealthThresholds(),
    HealthThresholds.from_mapping(
        {
            "sbe_per_min": 0,
            "nvlink_replay_limit": 0,
            "temp_margin_c": 30.0,
            "throttle_fraction": 0.1,
        }
    ),
    HealthThresholds.from_mapping(
        {"nvlink_crc_per_s": 0, "nvlink_recovery_limit": 0, "retired_pages_total_limit": 1}
    ),
    HealthThresholds.from_mapping({"ecc_dbe_volatile_max": 5, "throttle_min_samples": 1}),
    # Rate limits within reach of the random windows' increases, so that windows fall on both
    # sides of each (the defaults' NVLink CRC limit, 6,000 a minute, is never reached).
    HealthThresholds.from_mapping(
        {
            "sbe_per_min": 3.0,
            "nvlink_crc_per_s": 0.5,
            "nvlink_replay_limit": 25,
            "nvlink_recovery_limit": 12,
            "pcie_replay_per_lane_per_min": {3: 0.5, 4: 1.0, 5: 2.0, 6: 4.0},
        }
    ),
]


@pytest.mark.parametrize("thresholds", THRESHOLDS, ids=range(len(THRESHOLDS)))
def test_the_screen_picks_every_window_judge_health_gives_a_verdict_on(
    thresholds: HealthThresholds,
) -> None:
    rng = np.random.default_rng(SEED)  # fixed: the windows are the same on every run
    windows = [_window(rng) for _ in range(1500)]
    columns, boots, starts = _columns(windows)
    slowdown = np.full(len(windows), thresholds.slowdown_for("NVIDIA H100 80GB HBM3")[0])
    picked = may_fire(columns, boots, starts, slowdown, thresholds)
    judged = 0
    for i, window in enumerate(windows):
        now = window[-1].sample.ts + timedelta(seconds=float(rng.integers(0, 120)))
        verdicts = judge_health(window, thresholds=thresholds, now=now, gpu_name="H100")
        if verdicts:
            judged += 1
            assert picked[i], (i, [v.rule for v in verdicts])
    # Some windows do get verdicts; with the default thresholds the quiet ones are passed over.
    assert judged > 100
    if thresholds == HealthThresholds():
        assert picked.sum() < len(windows) * 0.7


def test_a_quiet_window_is_passed_over_and_a_hot_one_is_not() -> None:
    quiet = [
        BootSample("a", GpuSample.model_construct(
            uuid=UUID, ts=NOW - timedelta(seconds=10 * i), gpu_temp_c=60.0,
            ecc_sbe_volatile_total=3, clocks_event_reasons=0x1))
        for i in range(10, 0, -1)
    ]  # fmt: skip
    hot = [
        BootSample("a", s.sample.model_copy(update={"gpu_temp_c": 86.0})) for s in quiet
    ]  # fmt: skip
    columns, boots, starts = _columns([quiet, hot])
    picked = may_fire(columns, boots, starts, np.array([87.0, 87.0]), HealthThresholds())
    assert picked.tolist() == [False, True]


def _trickle(step: int, every_s: float, n: int, field: str, base: int = 100) -> list[BootSample]:
    return [
        BootSample("a", GpuSample.model_construct(
            uuid=UUID, ts=NOW - timedelta(seconds=every_s * (n - i)), **{field: base + step * i}))
        for i in range(n)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("field", "limit", "step"),
    [
        # Default limits: 10 corrected errors a minute over 10 min (100), 100 CRC errors a
        # second over 1 min (6,000).
        ("ecc_sbe_volatile_total", 100, 1),
        ("nvlink_crc_flit_errors_total", 6000, 7),
        ("nvlink_crc_data_errors_total", 6000, 3),
    ],
)
def test_a_trickling_counter_is_passed_over_and_one_at_the_limit_is_not(
    field: str, limit: int, step: int
) -> None:
    """Fifteen minutes of readings every 10 s (the judge's window): a counter that rises a
    little at every reading is below its rule's limit and passed over; the same window with
    an increase that reaches the limit is picked, and the rules give it a verdict."""
    n = 91
    trickle = _trickle(step, 10.0, n, field)
    burst = trickle[:-1] + [
        BootSample("a", trickle[-1].sample.model_copy(
            update={field: getattr(trickle[-2].sample, field) + limit}))
    ]  # fmt: skip
    columns, boots, starts = _columns([trickle, burst])
    t = HealthThresholds()
    picked = may_fire(columns, boots, starts, np.array([87.0, 87.0]), t)
    assert picked.tolist() == [False, True]
    assert not judge_health(trickle, thresholds=t, now=NOW, gpu_name="H100")
    assert judge_health(burst, thresholds=t, now=NOW, gpu_name="H100")


def test_a_reset_counts_the_whole_reading_after_it() -> None:
    """A counter read lower than before (or after a reboot) counts its whole new reading, as
    the rule does: 150 after a reset from 400 is 150 corrected errors, over the limit of 100."""
    readings = _trickle(0, 10.0, 10, "ecc_sbe_volatile_total", base=400)
    reset = readings[:-1] + [
        BootSample("a", readings[-1].sample.model_copy(update={"ecc_sbe_volatile_total": 150}))
    ]
    small = readings[:-1] + [
        BootSample("a", readings[-1].sample.model_copy(update={"ecc_sbe_volatile_total": 50}))
    ]
    columns, boots, starts = _columns([reset, small])
    picked = may_fire(columns, boots, starts, np.array([87.0, 87.0]), HealthThresholds())
    assert picked.tolist() == [True, False]


@pytest.mark.parametrize(("width", "burst", "fires"), [(4, 1, False), (4, 3, True), (16, 7, False)])
def test_pcie_replays_are_screened_against_the_links_own_limit(
    width: int, burst: int, fires: bool
) -> None:
    """A Gen3 link may replay ceil(0.48 x lanes) times a minute (2 at x4, 8 at x16): a burst
    above that is picked and judged, one below it is passed over (one exactly at the limit may
    be picked: the screen's sums carry a little slack for rounding)."""
    readings = _trickle(0, 10.0, 10, "pcie_replay_total")
    readings = [
        BootSample(r.boot_id, r.sample.model_copy(
            update={"pcie_link_gen": 3, "pcie_link_width": width}))
        for r in readings
    ]  # fmt: skip
    last = readings[-1].sample
    window = readings[:-1] + [
        BootSample("a", last.model_copy(update={"pcie_replay_total": 100 + burst}))
    ]
    columns, boots, starts = _columns([window])
    t = HealthThresholds()
    assert may_fire(columns, boots, starts, np.array([87.0]), t).tolist() == [fires]
    assert bool(judge_health(window, thresholds=t, now=NOW, gpu_name="H100")) is fires
