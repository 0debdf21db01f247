"""`fleetwatch parse` (the operator's contract) and `fleetwatch agent --once --dry-run`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetwatch.cli import main

XID_KEYS = {"kind", "xid", "pci_bus_id", "ts", "message", "pid", "process"}


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def _lines(output: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in output.splitlines() if line.strip()]


def test_parse_xid_prints_one_object_per_xid_line_in_order(
    runner: CliRunner, tmp_path: Path
) -> None:
    log = tmp_path / "dmesg.txt"
    log.write_text(
        "[    1.0] unrelated line\n"
        "[ 2.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, "
        "GPU has fallen off the bus.\n"
        "2024-11-15T12:02:03,470068+00:00 NVRM: Xid (PCI:0000:19:00): 48, pid='<unknown>', "
        "name=<unknown>, An uncorrectable double bit error (DBE) has been detected.\n"
    )
    result = runner.invoke(main, ["parse", "xid", str(log)])
    assert result.exit_code == 0, result.output
    events = _lines(result.stdout)
    assert [set(e) for e in events] == [XID_KEYS, XID_KEYS]
    first, second = events
    assert (first["xid"], first["pci_bus_id"], first["pid"], first["process"]) == (
        79,
        "0000:3b:00.0",
        1234,
        "python",
    )
    assert first["ts"] is None  # a monotonic stamp has no date
    assert (second["xid"], second["ts"], second["pid"]) == (48, "2024-11-15T12:02:03.470068Z", None)


def test_parse_xid_reports_bad_lines_on_stderr_and_exits_1_keeping_good_ones(
    runner: CliRunner, tmp_path: Path
) -> None:
    log = tmp_path / "dmesg.txt"
    log.write_text(
        "NVRM: Xid (PCI:0000:3b:00): 13, pid=7, name=train, Graphics Exception\n"
        "NVRM: Xid (PCI:0000:3b:00): \n"
    )
    result = runner.invoke(main, ["parse", "xid", str(log)])
    assert result.exit_code == 1
    assert [e["xid"] for e in _lines(result.stdout)] == [13]
    assert "line 2" in result.stderr


def test_parse_nvidia_smi_and_dcgm_emit_canonical_fields(
    runner: CliRunner, shared_dir: Path
) -> None:
    xml = shared_dir / "fixtures/nvidia_smi/xml/telegraf__a100-sxm4-v12.xml"
    result = runner.invoke(main, ["parse", "nvidia-smi", str(xml)])
    assert result.exit_code == 0, result.output
    (gpu,) = _lines(result.stdout)
    assert str(gpu["uuid"]).startswith("GPU-") and "gpu_temp_c" in gpu and "index" in gpu
    prom = shared_dir / "fixtures/dcgm_exporter/metrics/nvidia-docs_A100_MIG_ub20-a100-k8s.prom"
    result = runner.invoke(main, ["parse", "dcgm", str(prom)])
    assert result.exit_code == 0, result.output
    assert all("uuid" in g for g in _lines(result.stdout))


def test_parse_garbage_exits_1_with_a_clear_message(runner: CliRunner, tmp_path: Path) -> None:
    bad = tmp_path / "bad.xml"
    bad.write_text("<nvidia_smi_log><gpu>")
    result = runner.invoke(main, ["parse", "nvidia-smi", str(bad)])
    assert result.exit_code == 1
    assert "line" in result.stderr and "Traceback" not in result.output


def test_agent_dry_run_prints_the_batch_it_would_send(
    runner: CliRunner, shared_dir: Path, tmp_path: Path
) -> None:
    xml = shared_dir / "fixtures/nvidia_smi/xml/telegraf__a10g.xml"
    result = runner.invoke(
        main,
        [
            "agent",
            "--once",
            "--dry-run",
            "--collectors",
            "nvidia-smi",
            "--nvidia-smi",
            str(xml),
            "--node-name",
            "gpu-node-1",
            "--label",
            "rack=r1",
            "--spool-dir",
            str(tmp_path / "s"),
        ],
    )
    assert result.exit_code == 0, result.output
    batch = json.loads(result.stdout)
    assert batch["node"]["name"] == "gpu-node-1" and batch["node"]["labels"] == {"rack": "r1"}
    assert len(batch["gpus"]) == len(batch["samples"]) == 1
    assert batch["samples"][0]["uuid"] == batch["gpus"][0]["uuid"]
    assert all(v is not None for v in batch["samples"][0].values())  # absent, never null
    assert not (tmp_path / "s").exists()  # a dry run writes nothing


def test_agent_without_token_exits_with_a_config_error(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(
        main,
        ["agent", "--once", "--collectors", "nvidia-smi", "--spool-dir", str(tmp_path)],
        env={"FLEETWATCH_AGENT_TOKEN": ""},
    )
    assert result.exit_code == 2
    assert "no token" in result.output


def test_agent_unknown_collector_is_a_config_error(runner: CliRunner) -> None:
    result = runner.invoke(main, ["agent", "--once", "--dry-run", "--collectors", "nvml,gpud"])
    assert result.exit_code == 2
    assert "unknown collector" in result.output and "gpud" in result.output


def test_agent_push_interval_comes_from_the_flag_or_the_environment(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetwatch.agent.factory import build_agent
    from fleetwatch.config import load_agent_settings

    result = runner.invoke(main, ["agent", "--once", "--dry-run", "--push-interval", "-1"])
    assert result.exit_code == 2 and "push_interval_s" in result.output
    assert load_agent_settings().push_interval_s == 60.0
    monkeypatch.setenv("FLEETWATCH_AGENT_PUSH_INTERVAL_S", "30")
    settings = load_agent_settings(token="t", spool_dir=tmp_path, collectors=["nvidia-smi"])
    assert settings.push_interval_s == 30.0
    agent = build_agent(settings, collectors=[])
    assert agent.ticks_per_push == 3
    assert agent.node_info().push_interval_s == 30.0
    assert agent.node_info().interval_s == 10.0  # the collection interval, as before
