"""Whether a node is up: it is unreachable once nothing arrived for N of its own intervals.

Silence counts only while the server was up to hear it. A server process that just started (after
a restart, an upgrade, an outage of its own) heard nothing while it was down, so a node's
unreachable clock starts at ``max(last_seen, heard_since)``, where ``heard_since`` is when this
process started. Each process knows its own start: a worker that has been up for long keeps
judging by ``last_seen`` alone while an API replica restarts, and a freshly started worker gives
every node its intervals before calling it unreachable. A node silent past its deadline by
``last_seen`` but not yet past it since ``heard_since`` is *unheard*: neither up nor unreachable,
so nothing is fired, resolved, evicted or cancelled for it until the grace ends.
"""

from __future__ import annotations

from datetime import datetime, timedelta

__all__ = ["is_unheard", "node_state", "unreachable_deadline"]


def unreachable_deadline(
    last_seen: datetime, interval_s: float, factor: float, heard_since: datetime | None = None
) -> datetime:
    start = last_seen if heard_since is None else max(last_seen, heard_since)
    return start + timedelta(seconds=interval_s * factor)


def node_state(
    last_seen: datetime,
    interval_s: float,
    factor: float,
    now: datetime,
    heard_since: datetime | None = None,
) -> str:
    deadline = unreachable_deadline(last_seen, interval_s, factor, heard_since)
    return "unreachable" if now > deadline else "up"


def is_unheard(
    last_seen: datetime, interval_s: float, factor: float, now: datetime, heard_since: datetime
) -> bool:
    """Silent past its deadline by ``last_seen``, but the server has not listened that long."""
    silent = node_state(last_seen, interval_s, factor, now) == "unreachable"
    return silent and node_state(last_seen, interval_s, factor, now, heard_since) == "up"
