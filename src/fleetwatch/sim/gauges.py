"""A GPU's readings at one instant, as closed-form functions of time.

No reading depends on an earlier one, so any process computes the reading at any ``t`` directly
and gets the same numbers. Counters are integrals of rates, floored:

* energy: ``E(t) = integral of P over [boot, t]`` with ``P`` the job segment's mean power
  (prefix sums over the segments);
* single-bit ECC: ``C(t) = r_0 (t - t_install) + R(t)`` with the precursor ramp
  ``R(t) = r_peak * L * ((e^{g x} - 1)/g - x) / (e^g - 1)``, the integral of the rate
  ``r_peak (e^{g x} - 1)/(e^g - 1)`` that rises to ``r_peak`` at the failure, ``x`` the fraction of
  the lead time ``L`` elapsed and ``g = 4``; the aggregate counter is ``floor(C(t))``, the volatile
  one ``floor(C(t)) - floor(C(boot))``;
* PCIe replays, NVLink errors and throttle times likewise, since the current boot.

So counters never fall within a boot, and volatile ones restart from zero at each reboot.
Gauges add a small jitter from :func:`fleetwatch.sim._random.unit_noise`, fixed per 10 s tick.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable

from fleetwatch.sim._random import unit_noise
from fleetwatch.sim.events import NodeEvents
from fleetwatch.sim.plan import GpuPlan
from fleetwatch.sim.timeline import Jobs, NodeTimeline

__all__ = ["EnergyLedger", "THROTTLE_BITS", "gpu_readings", "ramp_integral"]

INLET_C = 27.0
TICK_S = 10.0
_G = 4.0

# NVML clocks-event reasons (nvml.h nvmlClocksEventReason*).
GPU_IDLE = 0x1
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
THROTTLE_BITS = {
    "thermal": SW_THERMAL | HW_THERMAL,
    "power_cap": SW_POWER_CAP,
    "power_brake": HW_SLOWDOWN | HW_POWER_BRAKE,
}


def ramp_integral(x: float, peak_per_s: float, lead_s: float) -> float:
    """Events accumulated by fraction ``x`` of a precursor ramp that rises to ``peak_per_s``.

    The rate over the lead time ``L`` is ``r(x) = r_peak (e^{g x} - 1) / (e^g - 1)``: zero when
    the warning signs begin, ``r_peak`` at the failure, and steepest at the end. Its integral is

        R(x) = r_peak * L * ((e^{g x} - 1) / g - x) / (e^g - 1)

    Parameters
    ----------
    x : float
        Fraction of the lead time elapsed; clipped to [0, 1].
    peak_per_s : float
        ``r_peak``, the rate at the failure (events per second).
    lead_s : float
        ``L``, the lead time in seconds.

    Returns
    -------
    float
        ``R(x)``, the expected events since the ramp began.

    Examples
    --------
    >>> ramp_integral(0.0, 1.0, 100.0), round(ramp_integral(1.0, 1.0, 100.0), 2)
    (0.0, 23.13)
    """
    if x <= 0.0 or peak_per_s <= 0.0:
        return 0.0
    x = min(x, 1.0)
    return peak_per_s * lead_s * (math.expm1(_G * x) / _G - x) / math.expm1(_G)


def busy_power_w(gpu: GpuPlan, level: float) -> float:
    sku = gpu.sku
    power = sku.idle_power_w + (sku.power_limit_w - sku.idle_power_w) * level * 0.95
    return min(sku.power_limit_w, power * gpu.power_factor)


class EnergyLedger:
    """Joules a GPU has used since the first job segment, from per-segment mean power."""

    def __init__(self, jobs: Jobs, gpu: GpuPlan) -> None:
        self._jobs = jobs
        self._power = [
            busy_power_w(gpu, level) if busy else gpu.sku.idle_power_w * gpu.power_factor
            for busy, level in zip(jobs.busy, jobs.level, strict=True)
        ]
        self._cumulative = [0.0]
        for k in range(len(jobs.starts) - 1):
            span = jobs.starts[k + 1] - jobs.starts[k]
            self._cumulative.append(self._cumulative[-1] + self._power[k] * span)

    def joules(self, t: float) -> float:
        k = self._jobs.segment(t)
        return self._cumulative[k] + self._power[k] * max(0.0, t - self._jobs.starts[k])


class _Progress:
    """Where a failing GPU is on its precursor ramp at time t."""

    def __init__(self, gpu: GpuPlan) -> None:
        fate = gpu.fate
        self.begin = fate.precursor_start_s
        self.lead = (fate.failure_s or 0.0) - (fate.precursor_start_s or 0.0)

    def x(self, t: float) -> float:
        if self.begin is None or self.lead <= 0:
            return 0.0
        return min(1.0, max(0.0, (t - self.begin) / self.lead))


def _sbe(gpu: GpuPlan, progress: _Progress, t: float) -> float:
    base = gpu.sbe_per_s * max(0.0, t - gpu.install_s)
    return base + ramp_integral(progress.x(t), gpu.fate.sbe_peak_per_s, progress.lead)


def _pcie(gpu: GpuPlan, progress: _Progress, t: float) -> float:
    base = gpu.pcie_per_s * max(0.0, t - gpu.install_s)
    return base + ramp_integral(progress.x(t), gpu.fate.pcie_peak_per_s, progress.lead)


def _nvlink(timeline: NodeTimeline, gpu: int, t: float) -> tuple[float, float, float, float]:
    flits = data = replays = recoveries = 0.0
    for burst in timeline.bursts.get(gpu, ()):
        done = burst.fraction_done(t)
        flits += burst.flits * done
        data += burst.data * done
        replays += burst.replays * done
        recoveries += burst.recoveries * (1.0 if t >= burst.end_s else 0.0)
    return flits, data, replays, recoveries


def _throttled_s(
    timeline: NodeTimeline, gpu: int, causes: tuple[str, ...], a: float, b: float
) -> float:
    total = 0.0
    for s in timeline.straggles:
        if s.cause in causes and gpu in s.gpus:
            total += max(0.0, min(b, s.end_s) - max(a, s.start_s))
    return total


def _since_boot(value_at: Callable[[float], float], t: float, boot_s: float) -> int:
    return max(0, math.floor(value_at(t)) - math.floor(value_at(boot_s)))


def gpu_readings(
    gpu: GpuPlan,
    timeline: NodeTimeline,
    events: NodeEvents,
    energy: EnergyLedger,
    t: float,
) -> dict[str, float | int | bool]:
    """Every canonical field this simulated GPU reports at time ``t`` (seconds since start).

    Fields an SXM H100/A100 does not have (fan speed; page retirement, replaced by row remapping
    since Ampere) are left out, as the real source leaves them out.
    """
    sku = gpu.sku
    tick = math.floor(t / TICK_S)

    def noise(field: int) -> float:
        return unit_noise(gpu.noise_key, tick, field) - 0.5

    jobs = timeline.jobs
    segment = jobs.segment(t)
    busy = jobs.busy[segment]
    boot_s = timeline.boot_at(t).start_s
    progress = _Progress(gpu)
    x = progress.x(t)

    level = min(1.0, jobs.level[segment] * (1.0 + 0.06 * noise(1))) if busy else 0.0
    power_limit = sku.power_limit_w
    if busy:
        power = busy_power_w(gpu, level)
        sm_clock = float(sku.max_sm_clock_mhz - round(30 * (noise(2) + 0.5)))
        reasons = 0
    else:
        power = sku.idle_power_w * gpu.power_factor * (1.0 + 0.05 * noise(3))
        sm_clock = float(sku.idle_sm_clock_mhz)
        reasons = GPU_IDLE
    extra_c = gpu.fate.temp_rise_c * x
    straggle = timeline.straggle_at(t)
    if busy and straggle is not None and gpu.index in straggle.gpus:
        # Clocks fall by the slowdown factor; dynamic power falls roughly with its square.
        reasons |= THROTTLE_BITS[straggle.cause]
        sm_clock = float(round(sku.max_sm_clock_mhz / straggle.slowdown))
        power = power / straggle.slowdown**2
        if straggle.cause == "power_cap":
            power_limit = float(round(power + 5.0))
        elif straggle.cause == "thermal":
            extra_c += 6.0
    gpu_temp = INLET_C + gpu.offset_c + sku.celsius_per_watt * power + extra_c + 2.0 * noise(4)
    gpu_temp = float(round(min(95.0, max(20.0, gpu_temp))))

    sbe_total = math.floor(_sbe(gpu, progress, t))
    remaps = events.remaps.get(gpu.index, [])
    remapped = bisect.bisect_right(remaps, t)
    pending = remapped > bisect.bisect_left(remaps, boot_s)
    remap_failed = events.remap_failure.get(gpu.index, math.inf) <= t

    def link(part: int) -> Callable[[float], float]:
        return lambda at: _nvlink(timeline, gpu.index, at)[part]

    def throttled_us(*causes: str) -> int:
        return round(_throttled_s(timeline, gpu.index, causes, boot_s, t) * 1e6)

    return {
        "gpu_temp_c": gpu_temp,
        "memory_temp_c": float(round(gpu_temp + 4.0 + 2.0 * noise(5))),
        "power_w": round(power, 3),
        "power_limit_w": float(power_limit),
        "energy_mj": max(0, round((energy.joules(t) - energy.joules(boot_s)) * 1000.0)),
        "sm_clock_mhz": sm_clock,
        "mem_clock_mhz": float(sku.mem_clock_mhz),
        "clocks_event_reasons": reasons,
        "power_violation_us": throttled_us("power_cap", "power_brake"),
        "thermal_violation_us": throttled_us("thermal"),
        "gpu_util_pct": float(round(level * 100.0)),
        "mem_copy_util_pct": float(round(level * 50.0 * (1.0 + 0.6 * noise(6)))) if busy else 0.0,
        "fb_used_mib": float(round(sku.fb_total_mib * jobs.fb_frac[segment])) if busy else 0.0,
        "fb_total_mib": float(sku.fb_total_mib),
        "pcie_link_gen": sku.pcie_gen,
        "pcie_link_width": 16,
        "ecc_sbe_volatile_total": max(0, sbe_total - math.floor(_sbe(gpu, progress, boot_s))),
        "ecc_dbe_volatile_total": 0,
        "ecc_sbe_aggregate_total": sbe_total,
        "ecc_dbe_aggregate_total": 0,
        "remapped_rows_correctable": remapped,
        "remapped_rows_uncorrectable": 0,
        "remapped_rows_pending": pending,
        "remapped_rows_failure": remap_failed,
        "nvlink_crc_flit_errors_total": _since_boot(link(0), t, boot_s),
        "nvlink_crc_data_errors_total": _since_boot(link(1), t, boot_s),
        "nvlink_replay_errors_total": _since_boot(link(2), t, boot_s),
        "nvlink_recovery_errors_total": _since_boot(link(3), t, boot_s),
        "pcie_replay_total": _since_boot(lambda at: _pcie(gpu, progress, at), t, boot_s),
        # The driver asks for a GPU reset while a row remap waits for one.
        "gpu_recovery_action": 1 if pending else 0,
    }
