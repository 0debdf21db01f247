"""Straggler detection: which nodes make a training job wait, and whether the node or the job is
to blame.

Everything runs on the job's own clock (the ``ts`` of its step reports), so a job that replays old
steps is judged exactly as it was live. Per job, the steps are cut into windows of
``straggler_window_s`` starting at the job's first step. A window is judged once the job has
reported half a window past its end (ranks flush at different moments).

In one window, with :math:`M` the median of every step of the job and :math:`m_i` the median step
of node :math:`i`'s ranks (nodes with fewer than 3 steps in the window sit it out):

* node :math:`i` is *slow* when :math:`m_i \\ge r \\cdot M` (``straggler_ratio``, 1.25) **and**
  it is an outlier among the nodes: robust z :math:`0.6745 (m_i - \\tilde m) / \\mathrm{MAD}(m)
  \\ge 3.5` (the MAD floored at 0.5 % of :math:`\\tilde m`). One noisy step moves neither median.
* after ``straggler_windows`` (3) consecutive slow windows the node is a straggler: a
  ``stragglers`` row opens; it closes (``ended_at``) after as many consecutive normal windows.

Classification, fixed when the verdict opens:

* **workload** when the node's pipeline-stage peers (ranks of the same ``stage`` on other nodes)
  are as slow (their median is also :math:`\\ge r \\cdot M`), or when the node was slow from the
  job's first windows (its slow run began in window 0 or 1): the job, not the node, is uneven;
* **hardware** otherwise, when its own history says it got slower: earlier normal windows in this
  job, or a cross-job ``node_slowness`` score below :math:`r`. The verdict then carries telemetry
  evidence from the node's samples (:func:`fleetwatch.server.repo.jobs.telemetry_evidence`).
  Without any history it stays **workload** (the conservative reading: no drain for it).

``node_slowness`` keeps, per node, an exponentially weighted mean (weight 0.05 per window) of the
node's ratio :math:`m_i / M` over every judged window of every job.

A :class:`JobDetector` is a value: :meth:`JobDetector.state` is everything its next
:meth:`~JobDetector.feed` depends on, as JSON, and :meth:`JobDetector.resume` continues from it
exactly (the background job stores it with each pass's verdicts).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np

__all__ = [
    "DetectorConfig",
    "JobDetector",
    "NodeWindow",
    "StepRow",
    "Transition",
    "WindowResult",
    "judge_window",
    "node_stats",
]

logger = logging.getLogger(__name__)

ROBUST_Z = 3.5
MIN_STEPS = 3
MAD_FLOOR = 0.005
FIRST_WINDOWS = 2
EWMA_WEIGHT = 0.05


@dataclass(frozen=True)
class DetectorConfig:
    window_s: float = 10.0
    ratio: float = 1.25
    windows: int = 3
    normal_windows: int = 3

    @property
    def grace(self) -> timedelta:
        return timedelta(seconds=self.window_s / 2)

    @property
    def width(self) -> timedelta:
        return timedelta(seconds=self.window_s)


@dataclass(frozen=True)
class StepRow:
    rank: int
    node: str
    duration_ms: float
    ts: datetime
    stage: int | None = None


@dataclass(frozen=True)
class NodeWindow:
    node: str
    steps: int
    p50_ms: float
    p99_ms: float
    ratio: float  # p50 / job median
    robust_z: float
    slow: bool
    stages: tuple[int, ...]
    stage_peer_ratio: float | None  # peers' median / job median, the slowest of the node's stages

    @property
    def p99_over_p50(self) -> float:
        return self.p99_ms / self.p50_ms if self.p50_ms > 0 else float("nan")


@dataclass(frozen=True)
class WindowResult:
    start: datetime
    end: datetime
    job_median_ms: float
    nodes: dict[str, NodeWindow]


def node_stats(rows: Sequence[StepRow]) -> dict[str, tuple[int, float, float]]:
    """Per node: (steps, p50 ms, p99 ms)."""
    grouped: dict[str, list[float]] = {}
    for row in rows:
        grouped.setdefault(row.node, []).append(row.duration_ms)
    out = {}
    for node, values in grouped.items():
        arr = np.asarray(values)
        out[node] = (len(values), float(np.median(arr)), float(np.percentile(arr, 99)))
    return out


def _stage_peer_ratios(rows: Sequence[StepRow], job_median: float) -> dict[str, float]:
    """For each node, the slowest of its stages as seen on the *other* nodes (peers' median / M)."""
    by_stage: dict[int, dict[str, list[float]]] = {}
    for row in rows:
        if row.stage is not None:
            by_stage.setdefault(row.stage, {}).setdefault(row.node, []).append(row.duration_ms)
    out: dict[str, float] = {}
    for per_node in by_stage.values():
        if len(per_node) < 2:
            continue
        for node in per_node:
            peers = np.concatenate([np.asarray(v) for n, v in per_node.items() if n != node])
            ratio = float(np.median(peers)) / job_median
            out[node] = max(out.get(node, 0.0), ratio)
    return out


def judge_window(
    rows: Sequence[StepRow], start: datetime, end: datetime, *, ratio: float
) -> WindowResult | None:
    """Judge one window's steps; ``None`` when it has no steps."""
    if not rows:
        return None
    job_median = float(np.median([r.duration_ms for r in rows]))
    stats = {n: s for n, s in node_stats(rows).items() if s[0] >= MIN_STEPS}
    if job_median <= 0 or not stats:
        return WindowResult(start, end, job_median, {})
    medians = np.asarray([s[1] for s in stats.values()])
    center = float(np.median(medians))
    mad = max(float(np.median(np.abs(medians - center))), MAD_FLOOR * center, 1e-9)
    stages: dict[str, set[int]] = {}
    for row in rows:
        if row.stage is not None:
            stages.setdefault(row.node, set()).add(row.stage)
    peer = _stage_peer_ratios(rows, job_median)
    nodes = {}
    for node, (count, p50, p99) in stats.items():
        z = 0.6745 * (p50 - center) / mad
        node_ratio = p50 / job_median
        nodes[node] = NodeWindow(
            node=node,
            steps=count,
            p50_ms=p50,
            p99_ms=p99,
            ratio=node_ratio,
            robust_z=z,
            slow=node_ratio >= ratio and z >= ROBUST_Z,
            stages=tuple(sorted(stages.get(node, ()))),
            stage_peer_ratio=peer.get(node),
        )
    return WindowResult(start, end, job_median, nodes)


@dataclass(frozen=True)
class Transition:
    """A change to a node's verdict: ``open`` (with ``kind``), ``update`` or ``close``."""

    action: str
    node: str
    at: datetime  # the window end that caused it
    started_at: datetime
    windows: int
    ratio: float
    kind: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class _NodeTrack:
    slow_run: int = 0
    normal_run: int = 0
    run_start: datetime | None = None
    run_start_index: int = 0
    run_ratios: list[float] = field(default_factory=list)
    normal_ratios: list[float] = field(default_factory=list)  # the last 30 normal windows
    open_since: datetime | None = None
    open_windows: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "slow_run": self.slow_run,
            "normal_run": self.normal_run,
            "run_start": _iso(self.run_start),
            "run_start_index": self.run_start_index,
            "run_ratios": self.run_ratios,
            "normal_ratios": self.normal_ratios,
            "open_since": _iso(self.open_since),
            "open_windows": self.open_windows,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> _NodeTrack:
        return cls(
            slow_run=data["slow_run"],
            normal_run=data["normal_run"],
            run_start=_datetime(data["run_start"]),
            run_start_index=data["run_start_index"],
            run_ratios=list(data["run_ratios"]),
            normal_ratios=list(data["normal_ratios"]),
            open_since=_datetime(data["open_since"]),
            open_windows=data["open_windows"],
        )


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _datetime(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value is not None else None


class JobDetector:
    """One job's detector: feed it windows in time order; it answers verdict transitions.

    ``from_start`` says whether window 0 is the job's first window (else the detector was rebuilt
    mid-job and "slow from the first windows" cannot be told). ``slowness`` looks up a node's
    cross-job score (``None`` when unknown).
    """

    def __init__(
        self,
        config: DetectorConfig,
        *,
        from_start: bool = True,
        slowness: Callable[[str], float | None] = lambda node: None,
    ) -> None:
        self.config = config
        self.from_start = from_start
        self.slowness = slowness
        self.index = 0
        self.nodes: dict[str, _NodeTrack] = {}
        self.last: WindowResult | None = None

    def state(self) -> dict[str, Any]:
        """Everything :meth:`feed` depends on, as JSON (floats round-trip exactly)."""
        return {
            "index": self.index,
            "from_start": self.from_start,
            "nodes": {node: track.as_json() for node, track in self.nodes.items()},
        }

    @classmethod
    def resume(
        cls,
        config: DetectorConfig,
        state: dict[str, Any],
        *,
        slowness: Callable[[str], float | None] = lambda node: None,
    ) -> JobDetector:
        """The detector that :meth:`state` described, continuing exactly where it stopped."""
        detector = cls(config, from_start=state["from_start"], slowness=slowness)
        detector.index = state["index"]
        detector.nodes = {n: _NodeTrack.from_json(t) for n, t in state["nodes"].items()}
        return detector

    def adopt_open(self, node: str, started_at: datetime, windows: int) -> None:
        """Continue a verdict stored before this detector was built."""
        track = self.nodes.setdefault(node, _NodeTrack())
        track.open_since, track.open_windows = started_at, windows
        track.slow_run, track.run_start = windows, started_at

    def feed(self, result: WindowResult | None) -> list[Transition]:
        if result is None:
            return []
        index, self.index = self.index, self.index + 1
        self.last = result
        out: list[Transition] = []
        for node, nw in result.nodes.items():
            track = self.nodes.setdefault(node, _NodeTrack())
            if nw.slow:
                if track.slow_run == 0:
                    track.run_start, track.run_start_index, track.run_ratios = (
                        result.start,
                        index,
                        [],
                    )
                track.slow_run += 1
                track.normal_run = 0
                track.run_ratios.append(nw.ratio)
                out.extend(self._on_slow(node, track, nw, result))
            else:
                track.normal_run += 1
                track.slow_run = 0
                track.normal_ratios = [*track.normal_ratios[-29:], nw.ratio]
                if track.open_since is not None and track.normal_run >= self.config.normal_windows:
                    out.append(
                        Transition(
                            "close",
                            node,
                            result.end,
                            track.open_since,
                            track.open_windows,
                            nw.ratio,
                        )
                    )
                    track.open_since, track.open_windows = None, 0
        return out

    def _on_slow(
        self, node: str, track: _NodeTrack, nw: NodeWindow, result: WindowResult
    ) -> list[Transition]:
        assert track.run_start is not None
        ratio = float(np.median(track.run_ratios))
        if track.open_since is not None:
            track.open_windows += 1
            return [
                Transition("update", node, result.end, track.open_since, track.open_windows, ratio)
            ]
        if track.slow_run < self.config.windows:
            return []
        kind, evidence = self._classify(node, track, nw, result)
        track.open_since, track.open_windows = track.run_start, track.slow_run
        evidence.update(
            ratio=round(ratio, 4),
            p50_ms=round(nw.p50_ms, 3),
            p99_ms=round(nw.p99_ms, 3),
            p99_over_p50=round(nw.p99_over_p50, 4),
            job_median_ms=round(result.job_median_ms, 3),
            robust_z=round(nw.robust_z, 2),
            windows=track.slow_run,
            window_s=self.config.window_s,
        )
        return [
            Transition(
                "open", node, result.end, track.run_start, track.slow_run, ratio, kind, evidence
            )
        ]

    def _classify(
        self, node: str, track: _NodeTrack, nw: NodeWindow, result: WindowResult
    ) -> tuple[str, dict[str, Any]]:
        r = self.config.ratio
        evidence: dict[str, Any] = {"stages": list(nw.stages)}
        if nw.stage_peer_ratio is not None:
            evidence["stage_peer_ratio"] = round(nw.stage_peer_ratio, 4)
            if nw.stage_peer_ratio >= r:
                evidence["reason"] = (
                    f"pipeline stage {list(nw.stages)} is slow on its other nodes too "
                    f"({nw.stage_peer_ratio:.2f}x the job median): workload imbalance"
                )
                return "workload", evidence
        if self.from_start and track.run_start_index < FIRST_WINDOWS:
            evidence["reason"] = "slow from the job's first windows: the job's own layout"
            return "workload", evidence
        score = self.slowness(node)
        if score is not None:
            evidence["node_slowness"] = round(score, 4)
        if track.normal_ratios:
            baseline = float(np.median(track.normal_ratios))
            evidence["baseline_ratio"] = round(baseline, 4)
            evidence["reason"] = (
                f"got slower within this job: {baseline:.2f}x before, "
                f"{float(np.median(track.run_ratios)):.2f}x now, stage peers normal"
            )
            return "hardware", evidence
        if score is not None and score < r:
            evidence["reason"] = f"usually {score:.2f}x its jobs' median across jobs, now slower"
            return "hardware", evidence
        evidence["reason"] = "slow with no earlier history to compare with"
        return "workload", evidence
