"""The order the suite's tests are handed out in: the longest first.

``make test`` spreads the tests over xdist workers with ``--dist worksteal``: each worker starts on
a contiguous share of the collected order and an idle one steals from a busy one's queue. A test
of minutes collected late starts late, and the run then ends with one worker on it while the
others wait: a clean-clone run spent its last 4 % (about 10 minutes) that way. Handed out first,
the long tests overlap the thousands of short ones, which fill in around them.

``LONGEST`` names the tests that took 40 s or more in a loaded run (the container image's first
build, schemathesis, the multi-process and restart scenarios), longest first; every other test
that starts real processes (``slow``) follows them, then the rest, each group in the order it was
collected. Sorting is stable and depends on the collected ids alone, so every worker computes the
same order, which xdist requires.
"""

from __future__ import annotations

import pytest

__all__ = ["LONGEST", "longest_first"]

LONGEST = (
    "tests/integration/test_image_podman.py",
    "tests/faults/test_schemathesis.py",
    "tests/integration/test_many_processes_live.py",
    "tests/integration/test_stragglers_live.py",
    "tests/integration/test_restart_no_flap.py",
    "tests/integration/test_fleet_scale_smoke.py",
    "tests/benchmarks/test_benchmark_smoke.py::test_benchmark_smoke[urgent_lane]",
    "tests/faults/test_server_full_disk.py",
    "tests/benchmarks/test_benchmark_smoke.py::test_benchmark_smoke[remote_write]",
    "tests/unit/server/upkeep/test_retention.py::test_disk_stays_flat_once_retention_is_reached",
    "tests/integration/test_agent_outage.py",
    "tests/integration/test_remote_write_live.py",
)


def _rank(item: pytest.Item) -> tuple[int, int]:
    for position, prefix in enumerate(LONGEST):
        if item.nodeid.startswith(prefix):
            return 0, position
    return (1 if item.get_closest_marker("slow") else 2), 0


def longest_first(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place: ``LONGEST`` in its order, then ``slow``, then the rest."""
    items.sort(key=_rank)
