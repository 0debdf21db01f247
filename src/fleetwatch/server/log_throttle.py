"""Log lines about what a client may repeat at will, at most one a minute per kind.

A line per silent connection or aborted upload is a line an attacker (or a fleet of rebooting
nodes) can make the server write as fast as it can open connections: the log would flood and
bury everything else. The counters on ``/metrics`` count every one; the log says that it
happens, and how often it was held back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

__all__ = ["ThrottledLog"]


class ThrottledLog:
    """At most one line per key every ``every_s`` seconds; the next line written for a key says
    how many were held back since the last one. Not thread-safe: for one event loop's callbacks."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        every_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._every_s = every_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def log(self, level: int, key: str, message: str, *args: Any) -> bool:
        """Write the line unless one with this key was written less than ``every_s`` ago;
        whether it was written."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._every_s:
            self._held[key] = self._held.get(key, 0) + 1
            return False
        self._last[key] = now
        held = self._held.pop(key, 0)
        if held:
            message += " (%d more like it not logged since the last such line)"
            args = (*args, held)
        self._logger.log(level, message, *args)
        return True
