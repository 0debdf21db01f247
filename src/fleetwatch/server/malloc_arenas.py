"""Fewer glibc malloc arenas in a server process: most of its memory, for no CPU.

glibc gives each new thread its own malloc arena, up to 8 per core. A server process runs
dozens of threads (uvicorn's thread pool, the ingest group writer, the background jobs), and
memory freed in one arena is not reused by another: at fleet scale the arenas hold hundreds of
megabytes that no object uses. Measured in the 100,000-GPU benchmark (``fleet_scale.py
--no-prometheus --duration 300``, benchmarks/HISTORY.md): peak RSS of the two server
processes 2.61 and 2.42 GiB with glibc's default, 2.02 GiB with two arenas, the same CPU per
row.

Python's own small objects live in pymalloc's arenas, which this does not touch; what goes
through malloc is every object over 512 bytes and what C extensions allocate (NumPy arrays,
the database driver's buffers).
"""

from __future__ import annotations

from fleetwatch.server.mallopt import set_mallopt

__all__ = ["ENVIRONMENT_KEY", "limit_malloc_arenas"]

ENVIRONMENT_KEY = "MALLOC_ARENA_MAX"
_M_ARENA_MAX = -8  # glibc's mallopt parameter number


def limit_malloc_arenas(arenas: int) -> bool:
    """At most ``arenas`` malloc arenas in this process (call before it starts threads) and in
    the processes it starts; whether the limit is set. 0, a platform other than glibc's, or an
    operator's own ``MALLOC_ARENA_MAX`` (glibc applied it at start) leave malloc as it is."""
    return set_mallopt(_M_ARENA_MAX, arenas, ENVIRONMENT_KEY)
