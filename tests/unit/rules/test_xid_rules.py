"""History rules of judge_xids on constructed events and on real kernel log lines."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fleetwatch.agent.parsers.kernel_log import parse_kernel_log
from fleetwatch.rules.xid import XidCatalog, XidVerdict, judge_xids, may_take_gpu_out
from fleetwatch.telemetry import Event

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
PCI = "0000:19:00.0"
PCI2 = "0000:3b:00.0"
UUID = "GPU-5e1d2c3b-4a59-6877-8695-a4b3c2d1e0f9"
CATALOG = XidCatalog.load()


def xid(code: int, seconds_ago: float, *, pci: str | None = PCI, **extra: object) -> Event:
    ts = NOW - timedelta(seconds=seconds_ago)
    return Event(kind="xid", xid=code, ts=ts, pci_bus_id=pci, **extra)  # type: ignore[arg-type]


def judge(events: list[Event], **kwargs: object) -> list[XidVerdict]:
    return judge_xids(events, catalog=CATALOG, now=NOW, **kwargs)  # type: ignore[arg-type]


def only(verdicts: list[XidVerdict]) -> XidVerdict:
    assert len(verdicts) == 1, verdicts
    return verdicts[0]


@pytest.mark.parametrize("code", [13, 31])
def test_judge_xids_solo_app_xid_does_not_count(code: int) -> None:
    v = only(judge([xid(code, 60, pid=42, process="python")]))
    assert (v.rule, v.action, v.counts_against_gpu) == (f"xid{code}_app", "restart_app", False)
    assert v.processes == ("python",)


@pytest.mark.parametrize("code", [13, 31])
def test_judge_xids_repeat_on_same_gpu_escalates(code: int) -> None:
    v = only(judge([xid(code, 3600 * 20), xid(code, 3600)]))
    assert (v.rule, v.action, v.counts_against_gpu) == (f"xid{code}_repeat", "investigate", True)
    assert v.count == 2 and len(v.timestamps) == 2


def test_judge_xids_repeat_needs_same_gpu_and_lookback() -> None:
    spread = judge([xid(13, 3600), xid(13, 1800, pci=PCI2)])
    assert [v.rule for v in spread] == ["xid13_app", "xid13_app"]
    old = judge([xid(13, 3600 * 30), xid(13, 60)])  # the first is outside the 24 h lookback
    assert only(old).rule == "xid13_app"


def test_judge_xids_one_burst_of_13_is_not_a_repeat() -> None:
    v = only(judge([xid(13, 60.003), xid(13, 60.002), xid(13, 60.001)]))
    assert (v.rule, v.count) == ("xid13_app", 3)


def test_judge_xids_48_solo_resets_gpu() -> None:
    v = only(judge([xid(48, 30)]))
    assert (v.rule, v.action, v.counts_against_gpu) == ("xid48_solo", "reset_gpu", True)


@pytest.mark.parametrize("remap", [63, 64])
def test_judge_xids_48_with_remap_drains_and_resets(remap: int) -> None:
    v = only(judge([xid(48, 30), xid(remap, 29.9), xid(172, 29.8)]))
    assert (v.rule, v.action, v.severity) == ("xid48_with_remap", "drain_reset", "critical")
    assert v.xids == (48, remap, 172)
    assert v.count == 3


def test_judge_xids_remap_far_from_48_is_separate() -> None:
    verdicts = judge([xid(48, 3000), xid(63, 30)])
    assert [(v.rule, v.xids) for v in verdicts] == [("xid48_solo", (48,)), ("catalog", (63,))]
    assert verdicts[1].action == "none"  # 63 alone: IGNORE per NVIDIA


@pytest.mark.parametrize("primary", [48, 79])
def test_judge_xids_94_95_after_primary_are_follow_ons(primary: int) -> None:
    v = only(judge([xid(primary, 30), xid(94, 29), xid(95, 28), xid(94, 25)]))
    assert v.xids[0] == primary
    assert v.follow_ons == {94: 2, 95: 1}
    assert v.count == 1


def test_judge_xids_94_long_after_or_on_other_gpu_is_own_fault() -> None:
    verdicts = judge([xid(48, 300), xid(95, 100), xid(95, 299, pci=PCI2)])
    rules = sorted((v.gpu, v.xids, v.rule) for v in verdicts)
    assert rules == [
        (PCI, (48,), "xid48_solo"),
        (PCI, (95,), "catalog"),
        (PCI2, (95,), "catalog"),
    ]


def test_judge_xids_45_solo_is_no_action() -> None:
    v = only(judge([xid(45, 30), xid(45, 29)]))
    assert (v.rule, v.action, v.counts_against_gpu, v.count) == ("xid45_solo", "none", False, 2)
    assert "Fabric Manager" in v.note


def test_judge_xids_45_follows_other_xid() -> None:
    v = only(judge([xid(62, 30), xid(45, 29)]))
    assert (v.rule, v.action, v.xids) == ("catalog", "reset_gpu", (62, 45))
    assert v.follow_ons == {45: 1}


def test_judge_xids_74_drains_and_79_reboots() -> None:
    nvlink, bus = judge([xid(74, 60), xid(79, 30, pci=PCI2)])
    assert (nvlink.rule, nvlink.action, nvlink.counts_against_gpu) == (
        "xid74_nvlink",
        "drain_inspect",
        True,
    )
    assert (bus.rule, bus.action, bus.severity) == ("xid79_off_bus", "reboot_node", "fatal")
    assert "drain" in bus.note


def test_judge_xids_163_cancelled_by_later_162() -> None:
    assert only(judge([xid(163, 60)])).action == "reset_gpu"
    cancelled = [v for v in judge([xid(163, 600), xid(162, 60)]) if 163 in v.xids]
    assert (only(cancelled).rule, only(cancelled).action) == ("xid163_cancelled", "none")


def test_judge_xids_xid154_overrides_table() -> None:
    msg = "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    verdicts = judge([xid(13, 40), xid(48, 30), xid(154, 29, message=msg)])
    override = only([v for v in verdicts if v.rule == "xid154_recovery_action"])
    assert (override.action, override.counts_against_gpu) == ("reboot_node", True)
    assert override.xids == (154, 48)
    assert "xid48_solo" in override.note
    assert [v.rule for v in verdicts if v is not override] == ["xid13_app"]  # apps stay apart


@pytest.mark.parametrize(
    ("value", "action"),
    [(1, "reset_gpu"), (2, "reboot_node"), (3, "drain_inspect"), (4, "drain_reset")],
)
def test_judge_xids_nvml_recovery_action_overrides(value: int, action: str) -> None:
    v = only(judge([xid(95, 30, uuid=UUID)], recovery_actions={UUID: value}))
    assert (v.rule, v.action, v.xids) == ("nvml_recovery_action", action, (95,))
    assert v.source.startswith("NVML")


def test_judge_xids_nvml_recovery_action_without_events() -> None:
    v = only(judge([], recovery_actions={UUID: 4}))
    assert (v.gpu, v.uuid, v.pci_bus_id, v.xids, v.action) == (UUID, UUID, None, (), "drain_reset")


def test_judge_xids_recovery_none_overrides_nothing() -> None:
    v = only(judge([xid(48, 30)], recovery_actions={PCI: 0}))
    assert v.rule == "xid48_solo"


def test_judge_xids_flood_is_one_verdict_with_count() -> None:
    events = [xid(95, 120 - i * 0.1) for i in range(1000)]
    v = only(judge(events))
    assert (v.xids, v.count, v.action) == ((95,), 1000, "reset_gpu")
    assert v.event_counts == {95: 1000}
    assert len(v.timestamps) == 20 and v.first_seen == events[0].ts
    assert v.last_seen == events[-1].ts


def test_judge_xids_bursts_split_by_flood_window() -> None:
    verdicts = judge([xid(95, 600), xid(95, 590), xid(95, 30)])
    assert [v.count for v in verdicts] == [2, 1]


def test_judge_xids_unknown_code_is_marked() -> None:
    v = only(judge([xid(9999, 30)]))
    assert (v.rule, v.known, v.action, v.counts_against_gpu) == (
        "unknown_xid",
        False,
        "investigate",
        True,
    )


def test_judge_xids_fleet_override_changes_verdict() -> None:
    fleet = CATALOG.with_overrides({43: {"action": "reset_gpu", "category": "hardware",
                                         "counts_against_gpu": True}})  # fmt: skip
    v = only(judge_xids([xid(43, 30)], catalog=fleet, now=NOW))
    assert (v.action, v.counts_against_gpu) == ("reset_gpu", True)
    assert v.source.endswith("fleet override")


def test_judge_xids_uuid_only_event_joins_its_gpu() -> None:
    events = [xid(13, 3600, uuid=UUID), xid(13, 60, pci=None, uuid=UUID)]
    v = only(judge(events))
    assert (v.gpu, v.uuid, v.rule) == (PCI, UUID, "xid13_repeat")


def test_judge_xids_ignores_other_kinds_keeps_clock_skew() -> None:
    lost = Event(kind="gpu_lost", ts=NOW, pci_bus_id=PCI)
    assert judge([lost]) == []
    assert only(judge([lost, xid(48, -5)])).rule == "xid48_solo"  # node clock 5 s ahead


def test_judge_xids_undated_events_count_as_now() -> None:
    class Line:  # a parser event with a monotonic stamp: no ts, no uuid attribute at all
        kind, xid, ts, pci_bus_id, message = "xid", 79, None, PCI2, "fallen off the bus"

    v = only(judge_xids([Line()], catalog=CATALOG, now=NOW))
    assert (v.rule, v.first_seen, v.uuid) == ("xid79_off_bus", NOW, None)


# --- real kernel log lines -------------------------------------------------------------


def _log(shared_dir: Path, name: str) -> list[object]:
    text = (shared_dir / "fixtures" / "kernel_logs" / name).read_text(encoding="utf-8")
    result = parse_kernel_log(text, year_hint=2026)
    assert result.errors == []
    return list(result.events)


def test_judge_xids_fixture_48_63_94_h100(shared_dir: Path) -> None:
    events = _log(shared_dir, "gpud__dmesg-time-format-iso__xid48-63-94_H100.log")
    now = datetime(2024, 11, 15, 13, 0, tzinfo=UTC)
    v = only(judge_xids(events, catalog=CATALOG, now=now))  # type: ignore[arg-type]
    assert v.gpu == "0000:19:00.0"
    assert (v.rule, v.action, v.severity) == ("xid48_with_remap", "drain_reset", "critical")
    assert v.xids == (48, 63, 94)
    assert v.count == 2  # the 48 and its 63
    assert v.follow_ons == {94: 9}  # the nine 94 lines are the 48's sympathetic reports
    assert v.processes == ("python3.10",)
    assert v.first_seen == datetime(2024, 11, 15, 12, 2, 3, 470068, tzinfo=UTC)


def test_judge_xids_fixture_13_repeats(shared_dir: Path) -> None:
    events = _log(shared_dir, "gpud__dmesg-decode-iso__xid13-43.log")
    now = datetime(2025, 1, 21, 23, 0, tzinfo=UTC)
    verdicts = judge_xids(events, catalog=CATALOG, now=now)  # type: ignore[arg-type]
    repeat = only([v for v in verdicts if 13 in v.xids])
    assert (repeat.rule, repeat.action, repeat.counts_against_gpu) == (
        "xid13_repeat",
        "investigate",
        True,
    )
    assert all(v.action == "none" and not v.counts_against_gpu for v in verdicts if v != repeat)


def test_judge_xids_fixture_curated_154(shared_dir: Path) -> None:
    events = _log(shared_dir, "xid_lines_curated.log")
    now = datetime(2026, 12, 1, tzinfo=UTC)
    verdicts = judge_xids(events, catalog=CATALOG, now=now, lookback=timedelta(days=3650))  # type: ignore[arg-type]
    by_gpu = {v.gpu: v for v in verdicts if v.gpu == "0000:55:00.0"}
    v = by_gpu["0000:55:00.0"]
    assert (v.rule, v.action, v.xids) == ("xid154_recovery_action", "drain_reset", (154, 48, 63))
    off_bus = [v for v in verdicts if v.rule == "xid79_off_bus"]
    assert {v.gpu for v in off_bus} == {"0000:91:00.0", "0000:ca:00.0"}


# --- which Xids wake the urgent lane (may_take_gpu_out) ---


def _takes_out(v: XidVerdict) -> bool:
    return v.counts_against_gpu and v.severity in ("critical", "fatal")


@pytest.mark.parametrize("code", [48, 64, 74, 79, 95, 154])
def test_may_take_gpu_out_for_the_xids_that_drain(code: int) -> None:
    assert may_take_gpu_out(code, CATALOG)


@pytest.mark.parametrize("code", [13, 31, 43, 45, 63, 94])
def test_may_take_gpu_out_not_for_application_and_info_xids(code: int) -> None:
    assert not may_take_gpu_out(code, CATALOG)


def test_may_take_gpu_out_for_an_unknown_code_or_none_and_after_an_override() -> None:
    assert 9999 not in CATALOG and may_take_gpu_out(9999, CATALOG)
    assert may_take_gpu_out(None, CATALOG)
    promoted = CATALOG.with_overrides({13: {"severity": "critical"}})
    assert not may_take_gpu_out(13, CATALOG) and may_take_gpu_out(13, promoted)


def test_xids_that_may_not_take_a_gpu_out_never_do_in_any_mix() -> None:
    """The claim ``may_take_gpu_out`` rests on, checked against the rules themselves: every
    catalogue code it calls routine, repeated on one GPU over hours (repeats, floods) and all of
    them mixed on it, yields no verdict that takes the GPU out."""
    routine = [entry.xid for entry in CATALOG if not may_take_gpu_out(entry.xid, CATALOG)]
    assert len(routine) >= 10
    hours = [3600 * h for h in (20, 12, 6, 3, 1)]
    for code in routine:
        alone = judge([xid(code, s) for s in hours])
        assert not any(_takes_out(v) for v in alone), (code, alone)
    mixed = judge([xid(code, s + k) for k, code in enumerate(routine) for s in hours])
    assert mixed and not any(_takes_out(v) for v in mixed), mixed
    # The same mix with one fatal Xid does take the GPU out: the check can fail.
    assert any(_takes_out(v) for v in judge([*[xid(c, 60) for c in routine], xid(79, 30)]))
