"""A rule verdict about one GPU, in one vocabulary for the Xid, telemetry and host rules.

What a judgement of the fleet (:mod:`fleetwatch.server.judge.judging`) gives each GPU, what a
snapshot holds, the API serves and the planner and alerts act on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from fleetwatch.rules.health import HealthVerdict
from fleetwatch.rules.host_errors import HostVerdict
from fleetwatch.rules.xid import XidVerdict

__all__ = ["Verdict"]


@dataclass(frozen=True)
class Verdict:
    """A rule verdict about one GPU, Xid, telemetry or host error, in one vocabulary."""

    kind: Literal["xid", "health", "host"]
    rule: str
    severity: str
    action: str
    counts_against_gpu: bool
    source: str  # the catalogue row or threshold default that decided it
    first_seen: datetime | None
    last_seen: datetime | None
    xids: tuple[int, ...] = ()
    evidence: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""

    @property
    def takes_gpu_out(self) -> bool:
        """A fact, not a probability: the GPU is failed or must leave service now. A critical
        host verdict (its node's fabric, CPU, memory or a network port failed) takes it out
        without counting against it."""
        takes_out = self.counts_against_gpu or self.kind == "host"
        return takes_out and self.severity in ("critical", "fatal")

    @classmethod
    def from_xid(cls, v: XidVerdict) -> Verdict:
        evidence = {
            "count": v.count,
            "event_counts": dict(v.event_counts),
            "timestamps": [t.isoformat() for t in v.timestamps],
            "follow_ons": dict(v.follow_ons),
            "processes": list(v.processes),
            "known": v.known,
        }
        return cls("xid", **_shared(v), xids=v.xids, evidence=evidence)

    @classmethod
    def from_health(cls, v: HealthVerdict) -> Verdict:
        return cls("health", **_shared(v), evidence=_jsonable(v.evidence))

    @classmethod
    def from_host(cls, v: HostVerdict) -> Verdict:
        evidence = {
            "scope": v.scope,
            "component": v.component,
            "count": v.count,
            "timestamps": [t.isoformat() for t in v.timestamps],
            **v.evidence,
        }
        return cls("host", **_shared(v), evidence=_jsonable(evidence))


def _shared(v: XidVerdict | HealthVerdict | HostVerdict) -> dict[str, Any]:
    """The fields every kind of verdict has in common."""
    return {
        "rule": v.rule,
        "severity": v.severity,
        "action": v.action,
        "counts_against_gpu": v.counts_against_gpu,
        "source": v.source,
        "first_seen": v.first_seen,
        "last_seen": v.last_seen,
        "note": v.note,
    }


def _jsonable(value: Any) -> Any:
    """Evidence as JSON can hold it: times as ISO 8601 (evictions and alerts store it as JSON)."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    return value
