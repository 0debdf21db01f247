"""``fleetwatch validate``'s NVML checks on the hand-written fake NVML: two reads ``duration``
apart (the wait is injected: the fake's counters move during it), one check per GPU and question,
absent where the GPU cannot answer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from fleetwatch.agent.nvml import Nvml
from fleetwatch.agent.validate import run_validation
from fleetwatch.testing import FakePynvml
from fleetwatch.validation_wire import CheckResult, ValidationReport

NVML_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvml"


def _healthy_h100() -> FakePynvml:
    """The 8 x H100 node, idle and with its links' maxima known."""
    fake = FakePynvml.from_json(NVML_FIXTURES / "h100_8x.json")
    for index in range(len(fake.gpus)):
        fake.set_value(index, "pcie.max_gen", 5)
        fake.set_value(index, "pcie.max_width", 16)
        fake.set_value(index, "utilization_pct.gpu", 0)
        fake.set_value(index, "clocks_event_reasons", 0x1)  # GPU idle: not a fault
    return fake


def _validate(fake: FakePynvml, during: Callable[[], None] = lambda: None) -> ValidationReport:
    with Nvml(fake) as nvml:
        return run_validation(nvml, node="gpu01", duration_s=30.0, sleep=lambda _s: during())


def _check(report: ValidationReport, name: str, gpu: int) -> CheckResult:
    (found,) = [c for c in report.checks if c.name == name and c.gpu_index == gpu]
    return found


def test_a_healthy_idle_node_passes_every_check_it_can_make() -> None:
    report = _validate(_healthy_h100())
    assert report.passed, [c for c in report.checks if c.status != "pass"]
    assert report.duration_s == 30.0 and report.node == "gpu01"
    names = {c.name for c in report.checks if c.status == "pass"}
    assert names == {
        "nvml.remapped_rows", "nvml.ecc_volatile", "nvml.recovery_action", "nvml.pcie_link",
        "nvml.clocks_idle",
    }  # fmt: skip
    # H100s have no page retirement (row remapping replaced it): absent, never a pass.
    assert {c.status for c in report.checks if c.name == "nvml.retired_pages"} == {"absent"}
    assert len({c.gpu_index for c in report.checks}) == 8
    assert report.tools["driver"]


def test_pending_row_remap_fails() -> None:
    fake = _healthy_h100()
    fake.set_value(3, "remapped_rows.pending", 1)
    report = _validate(fake)
    assert not report.passed
    check = _check(report, "nvml.remapped_rows", 3)
    assert check.status == "fail" and check.evidence["pending"] is True
    assert _check(report, "nvml.remapped_rows", 2).status == "pass"


def test_the_recorded_a100_with_a_pending_remap_fails() -> None:
    fake = FakePynvml.from_json(NVML_FIXTURES / "a100_remap_pending.json")
    report = _validate(fake)
    assert "nvml.remapped_rows on GPU 0" in [c.label for c in report.checks if c.status == "fail"]
    # This driver offers no recovery action field: absent, not faked as a pass.
    assert _check(report, "nvml.recovery_action", 0).status == "absent"


def test_ecc_counters_rising_during_the_run_fail() -> None:
    fake = _healthy_h100()
    report = _validate(fake, during=lambda: fake.advance(5, "ecc_errors.volatile.corrected", 3))
    check = _check(report, "nvml.ecc_volatile", 5)
    assert check.status == "fail"
    start = check.evidence["sbe_start"]
    assert isinstance(start, int) and check.evidence["sbe_end"] == start + 3
    assert check.message == "SBE count rose during the run"
    assert _check(report, "nvml.ecc_volatile", 4).status == "pass"


def test_ecc_counters_high_but_steady_pass() -> None:
    fake = _healthy_h100()
    fake.set_value(1, "ecc_errors.volatile.corrected", 40)
    assert _check(_validate(fake), "nvml.ecc_volatile", 1).status == "pass"


def test_a_downgraded_link_width_fails_and_a_slow_idle_link_only_warns() -> None:
    fake = _healthy_h100()
    fake.set_value(2, "pcie.width", 8)
    fake.set_value(6, "pcie.gen", 1)  # an idle GPU slows its link to save power
    report = _validate(fake)
    narrow = _check(report, "nvml.pcie_link", 2)
    assert narrow.status == "fail" and "x8 of x16" in (narrow.message or "")
    slow = _check(report, "nvml.pcie_link", 6)
    assert slow.status == "warn" and slow.evidence["gen"] == 1
    assert report.checks.count(slow) == 1 and not report.passed  # failed by GPU 2 only


def test_a_slow_link_under_load_fails() -> None:
    fake = _healthy_h100()
    fake.set_value(0, "pcie.gen", 3)
    fake.set_value(0, "utilization_pct.gpu", 80)
    assert _check(_validate(fake), "nvml.pcie_link", 0).status == "fail"


@pytest.mark.parametrize(
    ("bits", "status"),
    [(0x1, "pass"), (0x2 | 0x10, "pass"), (0x8, "fail"), (0x40, "fail"), (0x4, "fail"),
     (0x80 | 0x1, "fail")],
)  # fmt: skip
def test_clocks_held_back_at_idle_fail_settings_do_not(bits: int, status: str) -> None:
    fake = _healthy_h100()
    fake.set_value(7, "clocks_event_reasons", bits)
    check = _check(_validate(fake), "nvml.clocks_idle", 7)
    assert check.status == status and check.evidence["reasons"] == bits


def test_a_recovery_action_other_than_none_fails() -> None:
    fake = _healthy_h100()
    fake.set_value(4, "field_values.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 2)
    check = _check(_validate(fake), "nvml.recovery_action", 4)
    assert check.status == "fail" and check.evidence["action"] == "NODE_REBOOT"


def test_fields_the_gpu_lacks_stay_absent() -> None:
    fake = _healthy_h100()
    fake.set_unsupported(
        0,
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    )
    report = _validate(fake)
    for name in ("nvml.remapped_rows", "nvml.ecc_volatile", "nvml.pcie_link", "nvml.clocks_idle"):
        check = _check(report, name, 0)
        assert check.status == "absent" and check.evidence == {}, name
    assert report.passed  # the other GPUs passed; absent is neither pass nor fail


def test_a_driver_without_max_link_calls_leaves_pcie_absent() -> None:
    fake = FakePynvml.from_json(NVML_FIXTURES / "h100_8x.json")  # no pcie maxima recorded
    report = _validate(fake)
    assert {c.status for c in report.checks if c.name == "nvml.pcie_link"} == {"absent"}


def test_a_gpu_lost_during_the_run_fails() -> None:
    fake = _healthy_h100()
    report = _validate(fake, during=lambda: fake.lose_gpu(1))
    (lost,) = [c for c in report.checks if c.gpu_index == 1]
    assert (lost.name, lost.status) == ("nvml.gpu_lost", "fail")
    assert not report.passed


def test_the_report_round_trips_the_wire() -> None:
    report = _validate(_healthy_h100())
    again = ValidationReport.model_validate_json(report.model_dump_json())
    assert again == report and again.passed
