"""What the server must hear of batches that never reached it, kept in the spool's database.

Two kinds: *drops* (the spool was full) are counters, ``unreported_*`` until a batch carries them
(its ``carried_*`` columns), and due again if that batch is dropped or leaves unsent; *set-aside*
batches (the server kept failing on them) are rows, claimed by the batch that carries their
report (``carrier``), released if it is dropped or never spooled, and deleted once it is
acknowledged. Every function here runs inside the caller's transaction.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

__all__ = [
    "SET_ASIDE_SCHEMA",
    "DropReport",
    "SetAside",
    "bump",
    "claim_set_aside",
    "forget_carried",
    "record_set_aside",
    "release_set_aside",
    "restore_drops",
    "take_drops",
]

SET_ASIDE_SCHEMA = """
CREATE TABLE IF NOT EXISTS set_aside (
    batch_id TEXT PRIMARY KEY,
    at REAL NOT NULL,
    status INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    failing_s REAL NOT NULL,
    samples INTEGER NOT NULL,
    events INTEGER NOT NULL,
    answer TEXT NOT NULL,
    carrier TEXT
);
"""


@dataclass(frozen=True)
class DropReport:
    batches: int
    samples: int
    events: int

    def __bool__(self) -> bool:
        return self.batches > 0


@dataclass(frozen=True)
class SetAside:
    """A batch the server kept failing on, and what it last answered."""

    batch_id: str
    at: float  # Unix time it was set aside
    status: int
    attempts: int
    failing_s: float  # from its first failure to when it was set aside
    samples: int
    events: int
    answer: str


def bump(db: sqlite3.Connection, name: str, amount: int) -> None:
    db.execute(
        "INSERT INTO counters (name, value) VALUES (?, ?) "
        "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
        (name, amount),
    )


def take_drops(db: sqlite3.Connection) -> DropReport:
    rows = dict(
        db.execute("SELECT name, value FROM counters WHERE name LIKE 'unreported_%'").fetchall()
    )
    db.execute("DELETE FROM counters WHERE name LIKE 'unreported_%'")
    return DropReport(
        batches=rows.get("unreported_batches", 0),
        samples=rows.get("unreported_samples", 0),
        events=rows.get("unreported_events", 0),
    )


def restore_drops(db: sqlite3.Connection, report: DropReport) -> None:
    bump(db, "unreported_batches", report.batches)
    bump(db, "unreported_samples", report.samples)
    bump(db, "unreported_events", report.events)


def record_set_aside(db: sqlite3.Connection, report: SetAside) -> None:
    db.execute(
        "INSERT OR REPLACE INTO set_aside (batch_id, at, status, attempts, failing_s,"
        " samples, events, answer, carrier) VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL)",
        (
            report.batch_id,
            report.at,
            report.status,
            report.attempts,
            report.failing_s,
            report.samples,
            report.events,
            report.answer,
        ),
    )
    bump(db, "set_aside_batches", 1)
    bump(db, "set_aside_samples", report.samples)
    bump(db, "set_aside_events", report.events)


def claim_set_aside(db: sqlite3.Connection, carrier: str, limit: int) -> list[SetAside]:
    db.execute(
        "UPDATE set_aside SET carrier = ? WHERE batch_id IN (SELECT batch_id FROM"
        " set_aside WHERE carrier IS NULL ORDER BY at LIMIT ?)",
        (carrier, limit),
    )
    rows = db.execute(
        "SELECT batch_id, at, status, attempts, failing_s, samples, events, answer"
        " FROM set_aside WHERE carrier = ? ORDER BY at",
        (carrier,),
    ).fetchall()
    return [SetAside(*row) for row in rows]


def release_set_aside(db: sqlite3.Connection, carrier: str) -> None:
    db.execute("UPDATE set_aside SET carrier = NULL WHERE carrier = ?", (carrier,))


def forget_carried(db: sqlite3.Connection, seq: int) -> None:
    """The batch ``seq`` was acknowledged: the server has the reports it carried."""
    db.execute(
        "DELETE FROM set_aside WHERE carrier = (SELECT batch_id FROM batches WHERE seq = ?)",
        (seq,),
    )
