"""One judgement of the fleet for every process: the leader publishes, the others adopt.

Judging 100,000 GPUs costs about 30 s of one core. Every process used to do it for itself each
``assess_interval_s``, so an ``--role api`` process spent most of its interpreter judging rather
than taking pushes. On PostgreSQL the leader now stores each whole-fleet assessment
(``fleet_snapshots``, :mod:`fleetwatch.server.judge.snapshot_codec`) after acting on it, and a
process that is not the leader checks every ``snapshot_poll_s`` for a newer one (one small row;
the body is read only when its sequence number moved) and adopts it (:meth:`Assessor.adopt`).

It adopts at once only while its snapshot is being read: asked for (``/v1/risk``, the fleet page,
``/metrics``) within ``read_for_s``. Decoding a 100,000-GPU snapshot costs about a second of CPU,
every assessment (each ``assess_interval_s``), and an ``--role api`` process that takes pushes
behind a load balancer and serves no risk query spent 5.7 % of its samples on it (py-spy, run 29 of
``benchmarks/fleet_scale.py``), in the process that falls behind first. One nobody read for that
long checks the stored head only, and its next reader adopts the newest snapshot first
(:meth:`SnapshotSharing.catch_up`): that one request waits for the decoding.

A process judges the fleet itself, as before, when there is nothing to adopt: no snapshot stored,
one published longer ago than ``snapshot_stale_after_s`` (no leader, or a stuck one), or one it
cannot read (another server version's format during a rolling upgrade). Its urgent lane still
judges the nodes of urgent events pushed to it at once, on top of the adopted snapshot. SQLite
has one process, which is the leader: nothing is shared there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from prometheus_client import Counter
from sqlalchemy import Connection

from fleetwatch.server.db.session import Database
from fleetwatch.server.judge.assessment import FleetAssessment
from fleetwatch.server.judge.assessor import Assessor
from fleetwatch.server.judge.snapshot_codec import (
    FORMAT,
    SnapshotFormatError,
    decode_snapshot,
    encode_snapshot,
)
from fleetwatch.server.repo.fleet_snapshots import (
    StoredHead,
    read_body,
    read_head,
    write_snapshot,
)

__all__ = ["READ_FOR_S", "SnapshotSharing"]

logger = logging.getLogger(__name__)

# Longer than the intervals readers come at (a scrape every 15-60 s, a scheduler every minute).
READ_FOR_S = 600.0


class SnapshotSharing:
    """Publishes this process's snapshots while it leads; adopts the leader's otherwise."""

    def __init__(
        self,
        db: Database,
        assessor: Assessor,
        *,
        stale_after_s: float,
        counted: Counter,
        read_for_s: float = READ_FOR_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        self.assessor = assessor
        self.stale_after_s = stale_after_s
        self._counted = counted  # fleetwatch_fleet_snapshots_total{outcome}
        self.read_for_s = read_for_s
        self._clock = clock
        self.adopted_seq: int | None = None
        self.stored_seq: int | None = None  # the fresh stored snapshot the last poll saw
        self._read_at: float | None = None  # when this process's snapshot was last asked for
        self._follow = threading.Lock()  # the poll and the assessment job may both follow
        self._unreadable: int | None = None  # a stored seq already found unreadable

    def publish(self, snapshot: FleetAssessment) -> int:
        """Store ``snapshot`` for the other processes; its sequence number."""
        repaired: list[str] = []
        body = encode_snapshot(snapshot, repaired)
        with self.db.write() as conn:
            seq = write_snapshot(
                conn, body, format=FORMAT, whole_at=snapshot.whole_at, gpus=len(snapshot.gpus)
            )
        self._counted.labels(outcome="published").inc()
        if repaired:
            # One node's values must not stop the fleet's snapshot: shared repaired, and said.
            self._counted.labels(outcome="repaired").inc()
            logger.warning(
                "published snapshot %d with %d part(s) msgpack cannot hold repaired: %s",
                seq,
                len(repaired),
                "; ".join(repaired[:10]),
            )
        logger.debug("published snapshot %d: %d GPUs, %d bytes", seq, len(snapshot.gpus), len(body))
        return seq

    def poll(self) -> bool:
        """Whether the leader's stored snapshot is fresh and readable (False: judge the fleet
        here). Adopts it at once while this process's snapshot is being read (see the module);
        otherwise notes its sequence number for :meth:`catch_up` and reads one small row."""
        if self.being_read():
            return self.follow()
        with self.db.read() as conn:
            return self._fresh_head(conn) is not None

    def catch_up(self) -> None:
        """This process's snapshot is asked for now: adopt the newest stored one first, if the
        last poll saw one newer than the one adopted."""
        self._read_at = self._clock()
        seq = self.stored_seq
        if seq is not None and seq != self.adopted_seq and seq != self._unreadable:
            self.follow()

    def being_read(self) -> bool:
        """Whether this process's snapshot was asked for within ``read_for_s``."""
        return self._read_at is not None and self._clock() - self._read_at < self.read_for_s

    def follow(self) -> bool:
        """Adopt the leader's stored snapshot if it is newer than the one adopted. True when
        this process now serves a fresh snapshot of the leader's; False when it should judge
        the fleet itself (none stored, a stale one, or one it cannot read)."""
        with self._follow, self.db.read() as conn:
            head = self._fresh_head(conn)
            if head is None:
                return False
            if head.seq == self.adopted_seq:
                return True
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

    def _fresh_head(self, conn: Connection) -> StoredHead | None:
        """The stored snapshot's head, noted as :attr:`stored_seq`, when it is fresh and of a
        format this process reads; None (judge the fleet here) otherwise."""
        head = read_head(conn)
        if head is not None and head.age_s <= self.stale_after_s:
            if head.format == FORMAT and head.seq != self._unreadable:
                self.stored_seq = head.seq
                return head
            self._refuse(head.seq, f"format {head.format}, this server reads {FORMAT}")
        self.stored_seq = None
        return None

    def _refuse(self, seq: int, why: str) -> None:
        if self._unreadable != seq:
            self._counted.labels(outcome="refused").inc()
            logger.warning("cannot adopt the leader's snapshot %d (%s): judging here", seq, why)
        self._unreadable = seq
