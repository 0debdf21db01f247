"""What the health rules read and write: one GPU's samples in, :class:`HealthVerdict` list out.

:class:`GpuEvidence` holds one GPU's samples (oldest first) as of ``now`` and answers the two
questions every rule asks: the newest reading of a field (:meth:`GpuEvidence.latest`) and a
counter's increase over a trailing window (:meth:`GpuEvidence.window`). A :class:`Rule` is what a
verdict says whatever its evidence; :meth:`GpuEvidence.emit` adds one verdict of a rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from fleetwatch.rules.rates import CounterReading, counter_rates
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.rules.xid_catalog import Action, Severity
from fleetwatch.telemetry import GpuSample

__all__ = ["BootSample", "GpuEvidence", "HealthVerdict", "Rule", "at_sample"]


class BootSample(NamedTuple):
    """A sample with the ``boot_id`` of the node when it was taken (``None``: unknown)."""

    boot_id: str | None
    sample: GpuSample


@dataclass(frozen=True)
class HealthVerdict:
    """One decision about one GPU from its telemetry (vocabulary shared with ``XidVerdict``)."""

    gpu: str  # UUID
    rule: str
    action: Action
    severity: Severity
    counts_against_gpu: bool
    source: str  # where the threshold applied comes from
    evidence: Mapping[str, Any] = field(default_factory=dict)  # values, times, rates, threshold
    first_seen: datetime | None = None
    last_seen: datetime | None = None
    note: str = ""


@dataclass(frozen=True)
class Rule:
    """What every verdict of one rule says: its action, severity and the source it follows."""

    name: str
    action: Action
    severity: Severity
    counts_against_gpu: bool
    source: str
    note: str = ""

    def verdict(
        self,
        gpu: str,
        evidence: Mapping[str, Any],
        *,
        first: datetime | None = None,
        last: datetime | None = None,
    ) -> HealthVerdict:
        """This rule's verdict about ``gpu`` (its UUID), on ``evidence``."""
        return HealthVerdict(
            gpu,
            self.name,
            self.action,
            self.severity,
            self.counts_against_gpu,
            self.source,
            evidence,
            first_seen=first,
            last_seen=last,
            note=self.note,
        )


def at_sample(at: BootSample, **values: Any) -> dict[str, Any]:
    """Evidence read from one sample: ``values`` with the sample's time and boot."""
    return {**values, "ts": at.sample.ts, "boot_id": at.boot_id}


class GpuEvidence:
    """One GPU's samples, oldest first, up to ``now``; collects the verdicts of the rules."""

    def __init__(self, series: list[BootSample], t: HealthThresholds, now: datetime) -> None:
        self.series = series
        self.t = t
        self.now = now
        self.uuid = series[-1].sample.uuid
        self.out: list[HealthVerdict] = []

    def emit(
        self,
        rule: Rule,
        evidence: Mapping[str, Any],
        *,
        first: datetime | None = None,
        last: datetime | None = None,
    ) -> None:
        self.out.append(rule.verdict(self.uuid, evidence, first=first, last=last))

    def latest(self, name: str, *, volatile: bool) -> tuple[Any, BootSample] | None:
        """Newest present value of ``name``; None if absent throughout or, for a volatile field,
        reset since (a later sample from another boot)."""
        for i in range(len(self.series) - 1, -1, -1):
            value = getattr(self.series[i].sample, name)
            if value is None:
                continue
            if volatile and self._rebooted_after(i):
                return None
            return value, self.series[i]
        return None

    def _rebooted_after(self, i: int) -> bool:
        boot = self.series[i].boot_id
        return boot is not None and any(
            s.boot_id is not None and s.boot_id != boot for s in self.series[i + 1 :]
        )

    def window(self, name: str, window_s: float) -> dict[str, Any] | None:
        """Increase of counter ``name`` over the ``window_s`` before now, via counter_rates (a
        reset counts the post-reset value only, never a negative or full-counter jump). None
        when the field was never reported in the window."""
        since = self.now - timedelta(seconds=window_s)
        readings = [
            CounterReading(s.sample.ts, s.boot_id, getattr(s.sample, name)) for s in self.series
        ]
        in_window = [r for r in counter_rates(readings) if r["ts"] > since]
        if not in_window:
            return None
        increase = sum(r["increase"] for r in in_window)
        return {
            "increase": increase,
            "window_s": window_s,
            "per_s": increase / window_s,
            "from": in_window[0]["ts"],
            "to": in_window[-1]["ts"],
            "resets": sum(1 for r in in_window if r["reset"]),
            "first_increase": next((r["ts"] for r in in_window if r["increase"] > 0), None),
        }
