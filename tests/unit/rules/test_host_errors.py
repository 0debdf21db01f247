"""The host-error rules (rules.host_errors) on events parsed from real kernel-log captures.

Every input is read with the agent's own parsers from ``tests/fixtures/kernel_log_captures`` or
``../shared/fixtures`` (nvswitch_fabric, host_hw_errors); repeats are copies of a real record
moved in time, so the thresholds are tested on records as the kernel prints them.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fleetwatch.agent.parsers import KernelEvent
from fleetwatch.agent.parsers.kernel_events import parse_kernel_events
from fleetwatch.rules.host_errors import HostVerdict, is_urgent_host_event, judge_host_errors
from fleetwatch.rules.thresholds import HealthThresholds

CAPTURES = Path(__file__).resolve().parents[2] / "fixtures" / "kernel_log_captures"
SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "fixtures"
NOW = datetime(2024, 7, 24, 12, 0, tzinfo=UTC)
YEAR = timedelta(days=3650)  # a lookback that keeps every dated capture


def _read(path: Path) -> list[KernelEvent]:
    if not path.is_file():
        pytest.skip(f"fixture not found: {path}")
    result = parse_kernel_events(path.read_text(errors="replace"), year_hint=2024)
    return result.events


def _shared(name: str) -> list[KernelEvent]:
    return _read(SHARED / name)


def _capture(name: str) -> list[KernelEvent]:
    return _read(CAPTURES / name)


def _judge(evs: list[KernelEvent], **kw: object) -> list[HostVerdict]:
    kw.setdefault("gpus", {})
    kw.setdefault("lookback", YEAR)
    return judge_host_errors(evs, now=NOW, **kw)  # type: ignore[arg-type]


def _copies(event: KernelEvent, n: int, every: timedelta) -> list[KernelEvent]:
    """``n`` copies of one real record, ``every`` apart, ending at NOW."""
    return [dataclasses.replace(event, ts=NOW - every * (n - 1 - i)) for i in range(n)]


def _rules(verdicts: list[HostVerdict]) -> list[str]:
    return [v.rule for v in verdicts]


def test_fatal_sxids_on_three_switches_drain_the_node_naming_sxid_and_links() -> None:
    evs = _shared("nvswitch_fabric/gpud__dmesg_Xid79-with-SXid20034-LTSSM-multi-switch.log")
    verdicts = _judge(evs)
    assert _rules(verdicts) == ["sxid_fatal"] * 3  # one per NVSwitch, the Xid 79 is not theirs
    by_switch = {v.evidence["switch"]: v for v in verdicts}
    assert set(by_switch) == {"0000:05:00.0", "0000:06:00.0", "0000:07:00.0"}
    v = by_switch["0000:05:00.0"]
    assert (v.scope, v.component, v.severity, v.action) == (
        "node",
        "nvlink",
        "fatal",
        "reboot_node",
    )
    assert not v.counts_against_gpu  # the switch failed, not a GPU
    assert v.evidence["sxids"] == [20034]
    assert v.evidence["sxid_names"] == {"20034": "LTSSM Fault Up"}
    assert v.evidence["links"] == [63, 62] and v.evidence["switches"] == ["nvidia-nvswitch0"]
    assert v.count == 2 and "Fabric Manager" in v.source


def test_fabric_manager_log_fatal_sxid_drains_and_its_non_fatal_one_alone_does_not() -> None:
    evs = _shared(
        "nvswitch_fabric/gpud__fabricmanager-log_ERROR-lines_SXid20034-12028-multicast.log"
    )
    [v] = _judge(evs)
    assert v.rule == "sxid_fatal" and v.evidence["sxids"] == [20034] and v.evidence["links"] == [33]
    non_fatal = [e for e in evs if (e.details or {}).get("severity") == "non_fatal"]
    assert _judge(non_fatal) == []


@pytest.mark.parametrize(("n", "every", "fires"), [(5, 3600, True), (4, 3600, False),
                                                   (5, 7 * 3600, False)])  # fmt: skip
def test_non_fatal_sxid_repeated_on_one_switch_within_a_day_asks_for_investigation(
    n: int, every: int, fires: bool
) -> None:
    evs = _shared(
        "nvswitch_fabric/gpud__fabricmanager-log_ERROR-lines_SXid20034-12028-multicast.log"
    )
    [non_fatal] = [e for e in evs if (e.details or {}).get("sxid") == 12028]
    verdicts = _judge(_copies(non_fatal, n, timedelta(seconds=every)))
    if not fires:  # 4 in 4 h is under the limit; 5 over 28 h never has 5 within 24 h
        assert verdicts == []
        return
    [v] = verdicts
    assert (v.rule, v.severity, v.action, v.count) == ("sxid_repeat", "warning", "investigate", 5)
    assert v.evidence["links"] == [61] and v.evidence["limit"] == 5
    assert "NVSentinel" in v.source


AER_FATAL = "lkml-2024-01-11_aer-corrected-nonfatalerr_fatal-tlp-malftlp.log"


def test_uncorrected_aer_on_a_gpu_drains_and_resets_that_gpu() -> None:
    evs = _capture(AER_FATAL)
    gpus = {"0000:b7:02.0": "GPU-11111111-2222-3333-4444-555555555555"}
    [v] = _judge(evs, gpus=gpus)
    assert (v.rule, v.scope, v.gpu, v.uuid) == (
        "aer_gpu_uncorrected", "gpu", "0000:b7:02.0", gpus["0000:b7:02.0"]
    )  # fmt: skip
    assert (v.severity, v.action, v.counts_against_gpu) == ("fatal", "drain_reset", True)
    assert v.evidence["errors"] == ["TLP", "MalfTLP"]  # the corrected record before it: no verdict


def test_uncorrected_aer_off_the_gpus_only_asks_for_investigation() -> None:
    evs = _capture("lkml-2022-03-14_aer-corrected-rxerr_dpc-fatal-sdes_icelake.log")
    [v] = _judge(evs, gpus={"0000:18:00.0": "GPU-x"})
    assert (v.rule, v.scope, v.severity, v.action) == (
        "aer_uncorrected", "node", "warning", "investigate"
    )  # fmt: skip
    assert v.evidence["device"] == "0000:89:02.0" and v.evidence["errors"] == ["SDES"]


@pytest.mark.parametrize(("n", "fires"), [(16, True), (15, False)])
def test_corrected_aer_warns_only_at_the_replay_rate(n: int, fires: bool) -> None:
    evs = _capture(AER_FATAL)
    [corrected] = [e for e in evs if (e.details or {}).get("severity") == "corrected"]
    gpus = {"0000:b7:02.0": "GPU-x"}
    verdicts = _judge(_copies(corrected, n, timedelta(seconds=3)), gpus=gpus)  # 45-48 s span
    assert _rules(verdicts) == (["aer_corrected_burst"] if fires else [])
    if fires:
        assert verdicts[0].severity == "warning" and verdicts[0].scope == "gpu"
        assert verdicts[0].evidence["errors"] == ["NonFatalErr"]
    # The same records spread over ten minutes are the background rate: no verdict.
    assert _judge(_copies(corrected, n, timedelta(seconds=40)), gpus=gpus) == []


def test_fatal_machine_check_drains_the_node_for_inspection() -> None:
    [v] = _judge(_capture("lkml-2025-11-07_mce-exception-pcc-panic_indented.log"))
    assert (v.rule, v.scope, v.component) == ("mce_uncorrected", "node", "host")
    assert (v.severity, v.action) == ("fatal", "drain_inspect")
    assert v.evidence["panic"] == ["Processor context corrupt"] and v.evidence["banks"] == [0]


def test_machine_checks_without_lost_data_make_no_verdict() -> None:
    assert _judge(_capture("amdgfx-2020-03-08_mce-amd-bank5-mail-wrapped.log")) == []
    zen4 = _shared(
        "host_hw_errors/web__dmesg_AMD-Zen4-Ryzen_amd64_edac-banner_plus_MCE-DRAM-ECC-CE_"
        "cannot-decode-address.log"
    )
    assert _judge(zen4) == []  # one corrected DRAM error: under every limit


def test_uncorrected_memory_error_drains_from_edac_and_the_decoded_machine_check() -> None:
    verdicts = _judge(_capture("lkml-2021-08-12_einj-ghes-recoverable_edac-skx-ue_icelake.log"))
    assert sorted(_rules(verdicts)) == ["edac_uncorrected", "mce_uncorrected"]
    edac = next(v for v in verdicts if v.rule == "edac_uncorrected")
    assert (edac.severity, edac.action, edac.component) == ("critical", "drain_inspect", "memory")
    assert edac.count == 2 and edac.evidence["labels"] == ["CPU_SrcID#0_MC#3_Chan#0_DIMM#0"]
    mce = next(v for v in verdicts if v.rule == "mce_uncorrected")
    assert mce.component == "memory" and mce.severity == "critical"


def test_console_with_one_ue_and_nine_ce_drains_once_and_does_not_warn_on_the_ce() -> None:
    evs = _capture("lkml-2023-08-28_edac-ue-ce-console-with-interleaved-firmware-output.log")
    # Independent count from the capture: 1 UE, and CE counts 2+1+1+1+1 on the named DIMM plus
    # 3 on the line the firmware output cut (no label): no DIMM reaches 10 in the day.
    assert sum(e.details["count"] for e in evs if e.details["severity"] == "corrected") == 9
    [v] = _judge(evs)
    assert v.rule == "edac_uncorrected" and v.count == 1


def test_edac_counts_errors_not_lines_per_dimm() -> None:
    evs = _shared(
        "host_hw_errors/web__syslog-rfc3339_GHES-corrected_EDAC-sbridge-CE-OVERFLOW_"
        "soft-offline_Inspur-NF5270M3.log"
    )
    [v] = _judge(evs)  # one line saying 20 CE
    assert (v.rule, v.count, v.severity) == ("edac_ce_repeat", 20, "warning")
    assert v.evidence["dimm"] == "CPU_SrcID#0_Ha#0_Chan#2_DIMM#0"
    assert "mcelog" in v.source
    raised = HealthThresholds.from_mapping({"edac_corrected_limit": 21})
    assert _judge(evs, thresholds=raised) == []


def test_negative_control_boot_log_gives_no_verdict() -> None:
    assert _judge(_capture("gpud_pstore-dmesg_amd-genoa_edac-banner_test-panic.txt")) == []


def test_events_older_than_the_lookback_are_history() -> None:
    evs = _capture(AER_FATAL)
    old = [dataclasses.replace(e, ts=NOW - timedelta(hours=25)) for e in evs]
    assert _judge(old, gpus={"0000:b7:02.0": "GPU-x"}, lookback=timedelta(hours=24)) == []


@pytest.mark.parametrize(
    ("kind", "severity", "urgent"),
    [("sxid", "fatal", True), ("sxid", "non_fatal", False), ("pcie_aer", "fatal", True),
     ("pcie_aer", "non_fatal", True), ("pcie_aer", "corrected", False), ("mce", "fatal", True),
     ("mce", "uncorrected", True), ("mce", "deferred", False), ("edac", "uncorrected", True),
     ("edac", "corrected", False), ("xid", "fatal", False)],
)  # fmt: skip
def test_urgent_host_events_are_the_draining_severities(
    kind: str, severity: str, urgent: bool
) -> None:
    assert is_urgent_host_event(kind, {"severity": severity}) is urgent
    assert not is_urgent_host_event(kind, None)


def test_host_thresholds_cite_their_source_and_refuse_bad_windows() -> None:
    from fleetwatch.rules.thresholds import source_of

    for name in ("sxid_non_fatal_limit", "aer_corrected_limit", "edac_corrected_limit"):
        assert source_of(name)
    with pytest.raises(ValueError, match="aer_corrected_window_s"):
        HealthThresholds.from_mapping({"aer_corrected_window_s": 0})
