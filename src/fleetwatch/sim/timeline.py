"""One node's history over the horizon: boots, silences, jobs, stragglers and NVLink bursts.

Built lazily, the first time a node is asked about, from the node's own substreams; so a process
that simulates one node never pays for the others. Every draw is made whether or not its result
is kept (an idle moment rejects a straggler window, say), so that what one quantity receives never
depends on another's outcome.

Times are float seconds since the simulation's start (negative before it).
"""

from __future__ import annotations

import bisect
import uuid
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from fleetwatch.sim._random import Stream, substream
from fleetwatch.sim.lifetimes import DAY, HOUR
from fleetwatch.sim.plan import NodePlan
from fleetwatch.sim.spec import FleetSpec

__all__ = ["Boot", "Burst", "Jobs", "NodeTimeline", "Straggle", "Window", "build_timeline"]

MONTH = 30 * DAY
MINUTE = 60.0
_BOOT_NAMESPACE = uuid.UUID("6f1c0a52-8f0e-4f4e-9d63-2a3f1c9b7e10")

SilenceReason = Literal["reboot", "outage", "hang"]
ThrottleCause = Literal["thermal", "power_cap", "power_brake"]
_THROTTLE_CAUSES: tuple[ThrottleCause, ...] = ("thermal", "power_cap", "power_brake")


def _us(seconds: float) -> float:
    # Whole microseconds, as times print and parse: a window's start read back from the ground
    # truth must fall inside the window.
    return round(float(seconds), 6)


@dataclass(frozen=True)
class Window:
    """A time the node sends nothing: a reboot, an agent/network outage, a hang after a failure."""

    start_s: float
    end_s: float
    reason: SilenceReason

    def __contains__(self, t: float) -> bool:
        return self.start_s <= t < self.end_s


@dataclass(frozen=True)
class Boot:
    start_s: float
    boot_id: str
    reason: Literal["initial", "reboot", "recovery"]


@dataclass(frozen=True)
class Straggle:
    """A window in which some GPUs of the node are throttled, slowing its jobs by ``slowdown``."""

    start_s: float
    end_s: float
    slowdown: float
    cause: ThrottleCause
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Burst:
    """NVLink CRC errors on one link of one GPU, spread evenly over a few minutes."""

    gpu: int
    link: int
    start_s: float
    end_s: float
    flits: int
    data: int
    replays: int
    recoveries: int

    def fraction_done(self, t: float) -> float:
        if t <= self.start_s:
            return 0.0
        return min(1.0, (t - self.start_s) / (self.end_s - self.start_s))


@dataclass
class Jobs:
    """Back-to-back busy and idle segments; the last one (busy) never ends."""

    starts: list[float]
    busy: list[bool]
    level: list[float]  # utilisation while busy, 0..1
    fb_frac: list[float]  # share of the framebuffer the job holds

    def segment(self, t: float) -> int:
        return max(0, bisect.bisect_right(self.starts, t) - 1)

    def end_of(self, segment: int) -> float:
        return self.starts[segment + 1] if segment + 1 < len(self.starts) else float("inf")


@dataclass
class NodeTimeline:
    boots: list[Boot]
    silences: list[Window]
    jobs: Jobs
    straggles: list[Straggle]
    bursts: dict[int, list[Burst]]
    _boot_starts: list[float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._boot_starts = [boot.start_s for boot in self.boots]

    def boot_at(self, t: float) -> Boot:
        return self.boots[max(0, bisect.bisect_right(self._boot_starts, t) - 1)]

    def silence_at(self, t: float) -> Window | None:
        """The silent window around ``t`` (the earliest-starting one, if several overlap)."""
        return next((window for window in self.silences if t in window), None)

    def is_down(self, t: float) -> bool:
        """Powered off or hung (no application runs, no event happens), not merely unheard."""
        return any(t in window for window in self.silences if window.reason != "outage")

    def straggle_at(self, t: float) -> Straggle | None:
        return next((s for s in self.straggles if s.start_s <= t < s.end_s), None)


def _poisson_times(rng: np.random.Generator, rate_per_s: float, end_s: float) -> np.ndarray:
    count = rng.poisson(rate_per_s * end_s)
    return np.sort(rng.uniform(0.0, end_s, size=count))


def _log_uniform(rng: np.random.Generator, bounds: tuple[float, float], size: int) -> np.ndarray:
    low, high = max(bounds[0], 1e-9), max(bounds[1], 1e-9)
    return np.exp(rng.uniform(np.log(low), np.log(high), size=size))


def build_timeline(spec: FleetSpec, node: NodePlan) -> NodeTimeline:
    end_s = spec.horizon_days * DAY
    behaviour = spec.behaviour
    # One substream per process, so that e.g. a higher reboot rate leaves the jobs unchanged.
    reboots, outages, job_rng, straggle_rng = (
        substream(spec.seed, Stream.TIMELINE, node.index, part) for part in range(4)
    )

    silences: list[Window] = []
    boots = [Boot(node.first_boot_s, "", "initial")]
    for t in _poisson_times(reboots, behaviour.reboots_per_node_month / MONTH, end_s):
        down = reboots.uniform(*behaviour.reboot_minutes) * MINUTE
        silences.append(Window(_us(t), _us(t + down), "reboot"))
        boots.append(Boot(_us(t + down), "", "reboot"))
    for gpu in node.gpus:
        fate = gpu.fate
        if fate.failure_s is not None and fate.hang_s is not None:
            # The fatal Xid is logged (and pushed at once) before the node locks up.
            until = _us(fate.failure_s + fate.hang_s)
            silences.append(Window(_us(fate.failure_s + 1.0), until, "hang"))
            boots.append(Boot(until, "", "recovery"))
    for t in _poisson_times(outages, behaviour.outages_per_node_month / MONTH, end_s):
        length = outages.uniform(*behaviour.outage_minutes) * MINUTE
        silences.append(Window(_us(t), _us(t + length), "outage"))
    silences.sort(key=lambda w: (w.start_s, w.end_s))
    boots.sort(key=lambda b: b.start_s)
    boots = [
        Boot(b.start_s, str(uuid.uuid5(_BOOT_NAMESPACE, f"{spec.seed}/{node.index}/{n}")), b.reason)
        for n, b in enumerate(boots)
    ]

    begin_s = min(node.first_boot_s, 0.0) - DAY
    jobs = _build_jobs(job_rng, spec, begin_s=begin_s, end_s=end_s + DAY)
    straggles = _build_straggles(straggle_rng, spec, jobs, end_s)
    bursts = _build_bursts(spec, node, end_s)
    return NodeTimeline(boots, silences, jobs, straggles, bursts)


def _build_jobs(rng: np.random.Generator, spec: FleetSpec, begin_s: float, end_s: float) -> Jobs:
    behaviour = spec.behaviour
    starts: list[float] = []
    busy: list[bool] = []
    level: list[float] = []
    fb_frac: list[float] = []
    t = begin_s
    running = bool(rng.random() < 0.8)
    while t < end_s:
        # Draw in chunks: vectorised, and the same numbers however far the loop gets.
        job_s = _log_uniform(rng, behaviour.job_hours, 256) * HOUR
        idle_s = _log_uniform(rng, behaviour.idle_hours, 256) * HOUR
        levels = rng.uniform(0.75, 1.0, 256)
        fbs = rng.uniform(0.55, 0.95, 256)
        for k in range(256):
            if t >= end_s:
                break
            starts.append(_us(t))
            busy.append(running)
            level.append(float(levels[k]) if running else 0.0)
            fb_frac.append(float(fbs[k]) if running else 0.0)
            t += float(job_s[k] if running else idle_s[k])
            running = not running
    # After the horizon nothing new happens: the fleet stays busy at a steady load.
    starts.append(_us(t))
    busy.append(True)
    level.append(0.9)
    fb_frac.append(0.8)
    return Jobs(starts, busy, level, fb_frac)


def _build_straggles(
    rng: np.random.Generator, spec: FleetSpec, jobs: Jobs, end_s: float
) -> list[Straggle]:
    behaviour = spec.behaviour
    gpus = spec.gpus_per_node
    out: list[Straggle] = []
    for t in _poisson_times(rng, behaviour.straggler_windows_per_node_month / MONTH, end_s):
        length = rng.uniform(*behaviour.straggler_hours) * HOUR
        slowdown = float(rng.uniform(*behaviour.straggler_slowdown))
        cause = _THROTTLE_CAUSES[int(rng.choice(3, p=[0.5, 0.3, 0.2]))]
        one_gpu = rng.random() < 0.6
        which = int(rng.integers(0, gpus))
        segment = jobs.segment(float(t))
        # A straggler is seen through a running job: a window in idle time shows nothing.
        if not jobs.busy[segment] or (out and out[-1].end_s > t):
            continue
        affected = (which,) if one_gpu and cause != "power_brake" else tuple(range(gpus))
        end = min(_us(t + length), jobs.end_of(segment))
        out.append(Straggle(_us(t), end, round(slowdown, 3), cause, affected))
    return out


def _build_bursts(spec: FleetSpec, node: NodePlan, end_s: float) -> dict[int, list[Burst]]:
    behaviour = spec.behaviour
    rng = substream(spec.seed, Stream.NVLINK, node.index)
    bursts: dict[int, list[Burst]] = {}
    for gpu in range(spec.gpus_per_node):
        times = _poisson_times(rng, behaviour.nvlink_bursts_per_gpu_month / MONTH, end_s)
        for t in times:
            length = rng.uniform(1.0, 30.0) * MINUTE
            flits = int(_log_uniform(rng, behaviour.nvlink_burst_flits, 1)[0])
            link = int(rng.integers(0, max(1, node.sku.nvlinks)))
            recoveries = int(rng.random() < 0.3)
            if node.sku.nvlinks == 0:
                continue
            burst = Burst(
                gpu, link, _us(t), _us(t + length), flits, flits // 10, flits // 40, recoveries
            )
            bursts.setdefault(gpu, []).append(burst)
    return bursts
