"""Seeded randomness that every process reproduces on its own.

Everything random in the simulator comes from a numpy ``Generator`` on a *substream*: a
``SeedSequence`` built from the fleet's seed and a path of integers (a stream tag, then the node's
and the GPU's index). Each GPU's fate therefore depends on the seed and its own place only: an
agent process that simulates one node draws exactly what a process simulating the whole fleet
draws for that node, and adding nodes does not change the existing ones.

Readings that jitter from one tick to the next use :func:`unit_noise`, a stateless hash of
(key, tick, field), so that a reading at time ``t`` is the same whichever process asks, in
whatever order.
"""

from __future__ import annotations

import uuid

import numpy as np

__all__ = ["Stream", "new_uuid", "substream", "unit_noise"]


class Stream:
    """Tags of the independent substreams; never renumber (a saved spec would change meaning)."""

    NODE = 1  # SKU, install time and placement jitter of a node
    GPU = 2  # identity, batch, covariates and fate of a GPU
    TIMELINE = 3  # reboots, outages, jobs, stragglers of a node (one sub-path each)
    APP_FAULTS = 4  # application Xids of a node
    NVLINK = 5  # NVLink CRC bursts of a node
    PRECURSORS = 6  # warning events of a GPU that will fail
    SPURIOUS = 7  # false alarms (isolated row remaps) of a node
    LINKS = 8  # network adapter ports of a node and their link faults


def substream(seed: int, *path: int) -> np.random.Generator:
    """The generator for ``path`` (e.g. ``Stream.GPU, node, gpu``) under ``seed``."""
    return np.random.default_rng(np.random.SeedSequence([seed, *path]))


def new_uuid(rng: np.random.Generator) -> uuid.UUID:
    """A version-4 UUID drawn from ``rng`` (``uuid.uuid4`` would differ per process)."""
    return uuid.UUID(bytes=rng.bytes(16), version=4)


_MASK = (1 << 64) - 1


def _mix(value: int) -> int:
    # splitmix64's finaliser: a bijection on 64-bit integers with good avalanche.
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def unit_noise(key: int, tick: int, field: int) -> float:
    """A uniform number in [0, 1) fixed by ``(key, tick, field)``."""
    return _mix(key ^ _mix((tick << 8) + field)) / 2.0**64
