"""``SimFleet``: a simulated GPU fleet with known ground truth, the same in every process.

Construction draws every node's place and SKU and every GPU's identity, covariates and fate
(failure time and cause, or survival past the horizon) from seeded substreams; a node's history
(jobs, reboots, silences, stragglers, NVLink bursts, events) is built the first time the node is
asked about. Nothing depends on call order or on other nodes, so one agent process per node, each
with its own ``SimFleet`` from the same spec, tells one consistent story with no coordination.

What each call answers, at simulated time ``t``:

* :meth:`SimFleet.sample`: the readings of the node's GPUs that are still alive (a failed GPU is
  absent). Readings exist even while the node is silent; a collector must check
  :meth:`SimFleet.is_silent` and send nothing then.
* :meth:`SimFleet.ports`: the readings of the node's network adapter ports (InfiniBand, or RoCE),
  their links' state and counters, flaps and degradations included.
* :meth:`SimFleet.events`: Xid and ``gpu_lost`` events in ``(t0, t1]``.
* :meth:`SimFleet.step_slowdown`: how much slower the node's training steps run (1.0 normal):
  a throttled GPU (a straggler window) or a faulty link (:meth:`SimFleet.link_slowdown`).
* :meth:`SimFleet.ground_truth`: everything that was drawn, for evaluating what FleetWatch infers.

After the horizon nothing new happens: survivors stay busy at a steady load, with no failures,
events or silences.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fleetwatch.sim.events import NodeEvents, SimEvent, build_events
from fleetwatch.sim.gauges import EnergyLedger, gpu_readings
from fleetwatch.sim.links import NodeLinks, build_links
from fleetwatch.sim.plan import NodePlan, build_nodes
from fleetwatch.sim.port_gauges import TrafficLedger, port_readings
from fleetwatch.sim.spec import FleetSpec
from fleetwatch.sim.timeline import NodeTimeline, build_timeline
from fleetwatch.telemetry import Event, GpuIdentity, GpuSample, PortSample

__all__ = ["SimFleet"]


@dataclass
class _NodeState:
    plan: NodePlan
    timeline: NodeTimeline
    events: NodeEvents
    event_times: list[float]
    energy: list[EnergyLedger]
    links: NodeLinks
    traffic: TrafficLedger


class SimFleet:
    """A deterministic simulated fleet built from a :class:`~fleetwatch.sim.spec.FleetSpec`."""

    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        self._nodes = build_nodes(spec)
        self._by_name = {node.name: node for node in self._nodes}
        self._states: dict[str, _NodeState] = {}
        self._lock = threading.Lock()

    # -- time ----------------------------------------------------------------------------

    def seconds(self, t: datetime) -> float:
        """Simulated seconds since ``spec.start``."""
        if t.tzinfo is None:
            raise ValueError("simulated times must carry a time zone (UTC)")
        return (t - self.spec.start).total_seconds()

    def at(self, seconds: float) -> datetime:
        """The simulated time ``seconds`` after ``spec.start``."""
        return self.spec.start + timedelta(seconds=seconds)

    def sim_time(self, real_now: datetime) -> datetime:
        """``start + (real_now - real_start) * speed``, never later than ``real_now``.

        The cap keeps every timestamp in the past, which the server requires; with a spec from
        :meth:`FleetSpec.live` it binds only once the whole horizon has been played.
        """
        elapsed = (real_now - self.spec.real_start).total_seconds()
        return min(self.at(elapsed * self.spec.speed), real_now.astimezone(UTC))

    # -- the fleet -----------------------------------------------------------------------

    def node_names(self) -> list[str]:
        return [node.name for node in self._nodes]

    def labels(self, node: str) -> dict[str, str]:
        """``cluster``, ``row``, ``rack`` and ``position`` (slot in the rack, 0 at the bottom)."""
        return dict(self._plan(node).labels)

    def identities(self, node: str) -> list[GpuIdentity]:
        """Every GPU installed in ``node``, failed or not."""
        return [
            GpuIdentity(
                uuid=gpu.uuid,
                index=gpu.index,
                serial=gpu.serial,
                pci_bus_id=gpu.pci_bus_id,
                name=gpu.sku.name,
                driver_version=gpu.sku.driver_version,
                vbios_version=gpu.sku.vbios_version,
            )
            for gpu in self._plan(node).gpus
        ]

    def alive(self, node: str, t: datetime) -> list[int]:
        """Indices of the node's GPUs that have not failed by ``t``."""
        s = self.seconds(t)
        return [
            gpu.index
            for gpu in self._plan(node).gpus
            if gpu.fate.failure_s is None or s < gpu.fate.failure_s
        ]

    def sample(self, node: str, t: datetime) -> list[GpuSample]:
        """Readings of the node's live GPUs at ``t`` (``ts = t``); failed GPUs are absent."""
        state = self._state(node)
        s = self.seconds(t)
        return [
            GpuSample.model_validate(
                {"uuid": gpu.uuid, "ts": t}
                | gpu_readings(gpu, state.timeline, state.events, state.energy[gpu.index], s)
            )
            for gpu in state.plan.gpus
            if gpu.fate.failure_s is None or s < gpu.fate.failure_s
        ]

    def ports(self, node: str, t: datetime) -> list[PortSample]:
        """Readings of the node's adapter ports at ``t`` (``ts = t``), a link down included."""
        state = self._state(node)
        s = self.seconds(t)
        boot_s = state.timeline.boot_at(s).start_s
        return [
            PortSample.model_validate(
                {"ts": t}
                | port_readings(
                    self.spec.network,
                    state.links,
                    port,
                    state.traffic,
                    install_s=state.plan.install_s,
                    boot_s=boot_s,
                    t=s,
                )
            )
            for port in state.links.ports
        ]

    def events(self, node: str, t0: datetime, t1: datetime) -> list[Event]:
        """The node's events with ``t0 < ts <= t1``, in time order."""
        state = self._state(node)
        return [self._event(state.plan, e) for e in self._slice(state, t0, t1)]

    def last_xid(self, node: str, t: datetime) -> dict[str, int]:
        """GPU uuid -> the last Xid since the current boot (0: none), as DCGM reports it."""
        state = self._state(node)
        boot = self.at(state.timeline.boot_at(self.seconds(t)).start_s)
        last = {gpu.uuid: 0 for gpu in state.plan.gpus}
        for event in self._slice(state, boot, t):
            if event.xid is not None:
                last[state.plan.gpus[event.gpu].uuid] = event.xid
        return last

    def is_silent(self, node: str, t: datetime) -> bool:
        """True while the node sends nothing: a reboot, an agent/network outage, a hang."""
        return self._state(node).timeline.silence_at(self.seconds(t)) is not None

    def silence(self, node: str, t: datetime) -> tuple[datetime, datetime, str] | None:
        """``(start, end, reason)`` of the silent window around ``t``, or None."""
        window = self._state(node).timeline.silence_at(self.seconds(t))
        if window is None:
            return None
        return self.at(window.start_s), self.at(window.end_s), window.reason

    def boot_id(self, node: str, t: datetime) -> str:
        """The node's boot id at ``t``; it changes at every reboot (volatile counters reset)."""
        return self._state(node).timeline.boot_at(self.seconds(t)).boot_id

    def boots(self, node: str, t0: datetime, t1: datetime) -> list[tuple[datetime, str]]:
        """``(time, boot_id)`` of the boots with ``t0 < time <= t1``."""
        s0, s1 = self.seconds(t0), self.seconds(t1)
        return [
            (self.at(boot.start_s), boot.boot_id)
            for boot in self._state(node).timeline.boots
            if s0 < boot.start_s <= s1
        ]

    def step_slowdown(self, node: str, t: datetime) -> float:
        """How many times slower the node's training steps run at ``t``; 1.0 when nothing slows
        them. A throttled GPU and a faulty link slow a step independently: the factors multiply.
        """
        straggle = self._state(node).timeline.straggle_at(self.seconds(t))
        throttled = 1.0 if straggle is None else straggle.slowdown
        return throttled * self.link_slowdown(node, t)

    def link_slowdown(self, node: str, t: datetime) -> float:
        """How many times slower the node's steps run at ``t`` because a link flaps, is degraded
        or dead; 1.0 when its links are healthy or no job runs."""
        state = self._state(node)
        s = self.seconds(t)
        jobs = state.timeline.jobs
        if not jobs.busy[jobs.segment(s)]:
            return 1.0  # no job, no steps to slow
        return state.links.slowdown_at(s)

    # -- ground truth --------------------------------------------------------------------

    def ground_truth(self) -> dict[str, Any]:
        """Everything the simulation drew: see :func:`fleetwatch.sim.truth.ground_truth`."""
        from fleetwatch.sim.truth import ground_truth

        return ground_truth(self)

    def write_ground_truth(self, path: Path) -> tuple[Path, Path]:
        """Write ``path`` (JSON) and ``<stem>_lifetimes.csv`` beside it; return both paths."""
        from fleetwatch.sim.truth import write_ground_truth

        return write_ground_truth(self, path)

    # -- internals -----------------------------------------------------------------------

    def _plan(self, node: str) -> NodePlan:
        try:
            return self._by_name[node]
        except KeyError:
            raise KeyError(f"no node {node!r} in the simulated fleet") from None

    def _state(self, node: str) -> _NodeState:
        state = self._states.get(node)
        if state is not None:
            return state
        plan = self._plan(node)
        with self._lock:
            state = self._states.get(node)
            if state is None:
                timeline = build_timeline(self.spec, plan)
                events = build_events(self.spec, plan, timeline)
                state = _NodeState(
                    plan=plan,
                    timeline=timeline,
                    events=events,
                    event_times=[e.ts_s for e in events.events],
                    energy=[EnergyLedger(timeline.jobs, gpu) for gpu in plan.gpus],
                    links=build_links(self.spec, plan, timeline),
                    traffic=TrafficLedger(timeline.jobs),
                )
                self._states[node] = state
        return state

    def _slice(self, state: _NodeState, t0: datetime, t1: datetime) -> list[SimEvent]:
        lo = bisect.bisect_right(state.event_times, self.seconds(t0))
        hi = bisect.bisect_right(state.event_times, self.seconds(t1))
        return state.events.events[lo:hi]

    def _event(self, plan: NodePlan, event: SimEvent) -> Event:
        gpu = plan.gpus[event.gpu]
        return Event(
            kind=event.kind,
            ts=self.at(event.ts_s),
            uuid=gpu.uuid,
            pci_bus_id=gpu.pci_bus_id,
            xid=event.xid,
            message=event.message,
            pid=event.pid,
            process=event.process,
        )

    # Read-only views for ground truth and emitters (same package).
    @property
    def plans(self) -> list[NodePlan]:
        return self._nodes

    def node_state(self, node: str) -> tuple[NodeTimeline, NodeEvents]:
        state = self._state(node)
        return state.timeline, state.events

    def node_links(self, node: str) -> NodeLinks:
        return self._state(node).links
