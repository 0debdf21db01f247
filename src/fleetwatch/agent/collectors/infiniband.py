"""InfiniBand and RoCE adapter ports, read from ``/sys/class/infiniband`` every interval.

A GPU node's training traffic crosses these ports; a link that drops to Polling, a rate that falls
from 400 to 40 Gb/s, or counters that climb (symbol errors, link downs, RoCE retransmits) are
what slows or stops a job long before any GPU reports a fault. Reading sysfs costs a few hundred
small file reads per interval and needs no tool or library (see ``benchmarks/ib_collector.py``).
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import ClassVar

from pydantic import ValidationError

from fleetwatch.agent.collectors.base import Collection
from fleetwatch.agent.parsers.infiniband_sysfs import SYSFS_INFINIBAND, read_infiniband_tree
from fleetwatch.telemetry import PortSample

__all__ = ["InfinibandCollector"]

logger = logging.getLogger(__name__)


class InfinibandCollector:
    name: ClassVar[str] = "infiniband"

    def __init__(self, root: Path = SYSFS_INFINIBAND) -> None:
        self._root = root
        self._last_problems: list[str] = []
        self.errors: Counter[tuple[str, str]] = Counter()

    def collect(self, now: datetime) -> Collection:
        tree = read_infiniband_tree(self._root)
        problems = [str(problem) for problem in tree.problems]
        ports = []
        for port in tree.ports:
            try:
                ports.append(
                    PortSample(
                        device=port.device,
                        port=port.port,
                        ts=now,
                        counters=port.counters,
                        hw_counters=port.hw_counters,
                        **port.values,
                    )
                )
            except ValidationError as exc:
                # The parser keeps to the wire's bounds; should one differ, lose the port, not
                # the GPUs' readings of this cycle.
                problems.append(f"{port.device} port {port.port}: not sendable: {exc}")
        if problems:
            self.errors[(self.name, "parse_error")] += len(problems)
        if problems != self._last_problems:
            # Once per change, not every interval: a file that never parses is one warning.
            for problem in problems:
                logger.warning("infiniband: %s; left out", problem)
            self._last_problems = problems
        return Collection(ports=ports)

    def close(self) -> None:
        pass
