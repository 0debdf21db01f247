"""Setting one of glibc's malloc parameters in a server process and the processes it starts.

glibc reads its ``MALLOC_*`` variables once, at a process's start; a server sets the parameter on
itself through ``mallopt`` (before it starts threads) and exports the variable, so that the
worker processes it spawns start with the same setting. An operator's own variable with another
value was applied by glibc already, and wins.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

__all__ = ["set_mallopt"]

logger = logging.getLogger(__name__)


def set_mallopt(parameter: int, value: int, environment_key: str) -> bool:
    """``mallopt(parameter, value)`` here and ``environment_key=value`` for the processes this
    one starts; whether it is set. 0, a platform other than glibc's, or an operator's own
    ``environment_key`` with another value leave malloc as it is."""
    if value <= 0 or not sys.platform.startswith("linux"):
        return False
    if os.environ.get(environment_key, str(value)) != str(value):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # a C library without mallopt (musl)
        return False
    if mallopt(parameter, value) != 1:
        logger.warning("could not set malloc parameter %s to %d", environment_key, value)
        return False
    os.environ[environment_key] = str(value)  # worker processes, spawned fresh, read it at start
    return True
