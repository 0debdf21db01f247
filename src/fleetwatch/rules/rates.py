"""Rates of cumulative GPU counters, robust to counter resets.

Counters are stored as read. A driver reload or reboot restarts volatile counters from zero, so a
naive difference would go negative. Between two consecutive readings of one GPU:

- same boot and the value did not drop: ``rate = (v2 - v1) / (t2 - t1)``;
- the value dropped, or the node's ``boot_id`` changed: the counter restarted somewhere in between,
  and at least ``v2`` errors happened since, so ``rate = v2 / (t2 - t1)`` (Prometheus' ``rate()``
  makes the same choice) and the point is marked ``reset``.

A rate is therefore never negative, and a reset is visible instead of silently smoothed over.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

__all__ = ["CounterReading", "counter_rates"]


class CounterReading(NamedTuple):
    ts: datetime
    boot_id: str | None
    value: int | None


def counter_rates(readings: Sequence[CounterReading]) -> list[dict[str, Any]]:
    """Per-second rates between consecutive readings (sorted by time; missing values skipped)."""
    present = [r for r in readings if r.value is not None]
    out: list[dict[str, Any]] = []
    for before, after in zip(present, present[1:], strict=False):
        seconds = (after.ts - before.ts).total_seconds()
        if seconds <= 0:
            continue
        assert before.value is not None and after.value is not None
        rebooted = (
            before.boot_id is not None
            and after.boot_id is not None
            and before.boot_id != after.boot_id
        )
        reset = rebooted or after.value < before.value
        increase = after.value if reset else after.value - before.value
        out.append(
            {"ts": after.ts, "per_s": increase / seconds, "increase": increase, "reset": reset}
        )
    return out
