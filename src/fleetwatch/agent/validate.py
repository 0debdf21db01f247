"""``fleetwatch validate``: is this node fit to return to service? NVML checks, then DCGM's own.

Two NVML reads of every GPU, ``duration_s`` apart (the node should be idle: it is drained), and
one check per GPU and question, each pass, fail, warn or absent (the GPU or driver cannot answer:
absent, never a pass)::

    nvml.remapped_rows    rows pending a remap, or a remap failure            -> fail
    nvml.retired_pages    pages pending retirement (pre-Ampere)               -> fail
    nvml.ecc_volatile     volatile SBE or DBE counter rose during the run     -> fail
    nvml.recovery_action  NVML's GPU recovery action is not NONE (R550+)      -> fail
    nvml.pcie_link        width below the link's maximum                      -> fail
                          generation below maximum while busy                 -> fail
                          generation below maximum while idle                 -> warn
    nvml.clocks_idle      clocks held back by power cap, HW slowdown, thermal
                          or power brake while idle                           -> fail
    nvml.gpu_lost         the GPU stopped answering NVML                      -> fail

Why PCIe generation only warns at idle: NVIDIA GPUs lower the link speed when idle to save power
(``nvidia-smi -q`` shows "Current: 1" on a healthy idle card), so a slow link at idle proves
nothing, while a narrow link (x8 of x16) is a seating or riser fault whatever the load. The
maximum is ``nvmlDeviceGetMaxPcieLinkGeneration``/``Width``: what this GPU in this slot can reach.

Clock event reasons ignored at idle: GPU idle (0x1), application clocks setting (0x2), sync boost
(0x10), display clock setting (0x100): settings and states, not faults. Failing bits: SW power
cap (0x4; nothing draws power at idle), HW slowdown (0x8), SW thermal (0x20), HW thermal (0x40),
HW power brake (0x80); ``shared/reference/health-signals.md`` lists them.

Then, when ``dcgmi`` is installed, ``dcgmi diag -r <level> -j`` (:mod:`fleetwatch.agent.dcgm_diag`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fleetwatch import __version__
from fleetwatch.agent.dcgm_diag import DcgmDiag
from fleetwatch.agent.nvml import Nvml
from fleetwatch.errors import CollectorError, DeviceLost, NvmlUnavailable
from fleetwatch.telemetry import GpuSample
from fleetwatch.validation_wire import CheckResult, CheckStatus, ValidationReport

__all__ = [
    "IDLE_FAILING_REASONS",
    "GpuReads",
    "check_gpu",
    "run_validation",
]

logger = logging.getLogger(__name__)

# nvmlClocksEventReasons bits that mean the GPU is held back by a fault or limit, even at idle.
IDLE_FAILING_REASONS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}
_RECOVERY_ACTIONS = {
    0: "NONE",
    1: "GPU_RESET",
    2: "NODE_REBOOT",
    3: "DRAIN_P2P",
    4: "DRAIN_AND_RESET",
}


@dataclass(frozen=True)
class GpuReads:
    """One GPU's two reads and its link maximum (None where NVML does not say)."""

    index: int
    uuid: str
    start: GpuSample
    end: GpuSample | None  # None: lost during the run
    max_gen: int | None
    max_width: int | None


def check_gpu(reads: GpuReads) -> list[CheckResult]:
    """Every NVML check of one GPU."""
    if reads.end is None:
        return [_check(reads, "nvml.gpu_lost", "fail", {}, "the GPU stopped answering NVML")]
    return [
        _remapped_rows(reads, reads.end),
        _retired_pages(reads, reads.end),
        _ecc_volatile(reads, reads.start, reads.end),
        _recovery_action(reads, reads.end),
        _pcie_link(reads, reads.end),
        _clocks_idle(reads, reads.end),
    ]


def run_validation(
    nvml: Nvml,
    *,
    node: str,
    duration_s: float,
    dcgm: DcgmDiag | None = None,
    dcgm_level: int = 1,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> ValidationReport:
    """Read every GPU, wait ``duration_s``, read again, check; then run DCGM's diagnostic."""
    started = clock()
    checks: list[CheckResult] = []
    first = nvml.read_all(started)
    indexes = {gpu.uuid: gpu.index for gpu in first.gpus}
    checks.extend(_lost_at_start(first.lost))
    maxima = {uuid: _link_max(nvml, index) for uuid, index in indexes.items()}
    sleep(duration_s)
    second = nvml.read_all(clock())
    ended = {sample.uuid: sample for sample in second.samples}
    for sample in first.samples:
        max_gen, max_width = maxima.get(sample.uuid, (None, None))
        reads = GpuReads(
            index=indexes[sample.uuid],
            uuid=sample.uuid,
            start=sample,
            end=ended.get(sample.uuid),
            max_gen=max_gen,
            max_width=max_width,
        )
        checks.extend(check_gpu(reads))
    tools = {"fleetwatch": __version__}
    if nvml.driver_version:
        tools["driver"] = nvml.driver_version
    level: int | None = None
    if dcgm is not None:
        level = dcgm_level
        diag = dcgm.run(dcgm_level)
        checks.extend(diag.checks)
        if diag.version:
            tools["dcgm"] = diag.version
    if not checks:
        checks.append(
            CheckResult(name="nvml.gpus", status="fail", message="NVML lists no GPU on this node")
        )
    return ValidationReport(
        node=node,
        started_at=started,
        finished_at=clock(),
        checks=checks,
        tools=tools,
        dcgm_level=level,
        duration_s=duration_s,
    )


def _lost_at_start(lost: list[Any]) -> Iterator[CheckResult]:
    for gpu in lost:
        yield CheckResult(
            name="nvml.gpu_lost",
            status="fail",
            gpu_index=gpu.index,
            gpu_uuid=gpu.uuid,
            message=gpu.message,
        )


def _link_max(nvml: Nvml, index: int) -> tuple[int | None, int | None]:
    found: list[int | None] = []
    for function in ("nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth"):
        try:
            found.append(int(nvml.device_read(index, function)))
        except (DeviceLost, NvmlUnavailable):
            raise
        except CollectorError as exc:
            logger.debug("GPU index %d: no %s: %s", index, function, exc)
            found.append(None)
    return found[0], found[1]


def _check(
    reads: GpuReads,
    name: str,
    status: CheckStatus,
    evidence: dict[str, Any],
    message: str | None = None,
) -> CheckResult:
    return CheckResult(
        name=name,
        status=status,
        gpu_index=reads.index,
        gpu_uuid=reads.uuid,
        evidence=evidence,
        message=message,
    )


def _remapped_rows(reads: GpuReads, end: GpuSample) -> CheckResult:
    name = "nvml.remapped_rows"
    if end.remapped_rows_pending is None and end.remapped_rows_failure is None:
        return _check(reads, name, "absent", {}, "no row remapping on this GPU (pre-Ampere)")
    evidence = {
        "pending": end.remapped_rows_pending,
        "failure": end.remapped_rows_failure,
        "correctable": end.remapped_rows_correctable,
        "uncorrectable": end.remapped_rows_uncorrectable,
    }
    if end.remapped_rows_failure:
        return _check(reads, name, "fail", evidence, "a row remap failed: the GPU needs service")
    if end.remapped_rows_pending:
        return _check(reads, name, "fail", evidence, "rows pending a remap: reset the GPU first")
    return _check(reads, name, "pass", evidence)


def _retired_pages(reads: GpuReads, end: GpuSample) -> CheckResult:
    name = "nvml.retired_pages"
    if end.retired_pages_pending is None:
        return _check(reads, name, "absent", {}, "no page retirement on this GPU")
    evidence = {
        "pending": end.retired_pages_pending,
        "sbe": end.retired_pages_sbe,
        "dbe": end.retired_pages_dbe,
    }
    if end.retired_pages_pending:
        return _check(reads, name, "fail", evidence, "pages pending retirement: reset the GPU")
    return _check(reads, name, "pass", evidence)


def _ecc_volatile(reads: GpuReads, start: GpuSample, end: GpuSample) -> CheckResult:
    name = "nvml.ecc_volatile"
    pairs = {
        "sbe": (start.ecc_sbe_volatile_total, end.ecc_sbe_volatile_total),
        "dbe": (start.ecc_dbe_volatile_total, end.ecc_dbe_volatile_total),
    }
    known = {k: v for k, v in pairs.items() if v[0] is not None and v[1] is not None}
    if not known:
        return _check(reads, name, "absent", {}, "no ECC counters (ECC off or not offered)")
    evidence: dict[str, Any] = {}
    for kind, (before, after) in known.items():
        evidence[f"{kind}_start"], evidence[f"{kind}_end"] = before, after
    rose = [
        k for k, (before, after) in known.items() if after is not None and after > (before or 0)
    ]
    if rose:
        return _check(
            reads, name, "fail", evidence, f"{' and '.join(rose).upper()} count rose during the run"
        )
    return _check(reads, name, "pass", evidence)


def _recovery_action(reads: GpuReads, end: GpuSample) -> CheckResult:
    name = "nvml.recovery_action"
    action = end.gpu_recovery_action
    if action is None:
        return _check(reads, name, "absent", {}, "no recovery action field (driver before R550)")
    label = _RECOVERY_ACTIONS.get(action, f"unknown ({action})")
    evidence = {"value": action, "action": label}
    if action != 0:
        return _check(reads, name, "fail", evidence, f"the driver asks for {label}")
    return _check(reads, name, "pass", evidence)


def _pcie_link(reads: GpuReads, end: GpuSample) -> CheckResult:
    name = "nvml.pcie_link"
    gen, width = end.pcie_link_gen, end.pcie_link_width
    evidence = {
        "gen": gen,
        "max_gen": reads.max_gen,
        "width": width,
        "max_width": reads.max_width,
        "gpu_util_pct": end.gpu_util_pct,
    }
    width_known = width is not None and reads.max_width is not None
    gen_known = gen is not None and reads.max_gen is not None
    if not width_known and not gen_known:
        return _check(reads, name, "absent", {}, "no current or maximum PCIe link from NVML")
    if width_known and width is not None and reads.max_width is not None:
        if width < reads.max_width:
            message = f"link trained at x{width} of x{reads.max_width}: reseat the GPU or riser"
            return _check(reads, name, "fail", evidence, message)
    if gen_known and gen is not None and reads.max_gen is not None and gen < reads.max_gen:
        busy = (end.gpu_util_pct or 0) > 0
        message = f"link at gen {gen} of {reads.max_gen}" + (
            " while busy" if busy else " while idle (GPUs slow the link at idle)"
        )
        return _check(reads, name, "fail" if busy else "warn", evidence, message)
    return _check(reads, name, "pass", evidence)


def _clocks_idle(reads: GpuReads, end: GpuSample) -> CheckResult:
    name = "nvml.clocks_idle"
    reasons = end.clocks_event_reasons
    if reasons is None:
        return _check(reads, name, "absent", {}, "no clocks event reasons from NVML")
    held = [label for bit, label in IDLE_FAILING_REASONS.items() if reasons & bit]
    evidence: dict[str, Any] = {"reasons": reasons, "held_by": ",".join(held) or None}
    if held:
        return _check(reads, name, "fail", evidence, f"clocks held back by {', '.join(held)}")
    return _check(reads, name, "pass", evidence)
