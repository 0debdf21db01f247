"""The durable spool: every batch is written here before it is pushed, and leaves only when the
server has acknowledged it.

A SQLite file (``synchronous=FULL``: a batch on disk survives a power cut) holding each batch's
exact gzip body, so that a replay after a crash is byte-identical and the server recognises it by
``batch_id``. Critical batches (a fatal Xid) go out before routine ones; within each class, in the
order they were made. The spool is bounded: past ``max_bytes`` the oldest routine batches are
dropped first, and what was dropped is counted so that the server hears of it.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DropReport", "Spool", "SpooledBatch"]

logger = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    batch_id TEXT NOT NULL UNIQUE,
    created REAL NOT NULL,
    critical INTEGER NOT NULL,
    samples INTEGER NOT NULL,
    events INTEGER NOT NULL,
    size INTEGER NOT NULL,
    body BLOB NOT NULL,
    -- a drop report this batch carries: if the batch is dropped too, the report must survive
    carried_batches INTEGER NOT NULL DEFAULT 0,
    carried_samples INTEGER NOT NULL DEFAULT 0,
    carried_events INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


@dataclass(frozen=True)
class SpooledBatch:
    seq: int
    batch_id: str
    body: bytes
    critical: bool
    samples: int
    events: int


@dataclass(frozen=True)
class DropReport:
    batches: int
    samples: int
    events: int

    def __bool__(self) -> bool:
        return self.batches > 0


class Spool:
    """Thread-safe: the collection loop puts, the pusher thread takes and acknowledges."""

    def __init__(self, directory: Path, *, max_bytes: int = 512 * 1024 * 1024) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "spool.db"
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def put(
        self,
        batch_id: str,
        body: bytes,
        *,
        samples: int,
        events: int,
        critical: bool = False,
        carries: DropReport | None = None,
    ) -> None:
        carried = carries or DropReport(0, 0, 0)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT INTO batches (batch_id, created, critical, samples, events, size, body,"
                    " carried_batches, carried_samples, carried_events)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        batch_id,
                        time.time(),
                        int(critical),
                        samples,
                        events,
                        len(body),
                        body,
                        carried.batches,
                        carried.samples,
                        carried.events,
                    ),
                )
                self._enforce_bound()
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _enforce_bound(self) -> None:
        total = self._db.execute("SELECT COALESCE(SUM(size), 0) FROM batches").fetchone()[0]
        while total > self.max_bytes:
            # Routine telemetry goes first; a fatal Xid is the last thing to give up.
            oldest = self._db.execute(
                "SELECT seq, size, samples, events, carried_batches, carried_samples,"
                " carried_events FROM batches ORDER BY critical, seq LIMIT 1"
            ).fetchone()
            if oldest is None:
                return
            seq, size, samples, events, c_batches, c_samples, c_events = oldest
            self._db.execute("DELETE FROM batches WHERE seq = ?", (seq,))
            for name, amount in (
                ("dropped_batches", 1),
                ("dropped_samples", samples),
                ("dropped_events", events),
                ("unreported_batches", 1 + c_batches),
                ("unreported_samples", samples + c_samples),
                ("unreported_events", events + c_events),
            ):
                self._bump(name, amount)
            total -= size
            logger.error(
                "spool full (%d bytes > %d): dropped the oldest batch (%d samples, %d events)",
                total + size,
                self.max_bytes,
                samples,
                events,
            )

    def _bump(self, name: str, amount: int) -> None:
        self._db.execute(
            "INSERT INTO counters (name, value) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
            (name, amount),
        )

    def next(self) -> SpooledBatch | None:
        """The batch to push next: critical first, then oldest."""
        with self._lock:
            row = self._db.execute(
                "SELECT seq, batch_id, body, critical, samples, events FROM batches "
                "ORDER BY critical DESC, seq LIMIT 1"
            ).fetchone()
        if row is None:
            return None
        return SpooledBatch(row[0], row[1], row[2], bool(row[3]), row[4], row[5])

    def ack(self, seq: int) -> None:
        with self._lock:
            self._db.execute("DELETE FROM batches WHERE seq = ?", (seq,))

    def depth(self) -> tuple[int, int]:
        """(batches, bytes) waiting."""
        with self._lock:
            count, size = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM batches"
            ).fetchone()
        return int(count), int(size)

    def counter(self, name: str) -> int:
        with self._lock:
            row = self._db.execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
        return int(row[0]) if row else 0

    def take_drop_report(self) -> DropReport:
        """Drops not yet told to the server; counted as told once taken."""
        with self._lock:
            rows = dict(
                self._db.execute(
                    "SELECT name, value FROM counters WHERE name LIKE 'unreported_%'"
                ).fetchall()
            )
            self._db.execute("DELETE FROM counters WHERE name LIKE 'unreported_%'")
        return DropReport(
            batches=rows.get("unreported_batches", 0),
            samples=rows.get("unreported_samples", 0),
            events=rows.get("unreported_events", 0),
        )

    def restore_drop_report(self, report: DropReport) -> None:
        """Put a taken report back (its batch could not be spooled)."""
        with self._lock:
            self._bump("unreported_batches", report.batches)
            self._bump("unreported_samples", report.samples)
            self._bump("unreported_events", report.events)
