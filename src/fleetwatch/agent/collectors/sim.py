"""The ``sim`` collector: one node of a simulated fleet, as if read from its GPUs.

Each agent process builds its own :class:`~fleetwatch.sim.fleet.SimFleet` from the shared spec
file and reports the node it is named after; the fleet is deterministic, so N agents tell one
consistent story without talking to each other.

Each collection carries the node's GPU samples and its network adapter ports (``Batch.ports``),
both read at the same simulated instant.

Time: ``collect(now)`` maps the real ``now`` onto simulated time
(``start + (now - real_start) * speed``, capped at ``now``) and stamps samples and events with
the *simulated* time, always. With ``speed == 1`` and a spec from ``FleetSpec.live`` that is the
real time; with ``speed > 1`` it runs from a start in the past and never passes the real clock,
so the server never sees a timestamp from the future.

Silence: while the node is silent (a reboot, an outage, a hang after a failure) ``collect``
returns nothing, except at the first tick of a silence: the events that happened before it began
(the fatal Xid of a node that then hung) are still returned, as the real agent would have pushed
a critical event at once. Events that happen during an outage arrive after it, with their own
timestamps, as a spooled kernel log would deliver them. The first ``collect`` returns no past
events: a collector starts at the end of the log, like ``dmesg --follow``.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import ClassVar

from pydantic import ValidationError

from fleetwatch.agent.collectors.base import Collection
from fleetwatch.config import AgentSettings
from fleetwatch.errors import ConfigError
from fleetwatch.sim.fleet import SimFleet
from fleetwatch.sim.spec import FleetSpec

__all__ = ["SimCollector"]


class SimCollector:
    name: ClassVar[str] = "sim"

    def __init__(self, spec: FleetSpec, node: str, *, fleet: SimFleet | None = None) -> None:
        self._fleet = fleet if fleet is not None else SimFleet(spec)
        names = self._fleet.node_names()
        if node not in names:
            shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            raise ConfigError(
                f"node {node!r} is not in the simulated fleet ({len(names)} nodes: {shown}); "
                "set node_name to one of them"
            )
        self._node = node
        self._cursor: datetime | None = None

    @classmethod
    def from_spec_file(cls, path: Path, node: str) -> SimCollector:
        """The collector for ``node`` in the fleet whose spec (``fleet.json``) is at ``path``."""
        try:
            spec = FleetSpec.load(path)
        except OSError as exc:
            raise ConfigError(f"cannot read sim_spec {path}: {exc}") from exc
        except ValidationError as exc:
            raise ConfigError(f"sim_spec {path} is not a fleet spec: {exc}") from exc
        return cls(spec, node)

    @classmethod
    def from_settings(cls, settings: AgentSettings) -> SimCollector:
        """The collector for ``settings.node_name`` in the fleet of ``settings.sim_spec``."""
        if settings.sim_spec is None:
            raise ConfigError("the sim collector needs sim_spec (a fleet.json from `sim init`)")
        return cls.from_spec_file(settings.sim_spec, settings.node_name)

    @property
    def fleet(self) -> SimFleet:
        return self._fleet

    @property
    def node(self) -> str:
        return self._node

    @property
    def labels(self) -> dict[str, str]:
        """The node's place: cluster, row, rack, position (for ``NodeInfo.labels``)."""
        return self._fleet.labels(self._node)

    def boot_id(self, now: datetime) -> str:
        """The simulated node's boot id at real time ``now`` (for ``NodeInfo.boot_id``)."""
        return self._fleet.boot_id(self._node, self._fleet.sim_time(now))

    def collect(self, now: datetime) -> Collection:
        fleet, node = self._fleet, self._node
        t = fleet.sim_time(now)
        since = self._cursor if self._cursor is not None else t
        silence = fleet.silence(node, t)
        if silence is not None:
            until = min(t, silence[0])
            if until <= since:
                return Collection()
            self._cursor = until
            return Collection(events=fleet.events(node, since, until))
        samples = fleet.sample(node, t)
        present = {sample.uuid for sample in samples}
        gpus = [gpu for gpu in fleet.identities(node) if gpu.uuid in present]
        events = fleet.events(node, since, t) if t > since else []
        self._cursor = max(since, t)
        return Collection(gpus=gpus, samples=samples, events=events, ports=fleet.ports(node, t))

    def close(self) -> None:
        """Nothing to release: the simulation holds no files or devices."""
