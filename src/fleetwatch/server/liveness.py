"""Whether a node is up: it is unreachable once nothing arrived for N of its own intervals."""

from __future__ import annotations

from datetime import datetime, timedelta

__all__ = ["node_state", "unreachable_deadline"]


def unreachable_deadline(last_seen: datetime, interval_s: float, factor: float) -> datetime:
    return last_seen + timedelta(seconds=interval_s * factor)


def node_state(last_seen: datetime, interval_s: float, factor: float, now: datetime) -> str:
    return "unreachable" if now > unreachable_deadline(last_seen, interval_s, factor) else "up"
