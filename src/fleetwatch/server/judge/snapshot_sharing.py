"""One judgement of the fleet for every process: the leader publishes, the others adopt.

Judging 100,000 GPUs costs about 30 s of one core. Every process used to do it for itself each
``assess_interval_s``, so an ``--role api`` process spent most of its interpreter judging rather
than taking pushes. On PostgreSQL the leader now stores each whole-fleet assessment
(``fleet_snapshots``, :mod:`fleetwatch.server.judge.snapshot_codec`) after acting on it, and a
process that is not the leader checks every ``snapshot_poll_s`` for a newer one (one small row;
the body is read only when its sequence number moved) and adopts it (:meth:`Assessor.adopt`).

A process judges the fleet itself, as before, when there is nothing to adopt: no snapshot stored,
one published longer ago than ``snapshot_stale_after_s`` (no leader, or a stuck one), or one it
cannot read (another server version's format during a rolling upgrade). Its urgent lane still
judges the nodes of urgent events pushed to it at once, on top of the adopted snapshot. SQLite
has one process, which is the leader: nothing is shared there.
"""

from __future__ import annotations

import logging
import threading

from prometheus_client import Counter

from fleetwatch.server.db.session import Database
from fleetwatch.server.judge.assessment import FleetAssessment
from fleetwatch.server.judge.assessor import Assessor
from fleetwatch.server.judge.snapshot_codec import (
    FORMAT,
    SnapshotFormatError,
    decode_snapshot,
    encode_snapshot,
)
from fleetwatch.server.repo.fleet_snapshots import read_body, read_head, write_snapshot

__all__ = ["SnapshotSharing"]

logger = logging.getLogger(__name__)


class SnapshotSharing:
    """Publishes this process's snapshots while it leads; adopts the leader's otherwise."""

    def __init__(
        self, db: Database, assessor: Assessor, *, stale_after_s: float, counted: Counter
    ) -> None:
        self.db = db
        self.assessor = assessor
        self.stale_after_s = stale_after_s
        self._counted = counted  # fleetwatch_fleet_snapshots_total{outcome}
        self.adopted_seq: int | None = None
        self._follow = threading.Lock()  # the poll and the assessment job may both follow
        self._unreadable: int | None = None  # a stored seq already found unreadable

    def publish(self, snapshot: FleetAssessment) -> int:
        """Store ``snapshot`` for the other processes; its sequence number."""
        body = encode_snapshot(snapshot)
        with self.db.write() as conn:
            seq = write_snapshot(
                conn, body, format=FORMAT, whole_at=snapshot.whole_at, gpus=len(snapshot.gpus)
            )
        self._counted.labels(outcome="published").inc()
        logger.debug("published snapshot %d: %d GPUs, %d bytes", seq, len(snapshot.gpus), len(body))
        return seq

    def follow(self) -> bool:
        """Adopt the leader's stored snapshot if it is newer than the one adopted. True when
        this process now serves a fresh snapshot of the leader's; False when it should judge
        the fleet itself (none stored, a stale one, or one it cannot read)."""
        with self._follow, self.db.read() as conn:
            head = read_head(conn)
            if head is None or head.age_s > self.stale_after_s:
                return False
            if head.seq == self.adopted_seq:
                return True
            if head.format != FORMAT or head.seq == self._unreadable:
                self._refuse(head.seq, f"format {head.format}, this server reads {FORMAT}")
                return False
            stored = read_body(conn)
            if stored is None:  # deleted since the head was read
                return False
            seq, body = stored
            try:
                snapshot = decode_snapshot(body, lambda v: self.assessor.bundle_of(conn, v))
            except SnapshotFormatError as exc:
                self._refuse(seq, str(exc))
                return False
        self.assessor.adopt(snapshot)
        self.adopted_seq = seq
        self._counted.labels(outcome="adopted").inc()
        logger.debug("adopted snapshot %d: %d GPUs", seq, len(snapshot.gpus))
        return True

    def _refuse(self, seq: int, why: str) -> None:
        if self._unreadable != seq:
            self._counted.labels(outcome="refused").inc()
            logger.warning("cannot adopt the leader's snapshot %d (%s): judging here", seq, why)
        self._unreadable = seq
