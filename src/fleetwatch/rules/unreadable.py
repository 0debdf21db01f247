"""Events the rules cannot read: skipped, and named in one verdict about their node.

Ingest refuses an event whose ``details`` hold what the rules cannot read
(:mod:`fleetwatch.event_details`), but events stored before it did are still in databases: a
machine check whose bank is a list once made every assessment of its node raise, so a later
Xid 79 on that node gave no verdict (issue 35). The host-error and port rules therefore skip such
an event, judge the rest, and make one verdict about the node per family that names what they
skipped (kind, time, field and reason, the first :data:`MOST_NAMED`):

=========================  ===============================================  ==================
rule                       when                                             verdict
=========================  ===============================================  ==================
``unreadable_host_events`` an SXid, AER, MCE or EDAC event of the lookback  node, warning,
                           with a key the rules read holding something      investigate
                           else (a list for a bank, a count past the
                           most one event may count)
``unreadable_port_events`` the same for a network port event
=========================  ===============================================  ==================

It takes nothing out of service (the node's readable evidence decides that); the alerts send it
as its own kind, ``unreadable_evidence``, so that someone fixes what sent it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

from fleetwatch.event_details import details_problem
from fleetwatch.rules.host_evidence import HostVerdict

__all__ = [
    "MOST_NAMED",
    "UNREADABLE_HOST",
    "UNREADABLE_PORT",
    "UNREADABLE_RULES",
    "Unreadable",
    "readable_recent",
    "unreadable",
    "unreadable_verdict",
]

UNREADABLE_HOST = "unreadable_host_events"
UNREADABLE_PORT = "unreadable_port_events"
UNREADABLE_RULES = frozenset({UNREADABLE_HOST, UNREADABLE_PORT})
MOST_NAMED = 20  # skipped events named in one verdict (its count says how many in all)
_SOURCE = "FleetWatch wire format: fleetwatch.event_details (what the rules read of details)"


@dataclass(frozen=True)
class Unreadable:
    """One event skipped, and why."""

    kind: str
    ts: datetime
    field: str  # where in the event, e.g. details.bank
    reason: str

    def as_evidence(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "ts": self.ts.isoformat(),
            "field": self.field,
            "reason": self.reason,
        }


def unreadable(kind: str, ts: datetime, details: Mapping[str, Any] | None) -> Unreadable | None:
    """Why the rules cannot read this event's ``details``; None when they can."""
    problem = details_problem(kind, details)
    if problem is None:
        return None
    path, reason = problem
    return Unreadable(kind, ts, ".".join(["details", *map(str, path)]), reason)


class _Dated(Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def ts(self) -> datetime | None: ...
    @property
    def details(self) -> Mapping[str, Any] | None: ...


_E = TypeVar("_E", bound=_Dated)


def readable_recent(
    events: Iterable[_E],
    kinds: Collection[str],
    *,
    since: datetime,
    now: datetime,
    skipped: list[Unreadable],
) -> Iterator[tuple[_E, datetime]]:
    """The events of ``kinds`` from ``since`` on (an undated one counts as ``now``), each with its
    time, whose details the rules can read; the others of them are added to ``skipped``."""
    for event in events:
        if event.kind not in kinds:
            continue
        ts = event.ts if event.ts is not None else now
        if ts < since:
            continue
        problem = unreadable(event.kind, ts, event.details)
        if problem is not None:
            skipped.append(problem)  # stored before ingest checked it: named, not judged
            continue
        yield event, ts


def unreadable_verdict(rule: str, skipped: Sequence[Unreadable]) -> HostVerdict:
    """The verdict ``rule`` naming the events ``skipped`` (at least one)."""
    ordered = sorted(skipped, key=lambda u: (u.ts, u.kind, u.field))
    first = ordered[0]
    more = f" (and {len(ordered) - 1} more)" if len(ordered) > 1 else ""
    return HostVerdict(
        rule=rule,
        scope="node",
        component="host",
        action="investigate",
        severity="warning",
        counts_against_gpu=False,
        source=_SOURCE,
        count=len(ordered),
        first_seen=first.ts,
        last_seen=ordered[-1].ts,
        timestamps=tuple(u.ts for u in ordered[:MOST_NAMED]),
        evidence={"skipped": [u.as_evidence() for u in ordered[:MOST_NAMED]]},
        note=f"{first.kind} event of {first.ts.isoformat()} not judged: {first.field} "
        f"{first.reason}{more}; the node's other evidence is judged, fix what sent it",
    )
