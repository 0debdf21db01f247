"""``fleetwatch sim init`` and ``fleetwatch sim emit``, invoked through click's CliRunner."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from click.testing import CliRunner

from fleetwatch.agent.parsers.dcgm_exporter import parse_dcgm_exporter
from fleetwatch.cli.sim_cmd import sim
from fleetwatch.sim import FleetSpec, SimFleet


def test_sim_init_writes_spec_and_ground_truth(tmp_path: Path) -> None:
    out = tmp_path / "fleet"
    args = ["init", "--nodes", "4", "--gpus", "2", "--seed", "5", "--speed", "3600"]
    result = CliRunner().invoke(sim, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "4 nodes x 2 GPUs, seed 5" in result.output
    spec = FleetSpec.load(out / "fleet.json")
    assert (spec.nodes, spec.gpus_per_node, spec.seed, spec.speed) == (4, 2, 5, 3600.0)
    assert spec.start < spec.real_start  # simulated time starts in the past
    truth = json.loads((out / "ground_truth.json").read_text())
    assert truth == SimFleet(spec).ground_truth()
    with (out / "ground_truth_lifetimes.csv").open(newline="") as handle:
        assert len(list(csv.DictReader(handle))) == 8


def test_sim_init_takes_a_start_and_a_failure_rate(tmp_path: Path) -> None:
    args = ["init", "--nodes", "2", "--start", "2026-01-01T00:00:00Z"]
    args += ["--monthly-failure-prob", "0.05", "--out", str(tmp_path)]
    result = CliRunner().invoke(sim, args)
    assert result.exit_code == 0, result.output
    spec = FleetSpec.load(tmp_path / "fleet.json")
    assert spec.start.isoformat() == "2026-01-01T00:00:00+00:00"
    assert spec.failures.monthly_failure_prob == 0.05


def test_sim_init_refuses_bad_input(tmp_path: Path) -> None:
    runner = CliRunner()
    naive = runner.invoke(sim, ["init", "--start", "2026-01-01", "--out", str(tmp_path)])
    assert naive.exit_code == 2 and "time zone" in naive.output
    zero = runner.invoke(sim, ["init", "--speed", "0", "--out", str(tmp_path)])
    assert zero.exit_code == 2


def test_sim_emit_writes_files_real_collectors_read(tmp_path: Path) -> None:
    runner = CliRunner()
    init = ["init", "--nodes", "3", "--gpus", "4", "--speed", "60", "--out", str(tmp_path)]
    assert runner.invoke(sim, init).exit_code == 0
    spec_path = str(tmp_path / "fleet.json")
    emit = ["emit", "--spec", spec_path, "--out", str(tmp_path / "out"), "--duration", "0"]
    result = runner.invoke(sim, [*emit, "--from-start"])
    assert result.exit_code == 0, result.output
    assert "wrote 1 tick(s) for 3 node(s)" in result.output
    for node in ("sim-node-000", "sim-node-001", "sim-node-002"):
        prom = tmp_path / "out" / node / "dcgm.prom"
        if prom.exists():
            assert len(parse_dcgm_exporter(prom.read_text())) <= 4
        assert (tmp_path / "out" / node / "kern.log").exists()


def test_sim_emit_refuses_unknown_nodes_and_bad_specs(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(sim, ["init", "--nodes", "1", "--out", str(tmp_path)]).exit_code == 0
    emit = ["emit", "--out", str(tmp_path / "out"), "--duration", "0"]
    unknown = runner.invoke(
        sim, [*emit, "--spec", str(tmp_path / "fleet.json"), "--node", "gpu-node-9"]
    )
    assert unknown.exit_code == 2 and "gpu-node-9" in unknown.output
    (tmp_path / "bad.json").write_text('{"seed": "x"}')
    bad = runner.invoke(sim, [*emit, "--spec", str(tmp_path / "bad.json")])
    assert bad.exit_code == 2 and "not a fleet spec" in bad.output
