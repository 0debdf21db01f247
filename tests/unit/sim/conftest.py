"""Shared fixtures: the demo-sized fleet (16 nodes x 8 GPUs) at a fixed real start."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from fleetwatch.sim import FleetSpec, SimFleet

REAL_START = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)


def _make_spec(seed: int = 1, speed: float = 60.0, **fields: Any) -> FleetSpec:
    return FleetSpec.live(seed=seed, real_start=REAL_START, speed=speed, **fields)


@pytest.fixture(scope="session")
def make_spec() -> Callable[..., FleetSpec]:
    """``make_spec(seed=1, speed=60.0, **fields)``: a live spec starting at REAL_START."""
    return _make_spec


@pytest.fixture(scope="session")
def spec() -> FleetSpec:
    return _make_spec()


@pytest.fixture(scope="session")
def fleet(spec: FleetSpec) -> SimFleet:
    return SimFleet(spec)


@pytest.fixture(scope="session")
def truth(fleet: SimFleet) -> dict[str, Any]:
    return fleet.ground_truth()
