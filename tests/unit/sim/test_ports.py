"""Simulated network adapter ports (issue 13): InfiniBand and RoCE ports whose counters read as
sysfs's do, seeded link faults (flaps, degradations, links down for good) and the slower training
steps they cause."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pytest
from tests.unit.agent.conftest import FIXTURES_DIR
from tests.unit.agent.sysfs_trees import H100_TAR, H100_TREE, unpack_tar

from fleetwatch.models.stragglers import DetectorConfig, JobDetector, StepRow, judge_window
from fleetwatch.sim import FleetSpec, NetworkSpec, SimFleet
from fleetwatch.sim.truth import parse_time
from fleetwatch.telemetry import PortSample

SECOND = timedelta(seconds=1)
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
QUIET_LINKS = NetworkSpec(
    flaps_per_port_month=0, degradations_per_port_month=0, deaths_per_port_month=0
)


def _faults(truth: dict[str, Any], kind: str) -> list[tuple[str, dict[str, Any]]]:
    return [(n["name"], f) for n in truth["nodes"] for f in n["link_faults"] if f["kind"] == kind]


def _port(fleet: SimFleet, node: str, device: str, t: datetime) -> PortSample:
    return next(p for p in fleet.ports(node, t) if p.device == device)


def _counter(port: PortSample, name: str) -> int:
    assert port.counters is not None
    return port.counters[name]


def _same_boot(fleet: SimFleet, node: str, *times: datetime) -> bool:
    return len({fleet.boot_id(node, t) for t in times}) == 1


def test_the_fleet_has_both_networks_and_every_kind_of_link_fault(truth: dict[str, Any]) -> None:
    assert {n["network"] for n in truth["nodes"]} == {"InfiniBand", "RoCE"}
    kinds = truth["summary"]["link_faults_by_kind"]
    assert set(kinds) == {"flap", "degrade", "dead"} and kinds["flap"] > 20
    assert any(f["then_dead"] for _, f in _faults(truth, "degrade"))
    assert any(f["downshift"] is not None for _, f in _faults(truth, "degrade"))
    assert all(f["end"] is None for _, f in _faults(truth, "dead"))


def test_ports_are_the_same_for_the_same_seed_and_not_for_another(
    make_spec: Callable[..., FleetSpec], fleet: SimFleet, truth: dict[str, Any]
) -> None:
    again = SimFleet(make_spec())
    node, t = fleet.node_names()[5], fleet.spec.start + timedelta(days=40, seconds=7)
    assert again.ports(node, t) == fleet.ports(node, t)
    assert [n["link_faults"] for n in again.ground_truth()["nodes"]] == [
        n["link_faults"] for n in truth["nodes"]
    ]
    other = SimFleet(make_spec(seed=2)).ground_truth()
    assert [n["link_faults"] for n in other["nodes"]] != [n["link_faults"] for n in truth["nodes"]]


def test_link_faults_change_nothing_else_in_the_fleet(
    make_spec: Callable[..., FleetSpec], fleet: SimFleet, truth: dict[str, Any]
) -> None:
    quiet = SimFleet(make_spec(network=QUIET_LINKS))
    assert all(n["link_faults"] == [] for n in quiet.ground_truth()["nodes"])
    assert quiet.ground_truth()["gpus"] == truth["gpus"]
    node, t = fleet.node_names()[2], fleet.spec.start + timedelta(days=100)
    assert quiet.sample(node, t) == fleet.sample(node, t)
    assert quiet.events(node, fleet.spec.start, t) == fleet.events(node, fleet.spec.start, t)


def test_each_kind_of_link_fault_draws_on_its_own(
    make_spec: Callable[..., FleetSpec], truth: dict[str, Any]
) -> None:
    no_flaps = SimFleet(make_spec(network=NetworkSpec(flaps_per_port_month=0))).ground_truth()
    assert _faults(no_flaps, "flap") == []
    # Without flaps in the way none is dropped for overlapping one: the rest are all still there.
    for kind in ("degrade", "dead"):
        kept = _faults(no_flaps, kind)
        assert all(fault in kept for fault in _faults(truth, kind))


def test_counters_never_fall_within_a_boot_and_restart_at_a_reboot(fleet: SimFleet) -> None:
    compared = resets = 0
    for node in fleet.node_names()[:4]:
        before: dict[str, tuple[str, PortSample]] = {}
        for k in range(60 * 8):  # every 3 hours for 60 days
            t = fleet.spec.start + timedelta(hours=3 * k, seconds=1)
            boot = fleet.boot_id(node, t)
            for port in fleet.ports(node, t):
                if port.device in before:
                    old_boot, old = before[port.device]
                    assert old.counters is not None and port.counters is not None
                    assert old.hw_counters is not None and port.hw_counters is not None
                    if old_boot == boot:
                        assert all(port.counters[n] >= v for n, v in old.counters.items())
                        assert all(port.hw_counters[n] >= v for n, v in old.hw_counters.items())
                        compared += 1
                    elif _counter(port, "port_xmit_data") < _counter(old, "port_xmit_data"):
                        resets += 1
                before[port.device] = (boot, port)
    assert compared > 10_000 and resets >= 8


def test_traffic_follows_the_nodes_jobs_in_4_byte_words(fleet: SimFleet) -> None:
    node = fleet.node_names()[0]
    timeline, _ = fleet.node_state(node)
    jobs, start = timeline.jobs, fleet.spec.start
    net = fleet.spec.network
    busy = idle = 0
    for k in range(len(jobs.starts) - 1):
        a, b = (
            start + timedelta(seconds=jobs.starts[k]),
            start + timedelta(seconds=jobs.starts[k + 1]),
        )
        if a < start or b > fleet.spec.end or b - a < 2 * HOUR:
            continue
        t0, t1 = a + 10 * MINUTE, a + 70 * MINUTE
        if not _same_boot(fleet, node, t0, t1):
            continue
        port0, port1 = _port(fleet, node, "mlx5_0", t0), _port(fleet, node, "mlx5_0", t1)
        if port1.state != "ACTIVE":
            continue
        words_per_s = (_counter(port1, "port_xmit_data") - _counter(port0, "port_xmit_data")) / 3600
        if jobs.busy[k]:
            line = net.rate_gbps * 1e9 / 32  # 4-byte words a second at the port's rate
            assert 0.15 * 0.75 * 0.97 * line <= words_per_s <= 0.45 * 1.03 * line
            assert _counter(port1, "port_xmit_packets") > _counter(port0, "port_xmit_packets")
            busy += 1
        else:
            assert words_per_s == 0
            idle += 1
    assert busy >= 3 and idle >= 3


def test_healthy_links_see_a_small_background_of_symbol_errors(
    fleet: SimFleet, truth: dict[str, Any]
) -> None:
    t = fleet.spec.start + timedelta(days=200)
    faulty = {
        (n["name"], f["device"])
        for n in truth["nodes"]
        for f in n["link_faults"]
        if parse_time(f["start"]) < t
    }
    seen = []
    for node in fleet.node_names():
        boot_s = fleet.seconds(fleet.boots(node, fleet.spec.start - timedelta(days=30), t)[-1][0])
        days_up = (fleet.seconds(t) - boot_s) / 86_400
        for port in fleet.ports(node, t):
            if (node, port.device) in faulty:
                continue
            errors = _counter(port, "symbol_error")
            assert errors <= 20 * days_up + 1
            assert _counter(port, "link_downed") == 0 and port.state == "ACTIVE"
            seen.append(errors)
    assert len(seen) > 40
    assert 0 < sum(1 for e in seen if e == 0) < len(seen)


def test_a_flap_downs_the_link_a_few_times_then_it_is_back(
    fleet: SimFleet, truth: dict[str, Any]
) -> None:
    checked = 0
    for node, flap in _faults(truth, "flap"):
        start, end = parse_time(flap["start"]), parse_time(flap["end"])
        downs = [(parse_time(a), parse_time(b)) for a, b in flap["link_downs"]]
        before, after = start - SECOND, end
        if not _same_boot(fleet, node, before, after):
            continue
        old, new = (
            _port(fleet, node, flap["device"], before),
            _port(fleet, node, flap["device"], after),
        )
        assert (old.state, old.phys_state, old.rate_gbps) == ("ACTIVE", "LinkUp", 400.0)
        first_down = downs[0][0] + (downs[0][1] - downs[0][0]) / 2
        down = _port(fleet, node, flap["device"], first_down)
        assert (down.state, down.state_code, down.phys_state, down.phys_state_code) == (
            "DOWN",
            1,
            "Polling",
            2,
        )
        assert (new.state, new.phys_state) == ("ACTIVE", "LinkUp")
        assert _counter(new, "link_downed") - _counter(old, "link_downed") == len(downs)
        recovered = _counter(new, "link_error_recovery") - _counter(old, "link_error_recovery")
        assert len(downs) <= recovered <= 3 * len(downs)
        assert fleet.step_slowdown(node, first_down) >= fleet.link_slowdown(node, first_down)
        checked += 1
    assert checked >= 10


def test_a_degrading_link_climbs_in_symbol_errors_narrows_and_is_reseated(
    fleet: SimFleet, truth: dict[str, Any]
) -> None:
    climbed = narrowed = reseated = 0
    for node, degrade in _faults(truth, "degrade"):
        device = degrade["device"]
        start, end = parse_time(degrade["start"]), parse_time(degrade["end"])
        span = end - start
        if not _same_boot(fleet, node, start, end + 10 * MINUTE):
            continue

        def errors(t: datetime, node: str = node, device: str = device) -> int:
            return _counter(_port(fleet, node, device, t), "symbol_error")

        first = errors(start + span / 10) - errors(start)
        last = errors(end - SECOND) - errors(end - SECOND - span / 10)
        if errors(end - SECOND) < 2**16 - 1:  # a 16-bit counter that saturated stops counting
            assert last > first and last >= 20
            climbed += 1
        if degrade["downshift"] is not None:
            shift = parse_time(degrade["downshift"])
            assert _port(fleet, node, device, shift - SECOND).rate_gbps == 400.0
            narrow = _port(fleet, node, device, shift + SECOND)
            assert (narrow.rate_gbps, narrow.link_width, narrow.state) == (200.0, 2, "ACTIVE")
            narrowed += 1
        if not degrade["then_dead"]:
            reseat_end = parse_time(degrade["link_downs"][0][1])
            back = _port(fleet, node, device, reseat_end + SECOND)
            assert (back.state, back.rate_gbps, back.link_width) == ("ACTIVE", 400.0, 4)
            before = _port(fleet, node, device, end - SECOND)
            assert _counter(back, "link_downed") == _counter(before, "link_downed") + 1
            reseated += 1
    assert climbed >= 5 and narrowed >= 3 and reseated >= 3


def test_a_dead_link_stays_down_and_carries_nothing(fleet: SimFleet, truth: dict[str, Any]) -> None:
    checked = 0
    for node, dead in _faults(truth, "dead"):
        start = parse_time(dead["start"])
        if start > fleet.spec.end - 2 * HOUR:
            continue
        soon, later = start + MINUTE, start + HOUR
        port = _port(fleet, node, dead["device"], soon)
        assert (port.state, port.phys_state, port.rate_gbps) == ("DOWN", "Polling", 40.0)
        assert _port(fleet, node, dead["device"], fleet.spec.end).state == "DOWN"
        if _same_boot(fleet, node, soon, later):
            sent = _counter(_port(fleet, node, dead["device"], later), "port_xmit_data")
            assert sent == _counter(port, "port_xmit_data")
        checked += 1
    assert checked >= 3


def test_a_degrading_link_slows_its_nodes_steps(
    make_spec: Callable[..., FleetSpec], fleet: SimFleet, truth: dict[str, Any]
) -> None:
    quiet = SimFleet(make_spec(network=QUIET_LINKS))
    slower = 0
    for node, degrade in _faults(truth, "degrade"):
        start, end = parse_time(degrade["start"]), parse_time(degrade["end"])
        late = start + (end - start) * 0.95
        timeline, _ = fleet.node_state(node)
        if not timeline.jobs.busy[timeline.jobs.segment(fleet.seconds(late))]:
            assert fleet.link_slowdown(node, late) == 1.0  # no job: no steps to slow
            continue
        without, with_fault = quiet.step_slowdown(node, late), fleet.step_slowdown(node, late)
        assert quiet.link_slowdown(node, late) == 1.0
        # At 95 % of the ramp the degradation costs most of its slowdown, or all after a downshift.
        assert with_fault >= without * (1 + (degrade["slowdown"] - 1) * 0.7) - 1e-9
        assert with_fault > without
        slower += 1
    assert slower >= 5


def _job_steps(
    fleet: SimFleet, nodes: list[str], start: datetime, windows: int, seed: int = 3
) -> list[list[StepRow]]:
    """A job across ``nodes``: 2 ranks a node, a step every 0.5 s of 100 ms times the node's
    slowdown (1 % noise), cut into 10 s windows."""
    rng = np.random.default_rng(seed)
    out = []
    for w in range(windows):
        rows = []
        for n, node in enumerate(nodes):
            for j in range(20):
                ts = start + timedelta(seconds=10 * w + 0.5 * j)
                slow = fleet.step_slowdown(node, ts)
                for rank in (2 * n, 2 * n + 1):
                    ms = 100.0 * slow * (1 + 0.01 * rng.standard_normal())
                    rows.append(StepRow(rank=rank, node=node, duration_ms=ms, ts=ts))
        out.append(rows)
    return out


def test_the_straggler_detector_sees_a_node_whose_link_narrowed(
    fleet: SimFleet, truth: dict[str, Any]
) -> None:
    node, degrade = next(
        (name, f)
        for name, f in _faults(truth, "degrade")
        if f["downshift"] is not None and f["slowdown"] >= 1.35
    )
    shift = parse_time(degrade["downshift"])
    start = shift - 100 * SECOND  # ten windows before the link narrowed, then five after
    span = [start, start + 150 * SECOND]
    # Before the downshift the rising error rate costs little, well under the detector's ratio.
    before, after = (fleet.step_slowdown(node, t) for t in span)
    assert before < 1.1 and after == pytest.approx(degrade["slowdown"])
    peers = [
        n
        for n in fleet.node_names()
        if n != node and {fleet.step_slowdown(n, t) for t in span} == {1.0}
    ][:7]
    assert len(peers) == 7
    config = DetectorConfig()
    detector = JobDetector(config)
    opened = []
    for w, rows in enumerate(_job_steps(fleet, [node, *peers], start, 15)):
        begin = start + timedelta(seconds=10 * w)
        result = judge_window(rows, begin, begin + config.width, ratio=config.ratio)
        opened += [t for t in detector.feed(result) if t.action == "open"]
    assert [(t.node, t.kind) for t in opened] == [(node, "hardware")]
    assert opened[0].ratio == pytest.approx(degrade["slowdown"], rel=0.05)


def test_port_fields_are_those_a_real_port_has(fleet: SimFleet, truth: dict[str, Any]) -> None:
    roce = next(n["name"] for n in truth["nodes"] if n["network"] == "RoCE")
    ib = next(n["name"] for n in truth["nodes"] if n["network"] == "InfiniBand")
    t = fleet.spec.start + timedelta(days=3)
    ib_ports, roce_ports = fleet.ports(ib, t), fleet.ports(roce, t)
    assert [p.device for p in ib_ports] == [f"mlx5_{i}" for i in range(8)]
    assert {(p.port, p.link_layer) for p in ib_ports} == {(1, "InfiniBand")}
    assert {(p.port, p.link_layer) for p in roce_ports} == {(1, "Ethernet")}
    for port in ib_ports:
        assert port.hw_counters is not None
        assert not any(name.startswith("roce_") for name in port.hw_counters)
        assert port.netdev is not None and port.netdev.startswith("ib")
    for port in roce_ports:
        assert port.hw_counters is not None and "roce_adp_retrans" in port.hw_counters
        assert "local_ack_timeout_err" in port.hw_counters


def test_port_counter_names_are_those_of_a_real_connectx_port(
    fleet: SimFleet, tmp_path: Any
) -> None:
    if not FIXTURES_DIR.is_dir():
        pytest.skip(f"shared fixtures not found at {FIXTURES_DIR}")
    real = unpack_tar(FIXTURES_DIR / H100_TAR, tmp_path) / H100_TREE / "mlx5_0" / "ports" / "1"
    counters = {p.name for p in (real / "counters").iterdir()}
    hw_counters = {p.name for p in (real / "hw_counters").iterdir()} - {"lifespan"}
    t = fleet.spec.start + timedelta(days=3)
    for node in fleet.node_names():
        for port in fleet.ports(node, t):
            assert port.counters is not None and port.hw_counters is not None
            assert set(port.counters) == counters
            assert set(port.hw_counters) <= hw_counters


def test_a_fleet_without_ports_sends_none(make_spec: Callable[..., FleetSpec]) -> None:
    fleet = SimFleet(make_spec(nodes=2, network=NetworkSpec(ports_per_node=0)))
    assert fleet.ports("sim-node-000", fleet.spec.start + HOUR) == []
    assert fleet.step_slowdown("sim-node-000", fleet.spec.start + HOUR) >= 1.0


def test_network_spec_says_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="at least 1.0"):
        NetworkSpec(flap_slowdown=(0.5, 2.0))
    with pytest.raises(ValueError, match="traffic_share"):
        NetworkSpec(traffic_share=(0.5, 1.5))
    with pytest.raises(ValueError, match="flap_downs"):
        NetworkSpec(flap_downs=(0, 3))
