"""`fleetwatch parse kernel`: every kernel-log source, one JSON object per event."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetwatch.cli import main

KEYS = {"line", "kind", "ts", "pci_bus_id", "uuid", "xid", "message", "pid", "process", "details"}
CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "kernel_log_captures"
MIXED = (
    "[ 10.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
    "[ 11.0] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up\n"
    "[ 12.0] pcieport 0000:00:01.0: AER: Corrected error received: 0000:3b:00.0\n"
    "[ 12.1] nvidia 0000:3b:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
    "(Receiver ID)\n"
    "[ 12.2] nvidia 0000:3b:00.0:   device [10de:2330] error status/mask=00000001/0000e000\n"
    "[ 12.3] nvidia 0000:3b:00.0:    [ 0] RxErr\n"
    "[ 13.0] EDAC MC1: 4 CE memory read error on CPU_SrcID#1_MC#0_Chan#2_DIMM#0 (channel:2)\n"
    "[ 14.0] nvidia-nvswitch0: SXid (PCI:0000:05:0\n"
)


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def _lines(output: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in output.splitlines() if line.strip()]


def test_parse_kernel_prints_every_kind_names_bad_lines_and_exits_0(
    runner: CliRunner, tmp_path: Path
) -> None:
    log = tmp_path / "kern.log"
    log.write_text(MIXED)
    result = runner.invoke(
        main,
        ["parse", "kernel", str(log), "--summary", "--gpu", "00000000:3B:00.0=GPU-aaaa-0001"],
    )

    assert result.exit_code == 0, result.output
    events = _lines(result.stdout)
    assert {frozenset(e) for e in events} == {frozenset(KEYS)}
    assert [(e["line"], e["kind"], e["pci_bus_id"]) for e in events] == [
        (1, "xid", "0000:3b:00.0"),
        (2, "sxid", "0000:06:00.0"),
        (4, "pcie_aer", "0000:3b:00.0"),
        (7, "edac", None),
    ]
    xid, sxid, aer, edac = events
    # --gpu gives the GPU's uuid to every event naming its address, in either spelling
    assert (xid["uuid"], aer["uuid"], sxid["uuid"]) == ("GPU-aaaa-0001", "GPU-aaaa-0001", None)
    assert sxid["details"] == {
        "sxid": 20034,
        "severity": "fatal",
        "severity_from": "line",
        "catalog_class": "fatal",
        "catalog_name": "LTSSM Fault Up",
        "link": 48,
        "error": "LTSSM Fault Up",
        "first": False,
        "switch": "nvidia-nvswitch1",
        "source": "kernel",
    }
    assert aer["details"]["errors"] == ["RxErr"]  # type: ignore[index]
    assert aer["details"]["reported_by"] == "0000:00:01.0"  # type: ignore[index]
    assert edac["details"]["count"] == 4  # type: ignore[index]
    assert result.stderr.splitlines() == [
        "line 8: cannot read the SXid code and PCI id in 'SXid (PCI:0000:05:0'",
        "8 lines, 4 events (edac 1, pcie_aer 1, sxid 1, xid 1), 1 unreadable lines",
    ]


def test_parse_kernel_names_a_line_cut_short_whose_count_it_kept(runner: CliRunner) -> None:
    path = CAPTURES / "lkml-2023-08-28_edac-ue-ce-console-with-interleaved-firmware-output.log"
    result = runner.invoke(main, ["parse", "kernel", str(path)])

    assert result.exit_code == 0
    assert len(_lines(result.stdout)) == 7
    assert result.stderr.splitlines() == [
        "line 8: cut short: kept the edac report (3 error(s)) without its location"
    ]


def test_parse_kernel_fails_only_on_unreadable_input(runner: CliRunner, tmp_path: Path) -> None:
    missing = runner.invoke(main, ["parse", "kernel", str(tmp_path / "missing.log")])
    assert missing.exit_code != 0 and "cannot read" in missing.stderr

    bad_gpu = runner.invoke(main, ["parse", "kernel", str(tmp_path), "--gpu", "nonsense"])
    assert bad_gpu.exit_code == 2 and "--gpu" in bad_gpu.stderr

    empty = tmp_path / "empty.log"
    empty.write_text("")
    assert runner.invoke(main, ["parse", "kernel", str(empty)]).exit_code == 0


def test_parse_kernel_reads_stdin(runner: CliRunner) -> None:
    result = runner.invoke(main, ["parse", "kernel", "-"], input=MIXED)

    assert result.exit_code == 0
    assert [e["kind"] for e in _lines(result.stdout)] == ["xid", "sxid", "pcie_aer", "edac"]


def test_parse_xid_still_prints_xid_lines_only(runner: CliRunner, tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(MIXED.replace("[ 14.0] nvidia-nvswitch0: SXid (PCI:0000:05:0\n", ""))
    result = runner.invoke(main, ["parse", "xid", str(log)])

    assert result.exit_code == 0
    assert [e["kind"] for e in _lines(result.stdout)] == ["xid"]
