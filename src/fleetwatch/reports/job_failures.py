"""Whether a failed job was interrupted by hardware: a failure of one of its nodes near its end.

A job that ended ``failed`` at ``t`` is attributed to a node failure when one of the nodes it ran
on had a hardware failure in ``[t - before, t + after]``: a GPU lifetime that ended in a failure,
or a drain by a rule (an Xid, host or port rule; not a risk or straggler drain). ``before`` is the
wider side because a job usually notices a dead peer only when a collective times out; ``after``
covers a failure recorded a little after the job gave up (the agent's next push, the rule pass).
The nearest such failure is the one named.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

__all__ = ["NodeFailure", "attribute_failure", "failures_by_node"]


@dataclass(frozen=True)
class NodeFailure:
    node: str
    at: datetime
    kind: str  # "gpu_failure" | "drain"
    detail: str


def failures_by_node(failures: Iterable[NodeFailure]) -> dict[str, list[NodeFailure]]:
    """Failures grouped by node, each list sorted by time (what :func:`attribute_failure` takes)."""
    out: dict[str, list[NodeFailure]] = {}
    for f in failures:
        out.setdefault(f.node, []).append(f)
    for found in out.values():
        found.sort(key=lambda f: f.at)
    return out


def attribute_failure(
    nodes: Sequence[str],
    ended_at: datetime,
    by_node: Mapping[str, list[NodeFailure]],
    *,
    before: timedelta,
    after: timedelta,
) -> NodeFailure | None:
    """The failure of one of ``nodes`` nearest ``ended_at`` within the window; None if none."""
    best: NodeFailure | None = None
    lo, hi = ended_at - before, ended_at + after
    for node in nodes:
        found = by_node.get(node, [])
        i = bisect.bisect_left(found, lo, key=lambda f: f.at)
        for f in found[i:]:
            if f.at > hi:
                break
            if best is None or abs(f.at - ended_at) < abs(best.at - ended_at):
                best = f
    return best
