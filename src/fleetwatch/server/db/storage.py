"""A full disk under the database: recognising it in a driver error, and remembering it.

A write that fails because the disk is full becomes :class:`~fleetwatch.errors.StorageFull`
(507: nothing was stored, retry later) instead of a 500. :class:`StorageHealth` remembers the
failure so that ``/readyz`` says "not ready" while the storage is full, and watches the free space
of the SQLite file's filesystem; ``/metrics`` shows both (:class:`StorageCollector`).

What counts as "full":

- SQLite: ``SQLITE_FULL`` ("database or disk is full"), and ``SQLITE_IOERR`` ("disk I/O error",
  which SQLite reports for an ENOSPC on the WAL or its index) while the file's filesystem has
  almost no space left;
- PostgreSQL: SQLSTATE 53100 ``disk_full``, and any error reporting "No space left on device".
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from sqlalchemy.exc import DBAPIError

__all__ = ["DRIVER_ERRORS", "StorageCollector", "StorageHealth", "disk_full_reason", "free_bytes"]


def _driver_errors() -> tuple[type[Exception], ...]:
    # Raw driver errors too: the ingest path's COPY talks to psycopg directly.
    found: list[type[Exception]] = [DBAPIError, sqlite3.Error]
    try:
        import psycopg
    except ImportError:  # an install without PostgreSQL support
        pass
    else:
        found.append(psycopg.Error)
    return tuple(found)


DRIVER_ERRORS = _driver_errors()

_SQLITE_FULL = 13
_SQLITE_IOERR = 10
_PG_DISK_FULL = "53100"
_ENOSPC_TEXT = "No space left on device"
# An I/O error with less than this free is taken for ENOSPC (SQLite does not say which errno).
_IOERR_FULL_BELOW_BYTES = 1024 * 1024


def free_bytes(directory: Path) -> int | None:
    """Bytes an unprivileged writer may still use on ``directory``'s filesystem; None if unknown."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def disk_full_reason(exc: Exception, sqlite_dir: Path | None = None) -> str | None:
    """Why ``exc`` (SQLAlchemy's or the driver's own) means "the disk is full", or None."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    first_line = (str(orig).strip().splitlines() or [""])[0]
    if getattr(orig, "sqlstate", None) == _PG_DISK_FULL:
        return f"PostgreSQL disk_full, SQLSTATE 53100: {first_line}"
    if _ENOSPC_TEXT in str(orig):
        return first_line
    code = getattr(orig, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if primary == _SQLITE_FULL or "database or disk is full" in first_line:
        return "SQLite: database or disk is full"
    if primary == _SQLITE_IOERR or "disk I/O error" in first_line:
        free = free_bytes(sqlite_dir) if sqlite_dir is not None else None
        if free is not None and free < _IOERR_FULL_BELOW_BYTES:
            return f"SQLite: disk I/O error with {free} bytes free on {sqlite_dir}"
    return None


class StorageHealth:
    """Whether the database's storage can take writes, as far as this process can tell.

    Not healthy while a write failed with a full disk less than ``hold_s`` ago, or while the SQLite
    file's filesystem (``directory``) has less than ``min_free_bytes`` free. Recovers by itself
    once writes stop failing for ``hold_s``. A write that succeeds in between does not clear it:
    on a full disk a small update often fits in a page that is already there while every batch
    of telemetry is refused, and readiness must not flap with them.
    """

    def __init__(
        self,
        directory: Path | None = None,
        *,
        hold_s: float = 60.0,
        min_free_bytes: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.hold_s = hold_s
        self.min_free_bytes = min_free_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._full_at: float | None = None
        self._reason = ""
        self.full_errors = 0

    def failed(self, reason: str) -> None:
        with self._lock:
            self._full_at = self._clock()
            self._reason = reason
            self.full_errors += 1

    def free_bytes(self) -> int | None:
        return free_bytes(self.directory) if self.directory is not None else None

    def problem(self) -> str | None:
        """Why the storage cannot take writes now, or None."""
        with self._lock:
            full_at, reason = self._full_at, self._reason
        if full_at is not None:
            ago = self._clock() - full_at
            if ago < self.hold_s:
                return f"storage full: a write failed {ago:.0f} s ago ({reason})"
        free = self.free_bytes()
        if free is not None and free < self.min_free_bytes:
            return (
                f"storage nearly full: {free} bytes free on {self.directory}, "
                f"below storage_min_free_bytes ({self.min_free_bytes})"
            )
        return None


class StorageCollector:
    """``/metrics``: full-disk write failures, whether storage is full now, free bytes (SQLite)."""

    def __init__(self, health: StorageHealth) -> None:
        self._health = health

    def collect(self) -> Iterator[Metric]:
        errors = CounterMetricFamily(
            "fleetwatch_storage_full_errors",
            "Writes refused because the database's disk was full (answered 507).",
        )
        errors.add_metric([], self._health.full_errors)
        yield errors
        full = GaugeMetricFamily(
            "fleetwatch_storage_full", "1 while /readyz reports the storage full, else 0."
        )
        full.add_metric([], 1.0 if self._health.problem() else 0.0)
        yield full
        free = self._health.free_bytes()
        if free is not None:  # SQLite only: PostgreSQL's disk is not ours to see
            yield GaugeMetricFamily(
                "fleetwatch_storage_free_bytes",
                "Free bytes on the SQLite database file's filesystem.",
                value=free,
            )
