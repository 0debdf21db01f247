"""Slurm through ``scontrol``: drain a node for an eviction, resume it when FleetWatch returns it.

What FleetWatch's drains look like in Slurm::

    scontrol --oneliner show node gpu02
    scontrol update NodeName=gpu02 State=DRAIN "Reason=fleetwatch: xid 79: GPU fell off the bus"
    scontrol update NodeName=gpu02 State=RESUME

Every command runs without a shell (an argument list), so the reason needs no shell quoting; it is
still made safe for Slurm: one line of printable characters, no double quotes or brackets (the
``[user@time]`` that ``show node`` appends is how the reason's end is found), at most
``MAX_REASON`` characters. A node counts as FleetWatch's only while its Reason starts with
``fleetwatch:``; any other DRAIN, DOWN or FAIL is someone else's and is never changed.

Maintenance (``slurm-sync --maintenance``): every reservation with the ``MAINT`` flag is a
FleetWatch maintenance window over its nodes (the hostlist expanded by ``scontrol show
hostnames``), from its StartTime to its EndTime, keyed ``slurm:<ReservationName>``::

    scontrol create reservation ReservationName=psu flags=maint nodes=gpu[01-02] \
        starttime=now duration=120 users=root

Slurm prints reservation times in the controller's local time without an offset; they are read
in this host's local time zone, which must be the controller's.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import ClassVar

from fleetwatch.adapters.client import Eviction
from fleetwatch.adapters.maintenance import MaintenancePlan
from fleetwatch.adapters.sync import BackendError, Hold, HoldKind
from fleetwatch.errors import ConfigError

__all__ = [
    "MAX_REASON",
    "REASON_PREFIX",
    "Scontrol",
    "SlurmBackend",
    "SlurmNode",
    "SlurmReservation",
    "drain_reason",
    "parse_reservations",
]

logger = logging.getLogger(__name__)

REASON_PREFIX = "fleetwatch:"
MAX_REASON = 160
# A Slurm hostlist expression (gpu[01-04], a,b) would drain many nodes: one plain name only.
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_STATE = re.compile(r"(?:^|\s)State=(\S+)")
_REASON = re.compile(r"(?:^|\s)Reason=(.*?)(?: \[[^\[\]\s]*@[^\[\]\s]*\]|$)")
_NOT_FOUND = re.compile(r"not found|invalid node name", re.IGNORECASE)
_FIELD = re.compile(r"(?:^|\s)(\w+)=(\S*)")


def drain_reason(reason: str, limit: int = MAX_REASON) -> str:
    """``fleetwatch: <reason>`` as one safe line of at most ``limit`` characters."""
    text = "".join(c if c.isprintable() else " " for c in reason)
    text = text.replace('"', "'").replace("[", "(").replace("]", ")")
    text = " ".join(text.split()) or "unhealthy"
    full = f"{REASON_PREFIX} {text}"
    return full if len(full) <= limit else full[: limit - 3].rstrip() + "..."


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str  # e.g. IDLE, IDLE+DRAIN, DOWN+NOT_RESPONDING
    reason: str = ""

    @property
    def flags(self) -> set[str]:
        return set(self.state.upper().rstrip("*~#$@^-!%").split("+"))

    @property
    def unavailable(self) -> bool:
        """Drained, draining, down or failed: out of service for whatever reason."""
        return bool(self.flags & {"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING"})

    @property
    def ours(self) -> bool:
        return self.reason.startswith(REASON_PREFIX)

    def hold(self) -> Hold:
        if not self.unavailable:
            return Hold(HoldKind.FREE, self.state)
        if self.ours and self.flags & {"DRAIN", "DRAINED", "DRAINING"}:
            return Hold(HoldKind.OURS, self.reason)
        return Hold(HoldKind.OTHER, f"{self.reason or 'no reason given'} (State={self.state})")


def parse_nodes(text: str) -> Iterator[SlurmNode]:
    """Nodes from ``scontrol --oneliner show node`` output, one per line."""
    for line in text.splitlines():
        if not line.startswith("NodeName="):
            continue
        name = line.split(None, 1)[0].removeprefix("NodeName=")
        state = _STATE.search(line)
        reason = _REASON.search(line)
        yield SlurmNode(
            name=name,
            state=state.group(1) if state else "UNKNOWN",
            reason=reason.group(1).strip() if reason else "",
        )


@dataclass(frozen=True)
class SlurmReservation:
    name: str
    nodes: str  # a hostlist expression, e.g. gpu[01-02]
    flags: frozenset[str]
    start: datetime | None
    end: datetime | None

    @property
    def maintenance(self) -> bool:
        return "MAINT" in self.flags


def _slurm_time(value: str | None) -> datetime | None:
    """A reservation time (local, no offset) in UTC; None for Unknown, None, or garbage."""
    try:
        return datetime.fromisoformat(value).astimezone(UTC) if value else None
    except ValueError:
        return None


def parse_reservations(text: str) -> Iterator[SlurmReservation]:
    """Reservations from ``scontrol --oneliner show reservation`` output, one per line."""
    for line in text.splitlines():
        if not line.startswith("ReservationName="):
            continue
        fields = dict(_FIELD.findall(line))
        yield SlurmReservation(
            name=fields["ReservationName"],
            nodes=fields.get("Nodes", ""),
            flags=frozenset(f for f in fields.get("Flags", "").upper().split(",") if f),
            start=_slurm_time(fields.get("StartTime")),
            end=_slurm_time(fields.get("EndTime")),
        )


class Scontrol:
    """Runs ``scontrol``; the cluster comes from its environment (``SLURM_CONF``) as usual."""

    def __init__(self, path: str = "scontrol", timeout_s: float = 30.0) -> None:
        found = shutil.which(path)
        if found is None:
            raise ConfigError(f"scontrol not found at {path!r}; install slurm-client or --scontrol")
        self.path = found
        self._timeout_s = timeout_s

    def run(self, *args: str) -> str:
        argv = [self.path, *args]
        logger.debug("running %s", argv)
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=self._timeout_s, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise BackendError(f"scontrol {' '.join(args)} timed out") from exc
        except OSError as exc:
            raise BackendError(f"scontrol could not run: {exc}") from exc
        if done.returncode != 0:
            message = " ".join((done.stderr or done.stdout).split()) or f"exit {done.returncode}"
            raise BackendError(message[:300])
        return done.stdout

    def show_node(self, name: str) -> SlurmNode | None:
        try:
            out = self.run("--oneliner", "show", "node", name)
        except BackendError as exc:
            if _NOT_FOUND.search(str(exc)):
                return None
            raise
        return next((n for n in parse_nodes(out) if n.name == name), None)

    def show_nodes(self) -> dict[str, SlurmNode]:
        return {node.name: node for node in parse_nodes(self.run("--oneliner", "show", "node"))}

    def show_reservations(self) -> list[SlurmReservation]:
        return list(parse_reservations(self.run("--oneliner", "show", "reservation")))

    def hostnames(self, hostlist: str) -> list[str]:
        """A hostlist expression (gpu[01-03],cpu1) as node names."""
        if not hostlist or hostlist == "(null)":
            return []
        return self.run("show", "hostnames", hostlist).split()

    def drain(self, name: str, reason: str) -> None:
        self.run("update", f"NodeName={name}", "State=DRAIN", f"Reason={reason}")

    def resume(self, name: str) -> None:
        self.run("update", f"NodeName={name}", "State=RESUME")


class SlurmBackend:
    """``NodeBackend`` for Slurm: hold = DRAIN with a ``fleetwatch:`` reason."""

    name: ClassVar[str] = "slurm"

    def __init__(self, scontrol: Scontrol) -> None:
        self._scontrol = scontrol

    def inspect(self, node: str) -> Hold:
        if not _NODE_NAME.match(node):
            return Hold(HoldKind.MISSING, "not a plain Slurm node name")
        found = self._scontrol.show_node(node)
        return found.hold() if found else Hold(HoldKind.MISSING)

    def snapshot(self) -> dict[str, Hold]:
        return {name: node.hold() for name, node in self._scontrol.show_nodes().items()}

    def hold(self, eviction: Eviction) -> None:
        self._scontrol.drain(eviction.node, drain_reason(eviction.reason))

    def release(self, node: str) -> None:
        self._scontrol.resume(node)

    def maintenance(self) -> dict[str, MaintenancePlan]:
        """Each MAINT reservation as a plan keyed ``slurm:<name>``."""
        plans = {}
        for resv in self._scontrol.show_reservations():
            if not resv.maintenance:
                continue
            nodes = tuple(sorted(self._scontrol.hostnames(resv.nodes)))
            reason = f"Slurm maintenance reservation {resv.name}"
            plans[f"slurm:{resv.name}"] = MaintenancePlan(nodes, reason, resv.start, resv.end)
        return plans
