"""One leader among all server processes on one PostgreSQL: it alone runs the write jobs.

The leader holds a session-level advisory lock (:data:`LEADER_LOCK`) on a dedicated connection
for as long as it lives. Standbys try to take it every ``retry_s``. When the leader dies, the
database closes its connection and frees the lock, so a standby takes over within about one
retry. A leader that loses its connection stops leading at once (its jobs are cancelled), even
if the lock may still look held to the database for a moment.

The same connection LISTENs on :data:`WAKE_CHANNEL`: any replica that stores a fatal Xid sends
``NOTIFY`` after its commit, and the leader pokes its waker, so the drain and the alert do not
wait for the next tick. The payload names the nodes (a JSON list, :func:`wake_payload`), for the
urgent lane's targeted pass (:mod:`fleetwatch.server.runtime.urgent`); an empty one (too many names
for NOTIFY's 8000 bytes, or a sender that names none) wakes the whole fleet's pass. On SQLite
there is one process, which is always the leader.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from sqlalchemy import Engine, text

from fleetwatch.config import ServerSettings
from fleetwatch.server.db.session import own_conninfo
from fleetwatch.server.runtime.locks import LockKey

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "LEADER_LOCK",
    "WAKE_CHANNEL",
    "LeaderElector",
    "notify_wake",
    "parse_wake",
    "single_process_problem",
    "wake_payload",
]

logger = logging.getLogger(__name__)

LEADER_LOCK = int(LockKey.LEADER)  # the one key every process competes for
WAKE_CHANNEL = "fleetwatch_wake"
MAX_PAYLOAD_BYTES = 7900  # PostgreSQL refuses a NOTIFY payload of 8000 bytes or more
# A leader cut off by the network (no reset, no answer) notices within about 10 s and stops
# leading; the database frees its lock on its own keepalive settings (tcp_keepalives_*).
_KEEPALIVE = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 2,
    "tcp_user_timeout": 10_000,
}


def single_process_problem(settings: ServerSettings) -> str | None:
    """Why this SQLite setup would have several processes write one file, or None."""
    if not settings.is_sqlite:
        return None
    if settings.workers > 1:
        return (
            f"--workers {settings.workers} on SQLite: SQLite serves one process. "
            "Use PostgreSQL (--database-url postgresql://...) for several workers or replicas."
        )
    if settings.role != "all":
        return (
            f"--role {settings.role} on SQLite: an api/worker split needs several processes on "
            "one database, and SQLite serves one process. Use --role all, or PostgreSQL."
        )
    return None


def wake_payload(names: Collection[str] | None) -> str:
    """The NOTIFY payload naming ``names``: a JSON list, or empty (the whole fleet) for None or
    when the list would not fit in :data:`MAX_PAYLOAD_BYTES`."""
    if not names:
        return ""
    payload = json.dumps(sorted(names), separators=(",", ":"))
    return payload if len(payload.encode()) <= MAX_PAYLOAD_BYTES else ""


def parse_wake(payload: str) -> frozenset[str] | None:
    """The nodes a wake-up names; None (the whole fleet) for an empty or unreadable payload."""
    try:
        names = json.loads(payload) if payload else None
    except ValueError:
        return None
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        return None
    return frozenset(names)


def notify_wake(engine: Engine, nodes: Collection[str] | None = None) -> None:
    """Wake the leader, wherever it runs: ``NOTIFY fleetwatch_wake`` naming ``nodes`` (nothing
    on SQLite, where this process is the leader and its own waker is poked). A lost wake-up only
    waits for the leader's next tick, so a failure is logged, not raised."""
    if engine.dialect.name != "postgresql":
        return
    try:
        with engine.begin() as conn:
            conn.execute(
                text("SELECT pg_notify(:channel, :payload)"),
                {"channel": WAKE_CHANNEL, "payload": wake_payload(nodes)},
            )
    except Exception:  # noqa: BLE001
        logger.warning("could not NOTIFY %s; the leader acts at its next tick", WAKE_CHANNEL)


class LeaderElector:
    """Competes for :data:`LEADER_LOCK` in a daemon thread; reports changes to the event loop.

    ``on_change(is_leader)`` is called in the event loop; ``on_wake(nodes)`` from the thread,
    for each NOTIFY received while leading, with the nodes it names (None: the whole fleet).
    """

    def __init__(
        self,
        conninfo: str | None,
        on_change: Callable[[bool], None],
        on_wake: Callable[[frozenset[str] | None], None],
        retry_s: float = 1.0,
    ) -> None:
        self.conninfo = conninfo
        self.retry_s = retry_s
        self.is_leader = False
        self._on_change = on_change
        self._on_wake = on_wake
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def for_engine(
        cls,
        engine: Engine,
        on_change: Callable[[bool], None],
        on_wake: Callable[[frozenset[str] | None], None],
    ) -> LeaderElector:
        conninfo = own_conninfo(engine) if engine.dialect.name == "postgresql" else None
        return cls(conninfo, on_change, on_wake)

    def start(self) -> None:
        """Begin competing (call in the event loop). On SQLite, lead at once."""
        self._loop = asyncio.get_running_loop()
        if self.conninfo is None:
            self._set(True)
            return
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _set(self, leading: bool) -> None:
        if leading == self.is_leader:
            return
        self.is_leader = leading
        logger.info("this process %s the leader", "is now" if leading else "is no longer")
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._on_change, leading)
            except RuntimeError:  # the loop closed: the server is shutting down
                pass

    def _run(self) -> None:
        import psycopg  # only PostgreSQL deployments need the driver
        import psycopg.conninfo

        assert self.conninfo is not None
        while not self._stop.is_set():
            try:
                conninfo = psycopg.conninfo.make_conninfo(self.conninfo, **_KEEPALIVE)
                with psycopg.connect(conninfo, autocommit=True) as conn:
                    self._compete(conn)
            except Exception:  # noqa: BLE001 - any failure: not leading; try again shortly
                logger.warning("leader election connection lost; retrying", exc_info=True)
            self._set(False)
            self._stop.wait(self.retry_s)

    def _compete(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        """Standby until the lock is ours, then lead (listening for wake-ups) until stopped."""
        while not self._stop.is_set():
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (LEADER_LOCK,)).fetchone()
            if row is not None and row[0]:
                break
            self._stop.wait(self.retry_s)
        else:
            return
        conn.execute(f"LISTEN {WAKE_CHANNEL}")
        self._set(True)
        while not self._stop.is_set():
            # notifies() returns after the timeout; the SELECT then proves the connection (and
            # with it the lock) is still there. A broken connection raises: we stop leading.
            for notify in conn.notifies(timeout=self.retry_s):
                self._on_wake(parse_wake(notify.payload))
            conn.execute("SELECT 1")
