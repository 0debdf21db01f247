"""Keeping the spool's SQLite file inside the free space of its disk, so a full disk never blocks
it.

On a full filesystem SQLite cannot even delete: a DELETE appends frames to the write-ahead log,
and with the log's default checkpoint at 1,000 pages (4 MiB) the log itself is what fills a small
disk. So the spool caps its own file (``PRAGMA max_page_count``) at what the disk holds minus a
reserve for the log, and checkpoints the log every 64 pages (256 KiB): when the disk is full,
SQLite answers ``SQLITE_FULL`` at the cap, the reserve still takes the frames of a DELETE, freed
pages are reused by the next INSERT, and the spool drops its oldest batches instead of the newest.

The cap follows the disk at each write: space freed elsewhere raises it, space taken by another
program lowers it (never below the pages already in use, which SQLite keeps reusing).

When another program takes even the reserve, a delete can still fail; for that the spool keeps a
preallocated file (``spool.reserve``, 256 KiB) that it gives back to the disk, together with the
log's own space (a truncating checkpoint), before it tries again; the file is made again once the
disk has room.

Every spool write runs in a :class:`Transaction`, which rolls back what SQLite left open when it
answered SQLITE_FULL (it may already have rolled back on its own).
"""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

__all__ = [
    "DEFAULT_RESERVE_BYTES",
    "WAL_CHECKPOINT_PAGES",
    "Transaction",
    "fit_to_disk",
    "give_back_emergency_room",
    "is_disk_full",
    "keep_emergency_room",
]

logger = logging.getLogger(__name__)

DEFAULT_RESERVE_BYTES = 1024 * 1024
WAL_CHECKPOINT_PAGES = 64
EMERGENCY_BYTES = 256 * 1024
EMERGENCY_FILE = "spool.reserve"
_NEARLY_FULL_BYTES = 64 * 1024


def free_bytes(directory: Path) -> int:
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize


def fit_to_disk(db: sqlite3.Connection, directory: Path, reserve_bytes: int) -> int:
    """Cap the database at its pages in use plus the disk's free space beyond the reserve;
    returns the cap in pages."""
    page_size = int(db.execute("PRAGMA page_size").fetchone()[0])
    pages = int(db.execute("PRAGMA page_count").fetchone()[0])
    room = max(0, free_bytes(directory) - reserve_bytes) // page_size
    # SQLite never sets the cap below the current size; it answers with the cap it applied.
    return int(db.execute(f"PRAGMA max_page_count = {pages + room}").fetchone()[0])


def is_disk_full(exc: sqlite3.Error, directory: Path, reserve_bytes: int) -> bool:
    """SQLITE_FULL (the cap or the disk), or an I/O error while the disk has no room left
    (a write that failed with ENOSPC can surface as SQLITE_IOERR)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return "database or disk is full" in str(exc)
    primary = code & 0xFF
    if primary == sqlite3.SQLITE_FULL:
        return True
    if primary == sqlite3.SQLITE_IOERR:
        # At the cap the disk still has about the reserve free; ENOSPC means (nearly) nothing.
        try:
            return free_bytes(directory) < min(reserve_bytes, _NEARLY_FULL_BYTES)
        except OSError:
            return False
    return False


def keep_emergency_room(directory: Path, reserve_bytes: int) -> None:
    """Make the emergency file if it is missing and the disk has room beyond the reserve."""
    path = directory / EMERGENCY_FILE
    if path.exists():
        return
    try:
        if free_bytes(directory) < reserve_bytes + EMERGENCY_BYTES:
            return
        with path.open("wb") as sink:
            sink.write(bytes(EMERGENCY_BYTES))  # written, not sparse: the blocks are taken now
    except OSError as exc:
        logger.warning("cannot keep emergency room for the spool in %s: %s", path, exc)
        path.unlink(missing_ok=True)


def give_back_emergency_room(db: sqlite3.Connection, directory: Path) -> None:
    """The disk is full to the last block: free the log's space and the emergency file."""
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except sqlite3.Error as exc:
        logger.warning("spool checkpoint on a full disk failed: %s", exc)
    path = directory / EMERGENCY_FILE
    if path.exists():
        path.unlink()
        logger.warning("spool disk %s is full: gave back the emergency room", directory)


class Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on any error (SQLite may already have
    rolled back on its own, e.g. after SQLITE_FULL)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            try:
                self._db.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
        else:
            self._rollback()

    def _rollback(self) -> None:
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")
