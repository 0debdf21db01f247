"""Large allocations of a server process mapped on their own, so that freeing one frees its pages.

glibc serves an allocation of at least ``M_MMAP_THRESHOLD`` bytes with a mapping of its own,
returned to the system when freed; a smaller one from an arena's heap, where freed memory stays
with the process until the top of the heap is free. The threshold starts at 128 KiB and grows
to the size of each mapped block freed, up to 32 MiB: after the first large NumPy array is freed,
every array up to that size (a column of the judge's windows, a decoded chunk of samples, the
scores of a fleet) is carved out of the heaps. A process that builds and drops such arrays in
several threads at once (the background passes of a leader) leaves holes between them that
later arrays of other sizes do not fit, and its resident memory keeps the high-water mark of
all of them. Fixing the threshold (which also stops glibc adjusting it) sends every array above
it to a mapping of its own: resident memory then follows the arrays alive, at the price of a
system call and fresh pages per array (about 5 ms per 45 MB allocated and touched here).
"""

from __future__ import annotations

from fleetwatch.server.mallopt import set_mallopt

__all__ = ["ENVIRONMENT_KEY", "fix_mmap_threshold"]

ENVIRONMENT_KEY = "MALLOC_MMAP_THRESHOLD_"  # glibc's own variable (with the trailing _)
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


def fix_mmap_threshold(threshold_bytes: int) -> bool:
    """Map every allocation of ``threshold_bytes`` or more on its own, in this process (call
    before it starts threads) and in the processes it starts; whether it is set. 0, a platform
    other than glibc's, or an operator's own ``MALLOC_MMAP_THRESHOLD_`` (glibc applied it at
    start) leave malloc as it is."""
    return set_mallopt(_M_MMAP_THRESHOLD, threshold_bytes, ENVIRONMENT_KEY)
