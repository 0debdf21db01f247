"""A server process's memory tuning in one place: glibc's malloc and Python's garbage collector.

None of it changes what the server does, only what its memory and its pauses cost at fleet
scale (``malloc_arenas``, ``malloc_mmap_threshold_kb`` and ``gc_gen0_threshold``; 0 leaves each
as it was). It happens at two moments because the two reach uvicorn's worker processes in two
ways:

- :func:`tune_malloc`, by ``fleetwatch server`` before uvicorn starts a thread: glibc reads its
  ``MALLOC_*`` variables once, at a process's start, so the server sets the parameters on itself
  and exports them for the workers it spawns (:mod:`fleetwatch.server.malloc_arenas`,
  :mod:`fleetwatch.server.malloc_mmap`).
- :func:`tune_garbage_collector`, by every process that builds the app, as its lifespan starts:
  the collector's thresholds belong to one interpreter, and a spawned worker starts with
  Python's own.
"""

from __future__ import annotations

import gc

from fleetwatch.config import ServerSettings
from fleetwatch.server.malloc_arenas import limit_malloc_arenas
from fleetwatch.server.malloc_mmap import fix_mmap_threshold

__all__ = ["tune_garbage_collector", "tune_malloc"]


def tune_malloc(settings: ServerSettings) -> None:
    """Fewer malloc arenas and large allocations mapped on their own, here and in the processes
    this one starts (call before it starts a thread)."""
    limit_malloc_arenas(settings.malloc_arenas)
    fix_mmap_threshold(settings.malloc_mmap_threshold_kb * 1024)


def tune_garbage_collector(settings: ServerSettings) -> None:
    """Fewer collections in a server process: with a 100,000-GPU fleet's windows, snapshot and
    caches in memory, each full collection walks millions of objects (about 0.25 s measured at
    20,000 GPUs, paid by whichever pass triggered it: most of a planner pass). The older
    generations keep Python's ratios, so a full collection still follows the young ones."""
    if settings.gc_gen0_threshold > 0:
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(settings.gc_gen0_threshold, gen1, gen2)
