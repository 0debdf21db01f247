"""What every /metrics page needs of the fleet, kept in memory: the nodes and the event counts.

The cache follows the ``nodes`` and ``events`` tables incrementally (rows whose ``last_seen`` /
``received_at`` moved past a watermark, with an overlap that catches transactions committed out
of order), at most once per ``ttl_s``, so every replica and worker shows the whole fleet, not
only what it ingested itself. Both tables are small next to the GPUs' (a node has 8 GPUs; events
are rare), which is why GPUs are not cached here: a shard reads its own GPUs' rows when scraped,
and its nodes' labels (:meth:`FleetCache.labels`; the default page needs none of them, and every
node's row moves at every push, so following them would re-read every node's labels).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from fleetwatch.rules.host_errors import HOST_KINDS
from fleetwatch.server.concepts.planned import Planned, WindowRow
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.raw_rows import psycopg_rows
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import events, nodes
from fleetwatch.server.metrics.shards import Shard, node_hash
from fleetwatch.server.repo.maintenance import ENDED_LOOKBACK, windows_since

__all__ = ["IDS_PER_QUERY", "CachedNode", "EventCounts", "FleetCache"]

_OVERLAP = timedelta(seconds=30)
# A kernel-log event's severity (``details.severity``; fatal, corrected, ...), as text.
_SEVERITY = events.c.details["severity"].as_string().label("severity")
# Node ids per IN (...) list: well under SQLite's oldest limit of 999 bound parameters.
IDS_PER_QUERY = 500


@dataclass(frozen=True)
class CachedNode:
    id: int
    name: str
    interval_s: float
    last_seen: datetime
    hashed: int  # node_hash(name), for shard membership without rehashing per scrape
    lag_s: float | None = None  # how late its newest push was stored (server.concepts.ingest_lag)


@dataclass(frozen=True)
class EventCounts:
    """Events counted since the database began: Xids by (node id, GPU uuid, code), every event
    by (node id, kind), host errors (sxid, pcie_aer, mce, edac) by (node id, kind, severity;
    ``None`` where the event carried none). Copies, safe to read without the cache's lock."""

    xids: dict[tuple[int, str, int], int]
    kinds: dict[tuple[int, str], int]
    host: dict[tuple[int, str, str | None], int]


class FleetCache:
    """Nodes and event counts, refreshed from the database at most once per ``ttl_s``."""

    def __init__(
        self, db: Database, *, ttl_s: float, clock: Callable[[], datetime] = utcnow
    ) -> None:
        self._db = db
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._refreshed_at: float | None = None
        self._nodes: dict[int, CachedNode] = {}
        self._node_mark: datetime | None = None
        self._event_mark: datetime | None = None
        self._seen_events: dict[int, datetime] = {}
        self._xids: dict[tuple[int, str, int], int] = {}
        self._kinds: dict[tuple[int, str], int] = {}
        self._host: dict[tuple[int, str, str | None], int] = {}
        self._windows: list[WindowRow] = []
        self._window_labels: dict[str, dict[str, Any]] = {}

    def nodes(self, shard: Shard | None = None) -> list[CachedNode]:
        """Every node (of ``shard``), sorted by name."""
        self.refresh()
        with self._lock:
            found = [n for n in self._nodes.values() if shard is None or shard.holds_hash(n.hashed)]
        return sorted(found, key=lambda n: n.name)

    def labels(self, node_ids: Sequence[int]) -> dict[int, dict[str, str]]:
        """The labels of ``node_ids``, read now (not cached)."""
        found: dict[int, dict[str, str]] = {}
        with self._db.read() as conn:
            for start in range(0, len(node_ids), IDS_PER_QUERY):
                chunk = node_ids[start : start + IDS_PER_QUERY]
                query = select(nodes.c.id, nodes.c.labels).where(nodes.c.id.in_(chunk))
                found.update((row.id, row.labels) for row in conn.execute(query))
        return found

    def planned(self, now: datetime) -> Planned:
        """The maintenance windows at ``now``, from the windows read at the last refresh."""
        self.refresh()
        with self._lock:
            return Planned.build(self._windows, self._window_labels, now)

    def event_counts(self) -> EventCounts:
        self.refresh()
        with self._lock:
            return EventCounts(dict(self._xids), dict(self._kinds), dict(self._host))

    def refresh(self, *, force: bool = False) -> None:
        with self._lock:
            fresh = self._refreshed_at is not None and (
                time.monotonic() - self._refreshed_at < self._ttl_s
            )
            if fresh and not force:
                return
            with self._db.read() as conn:
                self._load_nodes(conn)
                self._load_events(conn)
                since = self._clock() - ENDED_LOOKBACK
                self._windows, self._window_labels = windows_since(conn, since)
            self._refreshed_at = time.monotonic()

    def _load_nodes(self, conn: Any) -> None:
        since = None if self._node_mark is None else self._node_mark - _OVERLAP
        sql = "SELECT id, name, interval_s, last_seen, lag_s FROM nodes"
        if since is not None:
            sql += " WHERE last_seen >= %(since)s"
        rows = psycopg_rows(conn, sql, {"since": since})
        if rows is None:
            query = select(
                nodes.c.id, nodes.c.name, nodes.c.interval_s, nodes.c.last_seen, nodes.c.lag_s
            )
            if since is not None:
                query = query.where(nodes.c.last_seen >= since)
            rows = [tuple(row) for row in conn.execute(query)]
        for node_id, name, interval_s, last_seen, lag_s in rows:  # every node moves each push
            old = self._nodes.get(node_id)
            hashed = old.hashed if old is not None else node_hash(name)
            self._nodes[node_id] = CachedNode(node_id, name, interval_s, last_seen, hashed, lag_s)
            if self._node_mark is None or last_seen > self._node_mark:
                self._node_mark = last_seen

    def _load_events(self, conn: Any) -> None:
        if self._event_mark is None:
            self._count_all_events(conn)
        assert self._event_mark is not None
        since = self._event_mark - _OVERLAP
        rows = conn.execute(
            select(
                events.c.id,
                events.c.node_id,
                events.c.gpu_uuid,
                events.c.kind,
                events.c.xid,
                _SEVERITY,
                events.c.received_at,
            ).where(events.c.received_at >= since)
        )
        for row in rows:
            if row.id in self._seen_events:
                continue
            self._seen_events[row.id] = row.received_at
            self._count(row.node_id, row.gpu_uuid, row.kind, row.xid, row.severity, 1)
            self._event_mark = max(self._event_mark, row.received_at)
        horizon = self._event_mark - 2 * _OVERLAP
        self._seen_events = {i: t for i, t in self._seen_events.items() if t >= horizon}

    def _count_all_events(self, conn: Any) -> None:
        """First load: aggregate what is already stored, then follow by watermark."""
        mark = conn.execute(select(func.max(events.c.received_at))).scalar() or self._clock()
        self._event_mark = mark
        since = mark - _OVERLAP
        grouped = conn.execute(
            select(
                events.c.node_id,
                events.c.gpu_uuid,
                events.c.kind,
                events.c.xid,
                _SEVERITY,
                func.count().label("n"),
            )
            .where(events.c.received_at < since)
            .group_by(events.c.node_id, events.c.gpu_uuid, events.c.kind, events.c.xid, _SEVERITY)
        )
        for row in grouped:
            self._count(row.node_id, row.gpu_uuid, row.kind, row.xid, row.severity, row.n)

    def _count(
        self,
        node_id: int | None,
        uuid: str | None,
        kind: str,
        xid: int | None,
        severity: str | None,
        n: int,
    ) -> None:
        if node_id is None:
            return  # fleet-wide events (model wear-out) have no node label to count under
        key = (node_id, kind)
        self._kinds[key] = self._kinds.get(key, 0) + n
        if kind in HOST_KINDS:
            hkey = (node_id, kind, severity)
            self._host[hkey] = self._host.get(hkey, 0) + n
        if kind == "xid" and xid is not None:
            xkey = (node_id, uuid or "", xid)
            self._xids[xkey] = self._xids.get(xkey, 0) + n
