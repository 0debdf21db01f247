"""The limits on a server process's client connections, and how it counts and tells enforcing them.

A connection holds a file descriptor until it closes. uvicorn alone waits as long as a client
likes for a request's head and body, and accepts connections until the process runs out of
descriptors: about 20,000 silent connections left a server answering nobody, with nothing in its
log. So each process holds at most ``http_max_connections`` (the next is answered 503 and
closed), and closes a connection whose request head or body is late, or that idles kept alive.
:mod:`fleetwatch.server.http_protocol` enforces this on each connection; this is the process's
side of it: the limits, the count of open connections, the counters on ``/metrics`` and one
throttled line per kind of close.

The app builds one :class:`ConnectionGuard` per process in its lifespan and hands it to the
connections through the lifespan state (``LIFESPAN_KEY``): uvicorn passes that state to each
connection's protocol. Each worker process enforces and counts its own.
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fleetwatch.config import ServerSettings
from fleetwatch.server.log_throttle import ThrottledLog
from fleetwatch.server.runtime.metric_families import ServerMetrics

__all__ = [
    "FD_RESERVE",
    "LIFESPAN_KEY",
    "ConnectionGuard",
    "ConnectionLimits",
    "connection_cap",
    "open_files_limit",
]

logger = logging.getLogger(__name__)

LIFESPAN_KEY = "fleetwatch.connection_guard"
# Descriptors kept for everything but client connections: the database pool and SQLite's files,
# the log, the listening socket, the refusal itself.
FD_RESERVE = 256


def open_files_limit() -> int | None:
    """This process's soft limit on open files; None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def connection_cap(configured: int, fd_limit: int | None) -> int:
    """``configured``, lowered to ``FD_RESERVE`` descriptors short of ``fd_limit``: a cap the
    process cannot reach protects nothing."""
    if fd_limit is None:
        return configured
    return max(1, min(configured, fd_limit - FD_RESERVE))


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float
    body_timeout_s: float
    idle_timeout_s: float
    max_connections: int

    @classmethod
    def from_settings(cls, settings: ServerSettings, fd_limit: int | None) -> ConnectionLimits:
        cap = connection_cap(settings.http_max_connections, fd_limit)
        if cap < settings.http_max_connections:
            logger.info(
                "http_max_connections lowered from %d to %d: this process may open %d files",
                settings.http_max_connections,
                cap,
                fd_limit,
            )
        return cls(
            header_timeout_s=settings.http_header_timeout_s,
            body_timeout_s=settings.http_body_timeout_s,
            idle_timeout_s=settings.http_idle_timeout_s,
            max_connections=cap,
        )


# What each timeout's line says; an idle keep-alive closing is routine and not logged.
_TIMEOUT_LINES = {
    "header_timeout": "closed a connection from %s: its request's head was not in after the "
    "header timeout (%g s, http_header_timeout_s)",
    "body_timeout": "closed a connection from %s: its request's body was not in after the "
    "body timeout (%g s, http_body_timeout_s)",
}


class ConnectionGuard:
    """One process's connection count, and its counters and lines. Called from the event loop
    only (the protocol's callbacks and the app's exception handlers)."""

    def __init__(
        self,
        limits: ConnectionLimits,
        metrics: ServerMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self.open = 0
        self._closed = metrics.http_connections_closed
        self._aborted = metrics.http_requests_aborted
        metrics.http_connections_open.set_function(lambda: self.open)
        self._log = ThrottledLog(logger, clock=clock)

    def opened(self, client: Any) -> bool:
        """Count a new connection in; False (counted and told) when it is one too many."""
        if self.open >= self.limits.max_connections:
            self._closed.labels("limit").inc()
            self._log.log(
                logging.WARNING,
                "limit",
                "refused a connection from %s with 503: the connection limit (%d, "
                "http_max_connections) is reached",
                _address(client),
                self.limits.max_connections,
            )
            return False
        self.open += 1
        return True

    def closed(self) -> None:
        """A connection counted in by :meth:`opened` is gone."""
        self.open -= 1

    def timed_out(self, reason: str, client: Any) -> None:
        """A connection closed at one of the timeouts (``header_timeout``, ``body_timeout`` or
        ``idle``)."""
        self._closed.labels(reason).inc()
        line = _TIMEOUT_LINES.get(reason)
        if line is not None:
            timeout = getattr(self.limits, f"{reason}_s")
            self._log.log(logging.WARNING, reason, line, _address(client), timeout)

    def aborted(self, route: str, client: Any) -> None:
        """A request's client left before sending its whole body."""
        self._aborted.labels(route).inc()
        self._log.log(
            logging.INFO,
            "aborted",
            "the connection of %s closed before the whole body of its request to %s was in "
            "(an aborted upload, or one cut at the body timeout)",
            _address(client),
            route,
        )


def _address(client: Any) -> str:
    """``host:port`` of an ASGI client or a protocol's peer, a tuple or a starlette Address."""
    if client is None:
        return "unknown"
    host, port = client[0], client[1]
    return f"{host}:{port}"
