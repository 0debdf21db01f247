"""The simulated fleet: determinism, the failure model, precursors, noise, counters, stragglers."""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from fleetwatch.sim import FleetSpec, SimFleet
from fleetwatch.sim.events import APP_XIDS, PRECURSOR_XIDS
from fleetwatch.sim.lifetimes import draw_lifetime_days, reference_scale_days
from fleetwatch.sim.truth import LIFETIME_COLUMNS, lifetime_rows, parse_time
from fleetwatch.telemetry import SAMPLE_FIELDS, GpuSample, IngestLimits

SECOND = timedelta(seconds=1)
DAY_S = 86_400.0
COUNTERS = [f.name for f in SAMPLE_FIELDS if f.kind == "counter"]
# Kept in the InfoROM: they survive a reboot.
PERSISTENT = {
    "ecc_sbe_aggregate_total",
    "ecc_dbe_aggregate_total",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
}
THROTTLE_BITS = {"thermal": 0x20 | 0x40, "power_cap": 0x4, "power_brake": 0x80}
ANY_THROTTLE = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


def _failed(truth: dict[str, Any]) -> list[dict[str, Any]]:
    return [gpu for gpu in truth["gpus"] if gpu["failure_time"] is not None]


def _by_uuid(samples: list[GpuSample]) -> dict[str, GpuSample]:
    return {sample.uuid: sample for sample in samples}


# -- spec and determinism -----------------------------------------------------------------


def test_spec_round_trips_through_json(spec: FleetSpec, tmp_path: Path) -> None:
    path = tmp_path / "fleet.json"
    spec.save(path)
    assert FleetSpec.load(path) == spec
    assert spec.start < spec.real_start  # speed 60: the simulation starts in the past
    assert spec.start + timedelta(days=spec.horizon_days) == spec.end


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"node_name_pattern": "node"}, "own name"),
        ({"node_name_pattern": "bad name {index}"}, "invalid node name"),
        ({"behaviour": {"straggler_slowdown": (0.5, 1.2)}}, "at least 1.0"),
        ({"failures": {"precursor_lead_days": (14, 1)}}, "low <= high"),
        ({"seed": -1}, "greater than or equal"),
    ],
)
def test_spec_refuses_bad_fields(
    make_spec: Callable[..., FleetSpec], fields: dict[str, Any], problem: str
) -> None:
    seed = fields.pop("seed", 1)
    with pytest.raises(ValidationError, match=problem):
        make_spec(seed=seed, **fields)


def test_spec_needs_time_zones(spec: FleetSpec) -> None:
    with pytest.raises(ValidationError, match="time zone"):
        FleetSpec(seed=1, start=datetime(2026, 1, 1), real_start=spec.real_start)


def test_fleet_is_identical_from_the_same_spec_in_any_order(
    spec: FleetSpec, fleet: SimFleet, truth: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "fleet.json"
    spec.save(path)
    other = SimFleet(FleetSpec.load(path))  # as a second agent process would
    names = fleet.node_names()
    for node in reversed(names):  # build the nodes in another order
        assert other.events(node, spec.start, spec.end) == fleet.events(node, spec.start, spec.end)
    assert other.ground_truth() == truth
    for node in names:
        assert other.identities(node) == fleet.identities(node)
        for days in (0.5, 40.0, 200.25, 364.0):
            t = spec.start + timedelta(days=days)
            assert other.sample(node, t) == fleet.sample(node, t)
            assert other.boot_id(node, t) == fleet.boot_id(node, t)


def test_adding_nodes_leaves_existing_ones_unchanged(
    make_spec: Callable[..., FleetSpec], fleet: SimFleet, truth: dict[str, Any]
) -> None:
    bigger = SimFleet(make_spec(nodes=40))
    assert lifetime_rows(bigger)[: len(truth["gpus"])] == lifetime_rows(fleet)
    for node in fleet.node_names():
        assert bigger.identities(node) == fleet.identities(node)


def test_different_seeds_give_different_fleets(
    make_spec: Callable[..., FleetSpec], truth: dict[str, Any]
) -> None:
    other = SimFleet(make_spec(seed=2)).ground_truth()
    assert {g["uuid"] for g in other["gpus"]}.isdisjoint(g["uuid"] for g in truth["gpus"])
    assert [g["failure_time"] for g in other["gpus"]] != [g["failure_time"] for g in truth["gpus"]]


# -- failures -------------------------------------------------------------------------


def test_failures_happen_at_ground_truth_times_and_the_gpu_disappears(
    fleet: SimFleet, truth: dict[str, Any]
) -> None:
    failed = _failed(truth)
    assert len(failed) >= 10
    causes = {cause.xid for cause in fleet.spec.failures.causes}
    for gpu in failed:
        node, uuid, at = gpu["node"], gpu["uuid"], parse_time(gpu["failure_time"])
        assert gpu["cause_xid"] in causes
        events = [e for e in fleet.events(node, at - SECOND, at) if e.uuid == uuid]
        fatal = [e for e in events if e.kind == "xid" and e.xid == gpu["cause_xid"]]
        assert [e.ts for e in fatal] == [at]
        assert fatal[0].pid is None  # the hardware, not an application
        assert any(e.kind == "gpu_lost" for e in events) == (gpu["cause_xid"] == 79)
        assert uuid in _by_uuid(fleet.sample(node, at - SECOND))
        for later in (at, at + timedelta(hours=1), fleet.spec.end + timedelta(days=1)):
            assert uuid not in _by_uuid(fleet.sample(node, later))
        after = fleet.events(node, at, fleet.spec.end + timedelta(days=30))
        assert all(e.uuid != uuid for e in after)


def test_a_node_may_hang_after_a_failure_and_reboots(
    fleet: SimFleet, truth: dict[str, Any]
) -> None:
    hung = [gpu for gpu in _failed(truth) if gpu["node_silent_until"] is not None]
    assert hung, "the default failure model hangs some nodes"
    for gpu in hung:
        node, at = gpu["node"], parse_time(gpu["failure_time"])
        until = parse_time(gpu["node_silent_until"])
        assert not fleet.is_silent(node, at)  # the fatal Xid gets out first
        assert fleet.is_silent(node, at + 2 * SECOND)
        assert fleet.boot_id(node, until + SECOND) != fleet.boot_id(node, at)


def test_most_failures_have_precursors_within_their_lead_window(
    fleet: SimFleet, truth: dict[str, Any]
) -> None:
    failed = _failed(truth)
    warned = [gpu for gpu in failed if gpu["precursor_start"] is not None]
    assert 0.5 <= len(warned) / len(failed) < 1.0  # most, but some failures are sudden
    low, high = fleet.spec.failures.precursor_lead_days
    for gpu in warned:
        start, end = parse_time(gpu["precursor_start"]), parse_time(gpu["failure_time"])
        lead_days = (end - start).total_seconds() / DAY_S
        assert low - 1e-6 <= lead_days <= high + 1e-6 or start == parse_time(gpu["install_time"])
        assert "temperature" in gpu["precursor_signals"]


def test_memory_precursors_show_in_ecc_counters_and_xids(
    fleet: SimFleet, truth: dict[str, Any]
) -> None:
    spec = fleet.spec
    memory = [
        gpu
        for gpu in _failed(truth)
        if "ecc_sbe" in gpu["precursor_signals"] and parse_time(gpu["precursor_start"]) > spec.start
    ]
    assert memory
    for gpu in memory:
        node, uuid = gpu["node"], gpu["uuid"]
        start, end = parse_time(gpu["precursor_start"]), parse_time(gpu["failure_time"])
        first = _by_uuid(fleet.sample(node, start))[uuid]
        last = _by_uuid(fleet.sample(node, end - SECOND))[uuid]
        # The rate ramps up to >= 20/h over >= 1 day: at least ~100 SBEs in the window.
        assert last.ecc_sbe_aggregate_total - first.ecc_sbe_aggregate_total >= 50
        quarter = (end - start) / 4
        early = _by_uuid(fleet.sample(node, start + quarter))[uuid].ecc_sbe_aggregate_total
        late = _by_uuid(fleet.sample(node, end - quarter))[uuid].ecc_sbe_aggregate_total
        assert last.ecc_sbe_aggregate_total - late > early - first.ecc_sbe_aggregate_total
        assert last.remapped_rows_correctable >= first.remapped_rows_correctable
        warnings = [
            e.xid
            for e in fleet.events(node, start, end - SECOND)
            if e.uuid == uuid and e.xid in PRECURSOR_XIDS
        ]
        assert warnings, f"no Xid 63/64/92/94 before the failure of {uuid}"


def test_bus_precursors_raise_pcie_replays(fleet: SimFleet, truth: dict[str, Any]) -> None:
    bus = [g for g in _failed(truth) if "pcie_replay" in g["precursor_signals"]]
    assert bus
    checked = 0
    for gpu in bus:
        node, uuid, end = gpu["node"], gpu["uuid"], parse_time(gpu["failure_time"])
        hour_before = end - timedelta(hours=1)
        if fleet.boot_id(node, hour_before) != fleet.boot_id(node, end - SECOND):
            continue
        before = _by_uuid(fleet.sample(node, hour_before))[uuid].pcie_replay_total
        after = _by_uuid(fleet.sample(node, end - SECOND))[uuid].pcie_replay_total
        assert after is not None and before is not None
        assert after - before >= 5  # near 10-200/h at the end, against <= 3/day background
        checked += 1
    assert checked


def test_precursor_temperature_rises_towards_failure(
    fleet: SimFleet, truth: dict[str, Any]
) -> None:
    per_watt = {sku.name: sku.celsius_per_watt for sku in fleet.spec.skus}
    rises = []
    for gpu in _failed(truth):
        if gpu["precursor_start"] is None:
            continue
        node, uuid = gpu["node"], gpu["uuid"]
        start, end = parse_time(gpu["precursor_start"]), parse_time(gpu["failure_time"])

        def inlet_corrected(
            t: datetime, node: str = node, uuid: str = uuid, per_w: float = per_watt[gpu["sku"]]
        ) -> float:
            sample = _by_uuid(fleet.sample(node, t))[uuid]
            assert sample.gpu_temp_c is not None and sample.power_w is not None
            return sample.gpu_temp_c - per_w * sample.power_w

        if fleet.step_slowdown(node, end - timedelta(minutes=1)) > 1.0:
            continue  # a thermal straggler window would add its own heat
        rises.append(inlet_corrected(end - timedelta(minutes=1)) - inlet_corrected(start))
    assert len(rises) >= 5
    assert sum(rises) / len(rises) >= 3.0  # the rise is drawn from 3..10 C
    assert min(rises) > -3.0


def test_precursor_xids_are_much_denser_before_failures(
    fleet: SimFleet, truth: dict[str, Any]
) -> None:
    spec = fleet.spec
    windows = {
        g["uuid"]: (parse_time(g["precursor_start"]), parse_time(g["failure_time"]))
        for g in _failed(truth)
        if g["precursor_start"] is not None and "ecc_sbe" in g["precursor_signals"]
    }
    inside = outside = 0
    for node in fleet.node_names():
        for event in fleet.events(node, spec.start, spec.end):
            if event.xid not in PRECURSOR_XIDS:
                continue
            window = windows.get(event.uuid or "")
            if window is not None and window[0] <= event.ts <= window[1]:
                inside += 1
            else:
                outside += 1
    inside_days = sum((b - a).total_seconds() for a, b in windows.values()) / DAY_S
    outside_days = len(truth["gpus"]) * spec.horizon_days - inside_days
    assert outside > 0, "false alarms (isolated row remaps) exist"
    assert inside / inside_days > 20 * outside / outside_days


# -- noise that is not failure ----------------------------------------------------------


def test_application_xids_are_frequent_and_carry_the_process(
    fleet: SimFleet, truth: dict[str, Any]
) -> None:
    spec = fleet.spec
    app = [
        e
        for node in fleet.node_names()
        for e in fleet.events(node, spec.start, spec.end)
        if e.xid in APP_XIDS
    ]
    assert Counter(e.xid for e in app).keys() == APP_XIDS
    assert all(e.pid is not None and e.process for e in app)
    survivors = {g["uuid"] for g in truth["gpus"]} - {g["uuid"] for g in _failed(truth)}
    assert len({e.uuid for e in app} & survivors) > 0.9 * len(survivors)


def test_application_xids_do_not_depend_on_the_failure_model(
    make_spec: Callable[..., FleetSpec], fleet: SimFleet, truth: dict[str, Any]
) -> None:
    spec = fleet.spec
    fragile = SimFleet(make_spec(failures={"monthly_failure_prob": 0.2}))
    fragile_truth = fragile.ground_truth()
    assert len(_failed(fragile_truth)) > 3 * len(_failed(truth))
    failure = {
        (sim_truth is truth, g["uuid"]): parse_time(g["failure_time"])
        for sim_truth in (truth, fragile_truth)
        for g in _failed(sim_truth)
    }
    for node in fleet.node_names()[:6]:

        def seen_by_both(event: Any, node: str = node) -> bool:
            # Where both fleets have the GPU alive and the node up, they show the same noise.
            return all(
                event.ts < failure.get((mine, event.uuid), spec.end + SECOND)
                and not sim.is_silent(node, event.ts)
                for mine, sim in ((True, fleet), (False, fragile))
            )

        mine, theirs = (
            [
                e
                for e in sim.events(node, spec.start, spec.end)
                if e.xid in APP_XIDS and seen_by_both(e)
            ]
            for sim in (fleet, fragile)
        )
        assert mine == theirs and mine


def test_silent_windows_include_outages_without_failures(
    fleet: SimFleet, truth: dict[str, Any]
) -> None:
    reasons: Counter[str] = Counter()
    for node in truth["nodes"]:
        for window in node["silent_windows"]:
            start, end = parse_time(window["start"]), parse_time(window["end"])
            reasons[window["reason"]] += 1
            assert fleet.is_silent(node["name"], start + (end - start) / 2)
            assert fleet.silence(node["name"], start) is not None
    assert reasons["outage"] > 0 and reasons["reboot"] > 0
    assert not fleet.is_silent(truth["nodes"][0]["name"], fleet.spec.end + timedelta(days=10))


# -- readings ---------------------------------------------------------------------------


def test_every_sample_is_a_valid_wire_sample_with_plausible_values(fleet: SimFleet) -> None:
    spec = fleet.spec
    previous: dict[tuple[str, str], tuple[str, int]] = {}
    for days in range(0, int(spec.horizon_days) + 1, 3):
        t = spec.start + timedelta(days=days, hours=days % 24, minutes=7)
        limits = IngestLimits(now=t)
        for node in fleet.node_names():
            boot = fleet.boot_id(node, t)
            for sample in fleet.sample(node, t):
                again = GpuSample.model_validate_json(
                    sample.model_dump_json(), context={"limits": limits}
                )
                assert again == sample
                assert sample.gpu_temp_c is not None and 25 <= sample.gpu_temp_c <= 95
                assert sample.power_w is not None and sample.power_limit_w is not None
                assert 0 < sample.power_w <= sample.power_limit_w <= 700
                assert sample.fb_used_mib is not None and sample.fb_total_mib is not None
                assert sample.fb_used_mib <= sample.fb_total_mib
                assert sample.fan_speed_pct is None  # SXM boards have no fans
                assert sample.retired_pages_sbe is None  # row remapping instead, since Ampere
                for name in COUNTERS:
                    value = getattr(sample, name)
                    if value is None:
                        continue
                    before = previous.get((sample.uuid, name))
                    if before is not None and (before[0] == boot or name in PERSISTENT):
                        assert value >= before[1], (node, sample.uuid, name, t)
                    previous[(sample.uuid, name)] = (boot, value)


def test_volatile_counters_reset_at_a_reboot(fleet: SimFleet, truth: dict[str, Any]) -> None:
    node, boot = next(
        (node["name"], boot)
        for node in truth["nodes"]
        for boot in node["boots"]
        if boot["reason"] == "reboot" and parse_time(boot["start"]) > fleet.spec.start
    )
    at = parse_time(boot["start"])
    assert fleet.boot_id(node, at) == boot["boot_id"] != fleet.boot_id(node, at - SECOND)
    before = _by_uuid(fleet.sample(node, at - SECOND))
    after = _by_uuid(fleet.sample(node, at + SECOND))
    for uuid, sample in after.items():
        old = before[uuid]
        assert sample.energy_mj is not None and old.energy_mj is not None
        assert sample.energy_mj < old.energy_mj and sample.energy_mj <= 700_000 * 2
        assert sample.ecc_sbe_volatile_total is not None
        assert sample.ecc_sbe_volatile_total <= (old.ecc_sbe_volatile_total or 0)
        assert sample.ecc_sbe_aggregate_total == old.ecc_sbe_aggregate_total
        assert sample.remapped_rows_pending is False  # the reset activated any pending remap


def test_straggler_windows_throttle_clocks_and_set_event_reasons(
    fleet: SimFleet, truth: dict[str, Any]
) -> None:
    max_clock = {sku.name: sku.max_sm_clock_mhz for sku in fleet.spec.skus}
    windows = [(node, w) for node in truth["nodes"] for w in node["straggler_windows"]]
    assert len(windows) > 50
    assert {w["cause"] for _, w in windows} == set(THROTTLE_BITS)
    for node, window in windows:
        name = node["name"]
        start, end = parse_time(window["start"]), parse_time(window["end"])
        middle = start + (end - start) / 2
        assert window["slowdown"] > 1.0
        # A faulty link slows the same steps on its own: the factors multiply.
        links = fleet.link_slowdown(name, middle)
        assert fleet.step_slowdown(name, middle) == pytest.approx(window["slowdown"] * links)
        assert fleet.step_slowdown(name, end + SECOND) == fleet.link_slowdown(name, end + SECOND)
        bits = THROTTLE_BITS[window["cause"]]
        for sample in fleet.sample(name, middle):
            assert sample.clocks_event_reasons is not None and sample.sm_clock_mhz is not None
            if sample.uuid in window["gpus"]:
                assert sample.clocks_event_reasons & bits == bits
                assert sample.sm_clock_mhz <= max_clock[node["sku"]] / window["slowdown"] + 1
            else:
                assert sample.clocks_event_reasons & ANY_THROTTLE == 0
                assert sample.sm_clock_mhz > max_clock[node["sku"]] - 31


def test_nvlink_crc_bursts_raise_counters_and_are_no_failure(
    fleet: SimFleet, truth: dict[str, Any]
) -> None:
    checked = 0
    for node in truth["nodes"]:
        name = node["name"]
        for burst in node["nvlink_bursts"]:
            start, end = parse_time(burst["start"]), parse_time(burst["end"])
            if fleet.boot_id(name, start - SECOND) != fleet.boot_id(name, end + SECOND):
                continue
            before = _by_uuid(fleet.sample(name, start - SECOND)).get(burst["uuid"])
            after = _by_uuid(fleet.sample(name, end + SECOND)).get(burst["uuid"])
            if before is None or after is None:
                continue  # the GPU failed meanwhile
            assert before.nvlink_crc_flit_errors_total is not None
            assert after.nvlink_crc_flit_errors_total is not None
            jump = after.nvlink_crc_flit_errors_total - before.nvlink_crc_flit_errors_total
            assert jump >= burst["crc_flit_errors"] - 1
            checked += 1
    assert checked > 100
    spec = fleet.spec
    assert not any(
        e.xid == 74 for node in fleet.node_names() for e in fleet.events(node, spec.start, spec.end)
    )


# -- the failure model over a large fleet ------------------------------------------------


@pytest.fixture(scope="module")
def big_fleet_rows(make_spec: Callable[..., FleetSpec]) -> list[dict[str, Any]]:
    """16,000 GPUs: only identities and fates are drawn (node histories stay unbuilt)."""
    return lifetime_rows(SimFleet(make_spec(seed=7, nodes=2000)))


def _monthly_rate(rows: list[dict[str, Any]]) -> float:
    exposure = sum(row["duration_days"] - row["entry_days"] for row in rows)
    return 30.0 * sum(row["event"] for row in rows) / exposure


def test_default_fleet_loses_a_few_percent_of_gpus_a_month(
    big_fleet_rows: list[dict[str, Any]],
) -> None:
    assert 0.01 <= _monthly_rate(big_fleet_rows) <= 0.035


def test_hot_positions_fail_measurably_more(big_fleet_rows: list[dict[str, Any]]) -> None:
    # Top of rack runs 8 C hotter: scale x 2^-0.8, so the hazard is ~2^(0.8 k) ~ 1.9x higher.
    top = _monthly_rate([r for r in big_fleet_rows if r["position"] == 3])
    bottom = _monthly_rate([r for r in big_fleet_rows if r["position"] == 0])
    assert 1.4 <= top / bottom <= 2.6


def test_bad_batch_dies_young(big_fleet_rows: list[dict[str, Any]]) -> None:
    def first_month(batch: str) -> float:
        rows = [r for r in big_fleet_rows if r["batch"] == batch and r["entry_days"] < 30]
        early = sum(1 for r in rows if r["event"] and r["duration_days"] <= 30)
        return early / len(rows)

    assert first_month("lot-c") > 2.5 * first_month("lot-a")


def test_failure_rate_is_configurable(make_spec: Callable[..., FleetSpec]) -> None:
    rows = lifetime_rows(
        SimFleet(make_spec(seed=7, nodes=500, failures={"monthly_failure_prob": 0.002}))
    )
    assert _monthly_rate(rows) < 0.008


def test_conditional_lifetime_draw_matches_the_weibull_survival() -> None:
    # P(T > t | T > a) = exp((a/l)^k - (t/l)^k): the draw at E = -ln S inverts it exactly.
    shape, scale, age, horizon = 1.3, 900.0, 50.0, 400.0
    survival = math.exp((age / scale) ** shape - (horizon / scale) ** shape)
    assert draw_lifetime_days(shape, scale, age, -math.log(survival)) == pytest.approx(horizon)
    assert reference_scale_days(0.01, 1.0) == pytest.approx(365 / (-12 * math.log(0.99)))


# -- ground truth files ---------------------------------------------------------------------


def test_ground_truth_is_written_as_json_and_a_lifetime_csv(
    fleet: SimFleet, truth: dict[str, Any], tmp_path: Path
) -> None:
    json_path, csv_path = fleet.write_ground_truth(tmp_path / "ground_truth.json")
    assert csv_path == tmp_path / "ground_truth_lifetimes.csv"
    assert json.loads(json_path.read_text()) == truth
    with csv_path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == LIFETIME_COLUMNS
    assert [row["uuid"] for row in rows] == [gpu["uuid"] for gpu in truth["gpus"]]
    for row, gpu in zip(rows, truth["gpus"], strict=True):
        assert row["event"] == ("1" if gpu["failure_time"] else "0")
        assert float(row["duration_days"]) >= float(row["entry_days"])
    summary = truth["summary"]
    assert summary["gpus"] == 128 and summary["failed"] + summary["censored"] == 128
    assert set(truth["nodes"][0]) >= {"boots", "silent_windows", "straggler_windows", "labels"}
