"""The durable spool: every batch is written here before it is pushed, and leaves only when the
server has acknowledged it.

A SQLite file (``synchronous=FULL``: a batch on disk survives a power cut) holding each batch's
exact gzip body, so that a replay after a crash is byte-identical and the server recognises it by
``batch_id``. Critical batches (a fatal Xid) go out before routine ones; within each class, in the
order they were made. The spool is bounded, by ``max_bytes`` and by its disk: past either, the
oldest routine batches are dropped first (a critical batch gives way only to a newer critical
one), and what was dropped is counted so that the server hears of it. A full disk is handled the
same way (:mod:`fleetwatch.agent.spool_disk` keeps SQLite able to delete on it); when nothing
older can give way, the new batch itself is dropped, and counted.

A batch the pusher gives up on (refused, or failing for long) leaves the spool through
:meth:`Spool.reject` or :meth:`Spool.set_aside`; a set-aside batch leaves a report behind that a
later batch carries to the server, and that is kept until a batch carrying it is acknowledged.

Collections may also wait here, *staged*, until a push combines them into one batch
(:mod:`fleetwatch.agent.spool_staging`): :meth:`Spool.combine_staged` writes the batches and
removes the ticks they hold in one transaction, so a crash leaves each tick staged or in exactly
one batch.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from fleetwatch.agent.spool_disk import (
    DEFAULT_RESERVE_BYTES,
    WAL_CHECKPOINT_PAGES,
    Transaction,
    fit_to_disk,
    give_back_emergency_room,
    is_disk_full,
    keep_emergency_room,
)
from fleetwatch.agent.spool_reports import (
    SET_ASIDE_SCHEMA,
    DropReport,
    SetAside,
    bump,
    claim_set_aside,
    forget_carried,
    record_set_aside,
    release_set_aside,
    restore_drops,
    take_drops,
)
from fleetwatch.agent.spool_staging import (
    STAGED_SCHEMA,
    Combine,
    NewBatch,
    StagedTick,
    count_staged,
    count_staged_collections,
    insert_staged,
    load_staged,
    remove_staged,
)

__all__ = ["Combine", "DropReport", "NewBatch", "SetAside", "Spool", "SpooledBatch", "StagedTick"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

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

_BATCH_ROW = (
    "seq, batch_id, size, samples, events, carried_batches, carried_samples, carried_events"
)


@dataclass(frozen=True)
class SpooledBatch:
    seq: int
    batch_id: str
    body: bytes
    critical: bool
    samples: int
    events: int


class Spool:
    """Thread-safe: the collection loop puts, the pusher thread takes and acknowledges."""

    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int = 512 * 1024 * 1024,
        reserve_bytes: int = DEFAULT_RESERVE_BYTES,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.path = directory / "spool.db"
        self.max_bytes = max_bytes
        self.reserve_bytes = reserve_bytes
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
        self._db.executescript(_SCHEMA + SET_ASIDE_SCHEMA + STAGED_SCHEMA)
        # Reports claimed by a batch that a crash kept from being written are due again.
        self._db.execute(
            "UPDATE set_aside SET carrier = NULL WHERE carrier IS NOT NULL"
            " AND carrier NOT IN (SELECT batch_id FROM batches)"
        )
        keep_emergency_room(directory, reserve_bytes)
        fit_to_disk(self._db, directory, reserve_bytes)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- writing ----------------------------------------------------------------------------

    def put(
        self,
        batch_id: str,
        body: bytes,
        *,
        samples: int,
        events: int,
        critical: bool = False,
        carries: DropReport | None = None,
    ) -> bool:
        """Spool a batch; ``False`` if it was dropped at once (counted, and its reports kept)
        because the disk is full and nothing older could give way."""
        carried = carries or DropReport(0, 0, 0)

        def write() -> None:
            self._insert(batch_id, body, samples, events, critical, carried)
            self._enforce_bound()

        with self._lock:
            if self._write_making_room(write, critical=critical, what=batch_id):
                return self._holds(batch_id)
            self._on_full_disk(lambda: self._drop_new(batch_id, samples, events, carried))
            return False

    def stage(self, body: bytes, *, collected: float, samples: int, events: int) -> bool:
        """Stage one collection for the next :meth:`combine_staged`; ``False`` if the full disk
        dropped it (counted as a dropped batch) because nothing older could give way."""
        with self._lock:
            if self._write_making_room(
                lambda: insert_staged(
                    self._db, body, collected=collected, samples=samples, events=events
                ),
                critical=False,
                what="a collection",
            ):
                return True
            self._on_full_disk(lambda: self._drop_new("", samples, events, DropReport(0, 0, 0)))
            return False

    def combine_staged(self, make: Combine, *, carrier: str) -> list[NewBatch] | None:
        """Replace every staged tick by the batches ``make`` builds of them, in one transaction,
        with the drop and set-aside reports not yet told (claimed for ``carrier``).

        ``None`` when the disk is full and nothing can give way: the ticks stay staged for the
        next try, and the reports stay due.
        """
        made: list[NewBatch] = []

        def write() -> None:
            ticks = load_staged(self._db)
            report = take_drops(self._db)
            set_aside = claim_set_aside(self._db, carrier, 50)
            made[:] = make(ticks, report, set_aside)
            if (report or set_aside) and carrier not in {b.batch_id for b in made}:
                raise ValueError(f"no batch {carrier} to carry the reports")
            for b in made:
                carried = report if b.batch_id == carrier else DropReport(0, 0, 0)
                self._insert(b.batch_id, b.body, b.samples, b.events, False, carried)
            remove_staged(self._db, ticks)
            self._enforce_bound()

        with self._lock:
            if self._write_making_room(write, critical=False, what="staged collections"):
                return made
        return None

    def staged(self) -> tuple[int, float | None]:
        """(collections staged, when the oldest was collected)."""
        with self._lock:
            return count_staged(self._db)

    def staged_collections(self) -> int:
        """Staged ticks that hold samples (events staged by a watcher are not collections)."""
        with self._lock:
            return count_staged_collections(self._db)

    def _insert(
        self,
        batch_id: str,
        body: bytes,
        samples: int,
        events: int,
        critical: bool,
        carried: DropReport,
    ) -> None:
        row = (batch_id, time.time(), int(critical), samples, events, len(body), body)
        self._db.execute(
            "INSERT INTO batches (batch_id, created, critical, samples, events,"
            " size, body, carried_batches, carried_samples, carried_events)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (*row, carried.batches, carried.samples, carried.events),
        )

    def _write_making_room(self, write: Callable[[], None], *, critical: bool, what: str) -> bool:
        """Run ``write`` in a transaction; on a full disk, drop the batch that gives way (see
        :meth:`_make_room`) and try again. ``False`` when nothing could give way."""
        keep_emergency_room(self.directory, self.reserve_bytes)
        while True:
            fit_to_disk(self._db, self.directory, self.reserve_bytes)
            try:
                with self._transaction():
                    write()
                return True
            except sqlite3.Error as exc:
                if not is_disk_full(exc, self.directory, self.reserve_bytes):
                    raise
                logger.debug("spool disk full while spooling %s: %s", what, exc)
            if not self._on_full_disk(lambda: self._make_room(critical)):
                return False

    def _transaction(self) -> Transaction:
        return Transaction(self._db)

    def _on_full_disk(self, write: Callable[[], _T]) -> _T:
        """Run a write that must succeed even on a disk full to the last block: if the disk
        refuses it, give back the emergency room and try once more."""
        try:
            return write()
        except sqlite3.Error as exc:
            if not is_disk_full(exc, self.directory, self.reserve_bytes):
                raise
        give_back_emergency_room(self._db, self.directory)
        return write()

    def _holds(self, batch_id: str) -> bool:
        found = self._db.execute("SELECT 1 FROM batches WHERE batch_id = ?", (batch_id,))
        return found.fetchone() is not None

    def _enforce_bound(self) -> None:
        total = self._db.execute("SELECT COALESCE(SUM(size), 0) FROM batches").fetchone()[0]
        while total > self.max_bytes:
            # Routine telemetry goes first; a fatal Xid is the last thing to give up.
            oldest = self._db.execute(
                f"SELECT {_BATCH_ROW} FROM batches ORDER BY critical, seq LIMIT 1"
            ).fetchone()
            if oldest is None:
                return
            self._drop(oldest)
            total -= oldest[2]
            logger.error(
                "spool full (%d bytes > %d): dropped the oldest batch (%d samples, %d events)",
                total + oldest[2],
                self.max_bytes,
                oldest[3],
                oldest[4],
            )

    def _make_room(self, critical: bool) -> bool:
        """Drop the batch that gives way to a new one on a full disk: the oldest routine one,
        or for a critical batch the oldest of all; ``False`` if there is none."""
        where = "" if critical else "WHERE critical = 0"
        with self._transaction():
            oldest = self._db.execute(
                f"SELECT {_BATCH_ROW} FROM batches {where} ORDER BY critical, seq LIMIT 1"
            ).fetchone()
            if oldest is None:
                return False
            self._drop(oldest)
        logger.error(
            "spool disk full (%s): dropped the oldest batch (%d samples, %d events)",
            self.directory,
            oldest[3],
            oldest[4],
        )
        return True

    def _drop_new(self, batch_id: str, samples: int, events: int, carried: DropReport) -> None:
        with self._transaction():
            self._count_drop(
                samples, events, carried.batches, carried.samples, carried.events, batch_id
            )
        logger.error(
            "spool disk full (%s) and nothing older can give way: dropped the new batch "
            "(%d samples, %d events)",
            self.directory,
            samples,
            events,
        )

    def _drop(self, row: tuple[int, str, int, int, int, int, int, int]) -> None:
        seq, batch_id, _size, samples, events, c_batches, c_samples, c_events = row
        self._db.execute("DELETE FROM batches WHERE seq = ?", (seq,))
        self._count_drop(samples, events, c_batches, c_samples, c_events, batch_id)

    def _count_drop(
        self,
        samples: int,
        events: int,
        c_batches: int,
        c_samples: int,
        c_events: int,
        batch_id: str,
    ) -> None:
        for name, amount in (
            ("dropped_batches", 1),
            ("dropped_samples", samples),
            ("dropped_events", events),
            ("unreported_batches", 1 + c_batches),
            ("unreported_samples", samples + c_samples),
            ("unreported_events", events + c_events),
        ):
            bump(self._db, name, amount)
        release_set_aside(self._db, batch_id)

    # -- reading and leaving ----------------------------------------------------------------

    def next(self, skip: int = 0) -> SpooledBatch | None:
        """The batch to push next (critical first, then oldest), or the one ``skip`` places
        behind it."""
        with self._lock:
            row = self._db.execute(
                "SELECT seq, batch_id, body, critical, samples, events FROM batches "
                "ORDER BY critical DESC, seq LIMIT 1 OFFSET ?",
                (skip,),
            ).fetchone()
        if row is None:
            return None
        return SpooledBatch(row[0], row[1], row[2], bool(row[3]), row[4], row[5])

    def ack(self, seq: int) -> None:
        """The server has the batch: it leaves, and so do the reports it carried."""
        with self._lock:
            self._on_full_disk(lambda: self._ack(seq))

    def _ack(self, seq: int) -> None:
        with self._transaction():
            forget_carried(self._db, seq)
            self._db.execute("DELETE FROM batches WHERE seq = ?", (seq,))

    def reject(self, seq: int) -> None:
        """The batch leaves without reaching the server: what it carried is due again."""
        with self._lock, self._transaction():
            self._leave(seq)

    def set_aside(self, seq: int, report: SetAside) -> None:
        """Like :meth:`reject`, and the set-aside batch is counted and due to be reported."""
        with self._lock, self._transaction():
            self._leave(seq)
            record_set_aside(self._db, report)

    def _leave(self, seq: int) -> None:
        row = self._db.execute(
            "SELECT batch_id, carried_batches, carried_samples, carried_events FROM batches"
            " WHERE seq = ?",
            (seq,),
        ).fetchone()
        if row is None:
            return
        batch_id, c_batches, c_samples, c_events = row
        self._db.execute("DELETE FROM batches WHERE seq = ?", (seq,))
        release_set_aside(self._db, batch_id)
        if c_batches:
            restore_drops(self._db, DropReport(c_batches, c_samples, c_events))

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

    # -- what the server must hear ----------------------------------------------------------

    def take_drop_report(self) -> DropReport:
        """Drops not yet told to the server; counted as told once taken."""
        with self._lock, self._transaction():
            return take_drops(self._db)

    def restore_drop_report(self, report: DropReport) -> None:
        """Put a taken report back (its batch could not be spooled)."""
        with self._lock, self._transaction():
            restore_drops(self._db, report)

    def take_set_aside_reports(self, carrier: str, limit: int = 50) -> list[SetAside]:
        """Set-aside batches not yet reported, claimed for the batch ``carrier`` (released if
        that batch is dropped or never spooled, removed once it is acknowledged)."""
        with self._lock, self._transaction():
            return claim_set_aside(self._db, carrier, limit)

    def release_set_aside_reports(self, carrier: str) -> None:
        """Reports claimed for a batch that was not spooled are due again."""
        with self._lock, self._transaction():
            release_set_aside(self._db, carrier)
