"""The server's background work: rollups, lifetimes, and the fleet assessment, on timers.

Each job runs in a worker thread (``asyncio.to_thread``) so that requests keep being served, and
a failing pass is logged and retried at the next tick, never fatal to the server. Jobs that write
run on the one leader (server/leader.py); they also take a PostgreSQL advisory lock for their
transaction, so a leader change mid-pass never has two doing the same work. What a job must
remember between passes is in ``leader_state`` (:func:`load_state`, :func:`save_state`), written
in the pass's own transaction, so a new leader continues exactly where the old one committed. The
assessment is per process: each keeps its own snapshot in memory for its requests, refreshed on
its timer.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import tomllib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import Connection, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from fleetwatch.config import ServerSettings
from fleetwatch.models.registry import RiskBundle
from fleetwatch.rules.thresholds import HealthThresholds
from fleetwatch.rules.xid_catalog import XidCatalog
from fleetwatch.server.assessment import FleetAssessment, assess_fleet
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import leader_state
from fleetwatch.server.isolation import ItemGuard
from fleetwatch.server.judging import FleetJudge
from fleetwatch.server.lifecycle import sync_lifetimes
from fleetwatch.server.repo.models import latest_ok_model
from fleetwatch.server.rollups import refresh_rollups

__all__ = [
    "Assessor",
    "RollupJob",
    "Waker",
    "load_rules",
    "load_state",
    "periodic",
    "run_lifecycle",
    "save_state",
]

logger = logging.getLogger(__name__)

_ROLLUP_LOCK = 0x46575F524F4C  # "FW_ROL"
_LIFECYCLE_LOCK = 0x46575F4C4946 + 1


def load_rules(settings: ServerSettings) -> tuple[XidCatalog, HealthThresholds]:
    """The Xid catalogue and health thresholds, with the fleet's overrides from ``rules_file``."""
    if settings.rules_file is None:
        return XidCatalog.load(), HealthThresholds()
    data = tomllib.loads(settings.rules_file.read_text("utf-8"))
    unknown = set(data) - {"xid", "health"}
    if unknown:
        raise ValueError(f"{settings.rules_file}: unknown table(s) {sorted(unknown)}")
    return XidCatalog.load(data.get("xid")), HealthThresholds.from_mapping(data.get("health"))


def _singleton(conn: Connection, key: int) -> bool:
    """Whether this transaction may do a fleet-wide job (always, on SQLite: writers queue)."""
    if conn.dialect.name != "postgresql":
        return True
    return bool(conn.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": key}).scalar())


def load_state(conn: Connection, name: str) -> dict[str, Any] | None:
    """What background job ``name`` saved in its last committed pass (None: nothing yet)."""
    value = conn.execute(select(leader_state.c.value).where(leader_state.c.name == name)).scalar()
    return dict(value) if value is not None else None


def save_state(conn: Connection, name: str, value: dict[str, Any], now: datetime) -> None:
    """Replace job ``name``'s state; it commits (or rolls back) with the pass's transaction."""
    new = (pg_insert if conn.dialect.name == "postgresql" else sqlite_insert)(leader_state)
    new = new.values(name=name, value=value, updated_at=now)
    conn.execute(new.on_conflict_do_update(
        index_elements=["name"], set_={"value": new.excluded.value, "updated_at": now}
    ))  # fmt: skip


class RollupJob:
    """Keeps ``gpu_hourly`` current. The newest sample id of the last pass is kept in
    ``leader_state`` (not memory): a pass starting without it would miss late samples older
    than its lookback that arrived since that pass (an agent's spool after an outage)."""

    def __init__(self, db: Database, catalog: XidCatalog, guard: ItemGuard | None = None) -> None:
        self.db = db
        self.catalog = catalog
        self.guard = guard or ItemGuard("rollups")

    def __call__(self, now: datetime | None = None) -> int | None:
        now = now or datetime.now(UTC)
        with self.db.write() as conn:
            if not _singleton(conn, _ROLLUP_LOCK):
                return None
            state = load_state(conn, "rollups") or {}
            written, after_id = refresh_rollups(
                conn, now=now, catalog=self.catalog, after_id=state.get("after_id"),
                guard=self.guard,
            )  # fmt: skip
            save_state(conn, "rollups", {"after_id": after_id}, now)
            return written


def run_lifecycle(
    db: Database, settings: ServerSettings, catalog: XidCatalog, now: datetime | None = None,
    guard: ItemGuard | None = None,
) -> Any:  # fmt: skip
    with db.write() as conn:
        if not _singleton(conn, _LIFECYCLE_LOCK):
            return None
        return sync_lifetimes(
            conn, now=now or datetime.now(UTC), catalog=catalog,
            leave_after_s=settings.gpu_leave_after_s, guard=guard,
        )  # fmt: skip


class Assessor:
    """Builds this worker's :class:`FleetAssessment` and keeps the newest one."""

    def __init__(self, db: Database, settings: ServerSettings, catalog: XidCatalog,
                 thresholds: HealthThresholds, guard: ItemGuard | None = None) -> None:  # fmt: skip
        self.db = db
        self.settings = settings
        self.judge = FleetJudge(
            catalog=catalog, thresholds=thresholds,
            unreachable_after_intervals=settings.unreachable_after_intervals, guard=guard,
        )  # fmt: skip
        self.latest: FleetAssessment | None = None
        self._bundle: tuple[int, RiskBundle] | None = None
        self._lock = threading.Lock()

    def _model(self, conn: Connection) -> tuple[int, RiskBundle] | None:
        stored = latest_ok_model(conn)
        if stored is None:
            return None
        if self._bundle is None or self._bundle[0] != stored.version:
            self._bundle = (stored.version, RiskBundle.from_params(stored.params))
        return self._bundle

    def run_once(self, now: datetime | None = None) -> FleetAssessment:
        now = now or datetime.now(UTC)
        with self._lock, self.db.read() as conn:
            model = self._model(conn)
            snapshot = assess_fleet(
                conn, self.judge, now=now,
                bundle=model[1] if model else None, model_version=model[0] if model else None,
                feature_window=timedelta(days=self.settings.model_window_days),
            )  # fmt: skip
        self.latest = snapshot
        return snapshot

    def current(self) -> FleetAssessment:
        """The newest snapshot, building one now if the loop has not run yet."""
        return self.latest if self.latest is not None else self.run_once()


class Waker:
    """Cuts a background job's wait short: a fatal Xid should not sit until the next tick.

    ``poke`` may be called from any thread; :func:`periodic` jobs given the waker run as soon as
    it is poked (pokes during a run coalesce into one more run).
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def bind(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()

    def poke(self) -> None:
        if self._loop is not None and self._event is not None:
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self, timeout_s: float) -> None:
        assert self._event is not None, "bind() the waker in the event loop first"
        try:
            await asyncio.wait_for(self._event.wait(), timeout_s)
        except TimeoutError:
            pass
        self._event.clear()


class _Counter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


async def periodic(
    name: str,
    interval_s: float,
    job: Callable[[], Any],
    waker: Waker | None = None,
    failures: _Counter | None = None,
    runs: _Counter | None = None,
) -> None:
    """Run ``job`` in a thread now and then every ``interval_s`` (sooner when ``waker`` is
    poked), until cancelled. A failed pass is logged, counted on ``failures`` and retried; a
    completed one is counted on ``runs``."""
    while True:
        started = asyncio.get_running_loop().time()
        hint: float | None = None
        try:
            result = await asyncio.to_thread(job)
            logger.debug("%s: %s", name, result)
            if runs is not None:
                runs.inc()
            # A job may know when it next has work (the planner: a node about to go silent).
            hint = getattr(result, "next_run_s", None)
        except Exception:
            if failures is not None:
                failures.inc()
            logger.exception("background job %s failed; retrying in %.0f s", name, interval_s)
        elapsed = asyncio.get_running_loop().time() - started
        # A job slower than its interval still leaves the loop a breather, never a busy loop.
        pause = max(interval_s - elapsed, 0.1 * interval_s)
        if hint is not None:
            pause = min(pause, max(hint + 0.05, 0.05))
        if waker is None:
            await asyncio.sleep(pause)
        else:
            await waker.wait(pause)
