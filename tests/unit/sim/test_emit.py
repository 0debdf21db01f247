"""The emitters' text reads back through OUR real parsers as the same readings and events."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fleetwatch.agent.parsers.dcgm_exporter import parse_dcgm_scrape
from fleetwatch.agent.parsers.infiniband_sysfs import read_infiniband_tree
from fleetwatch.agent.parsers.kernel_log import parse_kernel_log
from fleetwatch.sim import SimFleet, dcgm_exporter_text, kernel_log_lines, run_emitter
from fleetwatch.sim.emit import INFINIBAND_DIR, write_node_files
from fleetwatch.sim.sysfs import write_infiniband_tree
from fleetwatch.sim.truth import parse_time
from fleetwatch.telemetry import PortSample

SECOND = timedelta(seconds=1)


def _moments(fleet: SimFleet, truth: dict[str, Any]) -> Iterator[tuple[str, datetime]]:
    """Ordinary times, and the interesting ones: mid-straggler, just after a failure, a reboot."""
    spec = fleet.spec
    for node in fleet.node_names():
        for days in (0.01, 91.3, 250.7):
            yield node, spec.start + timedelta(days=days)
    for node in truth["nodes"][:4]:
        for window in node["straggler_windows"][:2]:
            start, end = parse_time(window["start"]), parse_time(window["end"])
            yield node["name"], start + (end - start) / 2
        for boot in node["boots"][1:3]:
            yield node["name"], parse_time(boot["start"]) + SECOND
    for gpu in truth["gpus"]:
        if gpu["failure_time"] is not None:
            yield gpu["node"], parse_time(gpu["failure_time"]) + SECOND


def test_dcgm_exporter_text_round_trips_through_the_real_parser(
    fleet: SimFleet, truth: dict[str, Any]
) -> None:
    checked = 0
    for node, t in _moments(fleet, truth):
        scrape = parse_dcgm_scrape(dcgm_exporter_text(fleet, node, t))
        samples = {sample.uuid: sample for sample in fleet.sample(node, t)}
        identities = {gpu.uuid: gpu for gpu in fleet.identities(node)}
        assert [r.identity["uuid"] for r in scrape.readings] == list(samples)
        assert scrape.ignored_metrics == frozenset()
        for reading in scrape.readings:
            uuid = reading.identity["uuid"]
            assert reading.identity == identities[uuid].model_dump(exclude_none=True)
            assert reading.values == samples[uuid].values()
            # Same types too: a counter read back as float would be refused at ingest.
            assert {k: type(v) for k, v in reading.values.items()} == {
                k: type(v) for k, v in samples[uuid].values().items()
            }
        assert scrape.last_xid == {
            uuid: code for uuid, code in fleet.last_xid(node, t).items() if uuid in samples
        }
        checked += 1
    assert checked > 60


def test_dcgm_exporter_text_looks_like_the_exporter(fleet: SimFleet) -> None:
    node = fleet.node_names()[0]
    text = dcgm_exporter_text(fleet, node, fleet.spec.start + timedelta(days=3))
    lines = text.splitlines()
    assert "# TYPE DCGM_FI_DEV_GPU_TEMP gauge" in lines
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in lines
    assert any(line.startswith("# HELP DCGM_FI_DEV_ECC_SBE_VOL_TOTAL ") for line in lines)
    series = next(line for line in lines if line.startswith("DCGM_FI_DEV_GPU_TEMP{"))
    for label in (
        'gpu="0"',
        'UUID="GPU-',
        'pci_bus_id="00000000:18:00.0"',
        'device="nvidia0"',
        'modelName="NVIDIA ',
        f'Hostname="{node}"',
        "DCGM_FI_DRIVER_VERSION=",
    ):
        assert label in series
    assert "DCGM_FI_DEV_FAN_SPEED" not in text  # absent, not 0


def test_a_failed_gpu_is_missing_from_the_scrape(fleet: SimFleet, truth: dict[str, Any]) -> None:
    gpu = next(g for g in truth["gpus"] if g["failure_time"] is not None)
    at = parse_time(gpu["failure_time"])
    before = dcgm_exporter_text(fleet, gpu["node"], at - SECOND)
    after = dcgm_exporter_text(fleet, gpu["node"], at + SECOND)
    assert gpu["uuid"] in before and gpu["uuid"] not in after


def test_kernel_log_round_trips_through_the_real_parser(fleet: SimFleet) -> None:
    spec = fleet.spec
    since, until = spec.start - timedelta(days=30), spec.end + timedelta(days=1)
    for node in fleet.node_names():
        lines = kernel_log_lines(fleet, node, since, until)
        parsed = parse_kernel_log("\n".join(lines))
        assert parsed.errors == []
        expected = fleet.events(node, since, until)
        assert len(parsed.events) == len(expected) and expected
        for got, want in zip(parsed.events, expected, strict=True):
            assert (
                got.kind,
                got.xid,
                got.pci_bus_id,
                got.ts,
                got.pid,
                got.process,
                got.message,
            ) == (
                want.kind,
                want.xid,
                want.pci_bus_id,
                want.ts,
                want.pid,
                want.process,
                want.message,
            )


def test_kernel_log_prints_real_driver_lines(fleet: SimFleet, truth: dict[str, Any]) -> None:
    gpu = next(g for g in truth["gpus"] if g["cause_xid"] == 79)
    at = parse_time(gpu["failure_time"])
    lines = kernel_log_lines(fleet, gpu["node"], at - SECOND, at)
    bus = gpu["pci_bus_id"].rsplit(".", 1)[0]
    stamp = at.strftime("%Y-%m-%dT%H:%M:%S,%f+00:00")
    assert f"{stamp} NVRM: Xid (PCI:{bus}): 79, pid='<unknown>', name=<unknown>, " in lines[0]
    assert lines[-1] == f"{stamp} NVRM: GPU {gpu['pci_bus_id']}: GPU has fallen off the bus."
    app = next(
        line
        for line in kernel_log_lines(fleet, gpu["node"], fleet.spec.start, fleet.spec.end)
        if "): 13, pid=" in line
    )
    assert "name=" in app and "<unknown>" not in app


def test_write_node_files_replaces_the_scrape_and_appends_the_log(
    fleet: SimFleet, truth: dict[str, Any], tmp_path: Path
) -> None:
    node = truth["nodes"][0]
    name = node["name"]
    t0 = fleet.spec.start
    t1 = t0 + timedelta(days=2)
    t2 = t1 + timedelta(days=2)
    first = write_node_files(fleet, name, tmp_path, t0, t1)
    second = write_node_files(fleet, name, tmp_path, t1, t2)
    assert (tmp_path / name / "dcgm.prom").read_text() == dcgm_exporter_text(fleet, name, t2)
    log = (tmp_path / name / "kern.log").read_text().splitlines()
    assert len(log) == first + second
    assert log == kernel_log_lines(fleet, name, t0, t2)
    assert not list((tmp_path / name).glob(".*.tmp"))

    window = next(w for w in node["silent_windows"] if w["reason"] == "outage")
    start, end = parse_time(window["start"]), parse_time(window["end"])
    write_node_files(fleet, name, tmp_path, t2, start + (end - start) / 2)
    assert not (tmp_path / name / "dcgm.prom").exists()  # an exporter that cannot be reached


class _FakeClock:
    def __init__(self, start: datetime) -> None:
        self.now = start
        self.slept: list[float] = []

    def __call__(self) -> datetime:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += timedelta(seconds=seconds)


def test_run_emitter_writes_each_interval_for_its_duration(fleet: SimFleet, tmp_path: Path) -> None:
    spec = fleet.spec
    clock = _FakeClock(spec.real_start + timedelta(hours=2))
    nodes = fleet.node_names()[:2]
    ticks = run_emitter(
        fleet,
        tmp_path,
        interval_s=30.0,
        duration_s=90.0,
        nodes=nodes,
        from_start=True,
        clock=clock,
        sleep=clock.sleep,
    )
    assert ticks == 4 and clock.slept == [30.0, 30.0, 30.0]
    end = fleet.sim_time(clock.now)
    for node in nodes:
        log = (tmp_path / node / "kern.log").read_text().splitlines()
        assert log == kernel_log_lines(fleet, node, spec.start - timedelta(microseconds=1), end)
        assert (tmp_path / node / "dcgm.prom").exists() != fleet.is_silent(node, end)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(nodes)


def test_run_emitter_refuses_unknown_nodes(fleet: SimFleet, tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="no-such-node"):
        run_emitter(fleet, tmp_path, interval_s=1.0, duration_s=0, nodes=["no-such-node"])


def test_the_infiniband_tree_reads_back_through_the_real_sysfs_parser(
    fleet: SimFleet, truth: dict[str, Any], tmp_path: Path
) -> None:
    flap_node, flap = next((n["name"], f) for n in truth["nodes"] for f in n["link_faults"]
                           if f["kind"] == "flap")  # fmt: skip
    down_at = parse_time(flap["link_downs"][0][0]) + SECOND
    moments = [*list(_moments(fleet, truth))[:40], (flap_node, down_at)]
    states = set()
    for k, (node, t) in enumerate(moments):
        root = tmp_path / str(k)
        write_infiniband_tree(fleet, node, root, t)
        tree = read_infiniband_tree(root)
        assert tree.problems == []
        read = [
            PortSample(device=p.device, port=p.port, ts=t, counters=p.counters,
                       hw_counters=p.hw_counters, **p.values)
            for p in tree.ports
        ]  # fmt: skip
        assert read == fleet.ports(node, t)
        states |= {p.state for p in read}
    assert states == {"ACTIVE", "DOWN"}


def test_the_emitter_refreshes_each_nodes_ports(fleet: SimFleet, tmp_path: Path) -> None:
    node = fleet.node_names()[1]
    t0 = fleet.spec.start + timedelta(days=20)
    sent = []
    for t in (t0, t0 + timedelta(minutes=10)):
        write_node_files(fleet, node, tmp_path, t - timedelta(minutes=10), t)
        tree = read_infiniband_tree(tmp_path / node / INFINIBAND_DIR)
        assert len(tree.ports) == 8
        assert tree.ports[0].counters is not None
        sent.append(tree.ports[0].counters["port_xmit_data"])
    assert sent[1] >= sent[0]


def test_the_tree_writes_only_what_changed(fleet: SimFleet, tmp_path: Path) -> None:
    node, t = fleet.node_names()[2], fleet.spec.start + timedelta(days=30)
    written: dict[str, str] = {}
    first = write_infiniband_tree(fleet, node, tmp_path, t, written=written)
    assert first == len(written) > 8 * 40
    assert write_infiniband_tree(fleet, node, tmp_path, t, written=written) == 0
    later = write_infiniband_tree(fleet, node, tmp_path, t + timedelta(minutes=5), written=written)
    assert 0 < later < first / 2
    read = read_infiniband_tree(tmp_path)
    assert [p.counters for p in read.ports] == [
        p.counters for p in fleet.ports(node, t + timedelta(minutes=5))
    ]
