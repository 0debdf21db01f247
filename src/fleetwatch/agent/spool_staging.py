"""Collections staged in the spool's database until the next push combines them into a batch.

One row per collection (a *tick*): its readings as a batch body without a batch id of its own
(uncompressed JSON, see :mod:`fleetwatch.agent.batching`), when it was collected, and its counts.
A tick is staged durably (the spool's ``synchronous=FULL``) before the collection loop goes on,
and leaves only in the transaction that writes the batch holding it: after a crash, a tick is
either still staged or in exactly one spooled batch. Every function here runs inside the
caller's transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fleetwatch.agent.spool_reports import DropReport, SetAside

__all__ = [
    "STAGED_SCHEMA",
    "Combine",
    "NewBatch",
    "StagedTick",
    "count_staged",
    "count_staged_collections",
    "insert_staged",
    "load_staged",
    "remove_staged",
]

STAGED_SCHEMA = """
CREATE TABLE IF NOT EXISTS staged (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    collected REAL NOT NULL,
    samples INTEGER NOT NULL,
    events INTEGER NOT NULL,
    body BLOB NOT NULL
);
"""


@dataclass(frozen=True)
class StagedTick:
    seq: int
    collected: float  # Unix time the agent's clock gave the collection
    samples: int
    events: int
    body: bytes


@dataclass(frozen=True)
class NewBatch:
    """A batch made of staged ticks, ready to spool."""

    batch_id: str
    body: bytes
    samples: int
    events: int


# Makes the batches for the staged ticks, given the reports the server has not heard yet; those
# must ride on the batch whose id is the ``carrier`` passed to ``Spool.combine_staged``.
Combine = Callable[[list[StagedTick], DropReport, list[SetAside]], Sequence[NewBatch]]


def insert_staged(
    db: sqlite3.Connection, body: bytes, *, collected: float, samples: int, events: int
) -> None:
    db.execute(
        "INSERT INTO staged (collected, samples, events, body) VALUES (?, ?, ?, ?)",
        (collected, samples, events, body),
    )


def load_staged(db: sqlite3.Connection) -> list[StagedTick]:
    """Every staged tick, oldest first."""
    rows = db.execute("SELECT seq, collected, samples, events, body FROM staged ORDER BY seq")
    return [StagedTick(*row) for row in rows.fetchall()]


def remove_staged(db: sqlite3.Connection, ticks: Sequence[StagedTick]) -> None:
    db.executemany("DELETE FROM staged WHERE seq = ?", [(tick.seq,) for tick in ticks])


def count_staged(db: sqlite3.Connection) -> tuple[int, float | None]:
    """(ticks staged, when the oldest was collected)."""
    count, oldest = db.execute("SELECT COUNT(*), MIN(collected) FROM staged").fetchone()
    return int(count), oldest


def count_staged_collections(db: sqlite3.Connection) -> int:
    """Staged ticks that hold samples: collections, not events a watcher staged between them."""
    (count,) = db.execute("SELECT COUNT(*) FROM staged WHERE samples > 0").fetchone()
    return int(count)
