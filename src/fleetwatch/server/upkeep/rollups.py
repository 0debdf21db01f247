"""Hourly telemetry rollups (``gpu_hourly``): the covariates of the survival models, kept current.

A pass recomputes every hour that may have changed since the previous one (see
:func:`refresh_rollups`), up to now with the current hour partial, replacing what was stored for
them: recomputing is idempotent, and late samples are picked up by their ids.

The window covariates are then one ``GROUP BY`` over the rollups, :func:`fleet_window_features`,
which computes exactly what :func:`fleetwatch.models.telemetry_features.window_features` computes
in Python (a test holds the two to each other).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import Connection, delete, func, select
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from fleetwatch.models.hour_folds import FOLD_COLUMNS
from fleetwatch.models.telemetry_features import rollup_hour
from fleetwatch.rules.xid_catalog import XidCatalog
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import events, gpu_hourly, gpu_sample_blocks, gpus
from fleetwatch.server.repo.hourly_features import floor_hour, window_aggregate
from fleetwatch.server.repo.sample_reader import (
    SampleChunk,
    from_us,
    newest_block_id,
    read_samples,
)
from fleetwatch.server.runtime.isolation import ItemGuard
from fleetwatch.server.runtime.locks import LockKey, try_transaction_lock
from fleetwatch.server.runtime.passes import give_way
from fleetwatch.server.runtime.state import load_state, save_state
from fleetwatch.server.upkeep.recent_rollups import (
    EVENT_ID_OVERLAP,
    SAMPLE_ID_OVERLAP,
    RecentHours,
)

__all__ = [
    "RollupJob",
    "fleet_window_features",
    "floor_hour",
    "refresh_rollups",
    "roll_up_hours",
]

_COLUMNS = FOLD_COLUMNS  # the sample fields a rollup reads
_CHUNK = 20_000  # sample blocks fetched at a time
_UUIDS = 500  # GPU UUIDs per IN (...) list
_ROWS_PER_INSERT = 500  # rows per INSERT ... VALUES: 18 parameters each, under SQLite's 32,766
_FAR_FUTURE = datetime(9999, 1, 1, tzinfo=UTC)
_STAGE = "fleetwatch_gpu_hourly_stage"  # the temporary table rollups are copied into


def _by_address(conn: Connection, rows: Sequence[Any]) -> dict[tuple[int, str | None], str]:
    """GPU UUID by (node id, PCI bus id) on the nodes of the event ``rows`` that name no GPU:
    the GPU such an event (a kernel-log Xid) is about."""
    node_ids = sorted({row.node_id for row in rows if not row.gpu_uuid and row.node_id})
    out: dict[tuple[int, str | None], str] = {}
    for i in range(0, len(node_ids), _UUIDS):
        query = select(gpus.c.uuid, gpus.c.node_id, gpus.c.pci_bus_id).where(
            gpus.c.node_id.in_(node_ids[i : i + _UUIDS])
        )
        out.update({(row.node_id, row.pci_bus_id): row.uuid for row in conn.execute(query)})
    return out


def _xids_by_gpu_hour(
    conn: Connection, start: datetime, end: datetime
) -> dict[tuple[str, datetime], list[int]]:
    """Xid codes per (GPU UUID, hour); events that name only a PCI bus id are matched to the GPU
    at that address on the same node."""
    rows = conn.execute(
        select(events.c.node_id, events.c.gpu_uuid, events.c.pci_bus_id, events.c.xid, events.c.ts)
        .where(events.c.kind == "xid", events.c.ts >= start, events.c.ts < end)
        .where(events.c.xid.is_not(None))
    ).all()
    by_address = _by_address(conn, rows)
    out: dict[tuple[str, datetime], list[int]] = defaultdict(list)
    for row in rows:
        uuid = row.gpu_uuid or by_address.get((row.node_id, row.pci_bus_id))
        if uuid is not None:
            out[(uuid, floor_hour(row.ts))].append(int(row.xid))
    return out


def roll_up_hours(
    conn: Connection,
    *,
    start: datetime,
    end: datetime,
    catalog: XidCatalog,
    guard: ItemGuard | None = None,
    gpu_uuids: list[str] | None = None,
) -> int:
    """Recompute the rollups of every GPU (or of ``gpu_uuids``) for the hours in
    ``[start, end)``; return rows written."""
    start, end = floor_hour(start), end
    grouped: dict[tuple[str, datetime], list[dict[str, Any]]] = defaultdict(list)
    node_of: dict[str, int] = {}
    for row in _sample_rows(conn, start, end, gpu_uuids):
        uuid, node_id, ts = row[1], row[2], row[3]
        sample = {"ts": ts, **dict(zip(_COLUMNS, row[4:], strict=True))}
        grouped[(uuid, floor_hour(ts))].append(sample)
        node_of[uuid] = node_id
    for samples in grouped.values():
        samples.sort(key=lambda sample: sample["ts"])
    xids = _xids_by_gpu_hour(conn, start, end)
    guard = guard or ItemGuard("rollups")
    out = []
    for (uuid, hour), samples in grouped.items():
        # A plain try per GPU-hour (not a context manager): 10,000 GPUs make this loop hot.
        try:
            rollup = rollup_hour(uuid, hour, samples, xids.get((uuid, hour), ()), catalog=catalog)
        except Exception as exc:  # noqa: BLE001 - one GPU's hour must not stop the fleet's
            guard.record_failure(f"gpu {uuid}", exc)
            continue
        guard.recovered(f"gpu {uuid}")
        out.append({**rollup.as_row(), "node_id": node_of[uuid]})
    if gpu_uuids is None:
        conn.execute(delete(gpu_hourly).where(gpu_hourly.c.hour >= start, gpu_hourly.c.hour < end))
    else:
        for chunk in _chunks(gpu_uuids):
            conn.execute(
                delete(gpu_hourly).where(
                    gpu_hourly.c.hour >= start,
                    gpu_hourly.c.hour < end,
                    gpu_hourly.c.gpu_uuid.in_(chunk),
                )
            )
    return guard.many(
        conn,
        out,
        lambda rows: conn.execute(gpu_hourly.insert(), rows),
        ident=lambda row: f"gpu {row['gpu_uuid']}",
    )


def refresh_rollups(
    conn: Connection,
    *,
    now: datetime,
    catalog: XidCatalog,
    after_id: int | None = None,
    lookback_hours: int = 2,
    backfill_hours: int = 7 * 24,
    progress: Callable[[int], None] | None = None,
    guard: ItemGuard | None = None,
) -> tuple[int, int | None]:
    """Bring ``gpu_hourly`` up to ``now``; return (rows written, the newest sample id seen).

    Hours recomputed: from ``lookback_hours`` before the newest rolled-up hour, or from the hour
    of the oldest sample stored after ``after_id`` (the id returned by the previous pass) when
    that is earlier, up to now; never more than ``backfill_hours`` back. On an empty table the
    start is the oldest stored sample. Late samples (an agent's spool after an outage, a
    simulated fleet catching up) are therefore rolled up too.
    """
    current = floor_hour(now)
    newest_id = newest_block_id(conn)
    start = _start_hour(conn, lookback_hours, after_id)
    if start is None:
        return 0, newest_id
    start = max(floor_hour(start), current - timedelta(hours=backfill_hours))
    written = 0
    hour = start
    while hour <= current:
        written += roll_up_hours(
            conn, start=hour, end=hour + timedelta(hours=1), catalog=catalog, guard=guard
        )
        if progress is not None:
            progress(1)
        hour += timedelta(hours=1)
    return written, newest_id


def _start_hour(conn: Connection, lookback_hours: int, after_id: int | None) -> datetime | None:
    """Where a full pass starts (see :func:`refresh_rollups`), before the backfill bound."""
    b = gpu_sample_blocks.c
    newest_hour = conn.execute(select(func.max(gpu_hourly.c.hour))).scalar()
    if newest_hour is None:
        start: datetime | None = conn.execute(select(func.min(b.ts0))).scalar()
        return start
    start = newest_hour - timedelta(hours=lookback_hours)
    if after_id is not None:
        oldest_new = conn.execute(select(func.min(b.ts0)).where(b.id > after_id)).scalar()
        if oldest_new is not None:
            start = min(start, oldest_new)
    return start


def _xid_events_after(conn: Connection, after_id: int) -> list[Any]:
    """Xid events stored after event id ``after_id``: (id, node_id, gpu_uuid, pci_bus_id, ts)."""
    e = events.c
    query = select(e.id, e.node_id, e.gpu_uuid, e.pci_bus_id, e.ts).where(
        e.id > after_id, e.kind == "xid", e.xid.is_not(None)
    )
    return list(conn.execute(query))


def _sample_rows(
    conn: Connection, start: datetime, end: datetime, gpu_uuids: list[str] | None
) -> list[tuple[Any, ...]]:
    """Every sample in [start, end) of every GPU (or of ``gpu_uuids``) as a row ``(block id,
    gpu_uuid, node_id, ts, *FOLD_COLUMNS)``, with Python values (None: not reported)."""
    gpu_ids = None if gpu_uuids is None else list(_gpu_ids(conn, gpu_uuids).values())
    if gpu_ids is not None and not gpu_ids:
        return []
    uuid_of: dict[int, str] = {}
    out: list[tuple[Any, ...]] = []
    for chunk in read_samples(conn, _COLUMNS, since=start, before=end, gpu_ids=gpu_ids):
        missing = sorted(set(np.unique(chunk.gpu_ids).tolist()) - uuid_of.keys())
        for i in range(0, len(missing), _UUIDS):
            query = select(gpus.c.id, gpus.c.uuid).where(gpus.c.id.in_(missing[i : i + _UUIDS]))
            uuid_of.update({row.id: row.uuid for row in conn.execute(query)})
        out.extend(_python_rows(chunk, uuid_of))
    return out


def _python_rows(chunk: SampleChunk, uuid_of: dict[int, str]) -> list[tuple[Any, ...]]:
    """``chunk``'s rows as :func:`_sample_rows` gives them."""
    columns: list[list[Any]] = [
        chunk.ids.tolist(),
        [uuid_of[i] for i in chunk.gpu_ids.tolist()],
        chunk.node_ids.tolist(),
        [from_us(us) for us in chunk.ts_us.tolist()],
    ]
    for values, raw in zip(chunk.values, chunk.raw, strict=True):
        python = raw.astype(np.bool_).tolist() if raw.dtype == np.uint8 else raw.tolist()
        missing = np.isnan(values).tolist()
        columns.append([None if m else v for v, m in zip(python, missing, strict=True)])
    return list(zip(*columns, strict=True))


def _gpu_ids(conn: Connection, uuids: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for chunk in _chunks(uuids):
        query = select(gpus.c.uuid, gpus.c.id).where(gpus.c.uuid.in_(chunk))
        out.update({row.uuid: row.id for row in conn.execute(query)})
    return out


def _gpu_hour_rows(conn: Connection, hour: datetime, uuids: list[str]) -> list[Any]:
    """Every sample of ``uuids`` in ``hour`` (as RecentHours.fold reads them)."""
    return _sample_rows(conn, hour, hour + timedelta(hours=1), uuids)


def _store_rollups(conn: Connection, rows: list[dict[str, Any]], *, replace: bool) -> None:
    """Insert ``rows`` into gpu_hourly (SQLite: many to a statement); with ``replace``, in place
    of the rows stored for the same GPU-hours (an upsert: a GPU-hour's row is rewritten whole)."""
    if not rows:
        return
    if conn.dialect.name == "postgresql":  # psycopg, as the settings require (like ingest)
        _copy_rollups(conn, rows, replace=replace)
        return
    insert = sqlite_insert(gpu_hourly)
    for i in range(0, len(rows), _ROWS_PER_INSERT):
        statement = insert.values(rows[i : i + _ROWS_PER_INSERT])
        if replace:
            keys = {c.name for c in gpu_hourly.primary_key}
            statement = statement.on_conflict_do_update(
                index_elements=sorted(keys),
                set_={
                    c.name: statement.excluded[c.name] for c in gpu_hourly.c if c.name not in keys
                },
            )
        conn.execute(statement)


def _copy_rollups(conn: Connection, rows: list[dict[str, Any]], *, replace: bool) -> None:
    """:func:`_store_rollups` on PostgreSQL through psycopg: the rows are copied into a
    temporary table of this session and inserted (or upserted) from there in one statement.
    A pass rewrites every GPU's current hour; as ``INSERT ... VALUES`` of 500 rows each, building
    and binding the statements cost about 1 ms of this process's CPU per row."""
    names = list(rows[0])
    columns = ", ".join(f'"{name}"' for name in names)
    insert = f"INSERT INTO gpu_hourly ({columns}) SELECT {columns} FROM {_STAGE}"
    if replace:
        keys = {c.name for c in gpu_hourly.primary_key}
        updates = ", ".join(f'"{n}" = EXCLUDED."{n}"' for n in names if n not in keys)
        insert += f" ON CONFLICT ({', '.join(sorted(keys))}) DO UPDATE SET {updates}"
    raw = conn.connection.driver_connection
    assert raw is not None
    with raw.cursor() as cursor:
        # Emptied at commit, and below: a savepoint rolled back (a bad row, see ItemGuard.many)
        # takes its copied rows with it.
        cursor.execute(
            f"CREATE TEMPORARY TABLE IF NOT EXISTS {_STAGE} (LIKE gpu_hourly) ON COMMIT DELETE ROWS"
        )
        with cursor.copy(f"COPY {_STAGE} ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row([row[name] for name in names])
        cursor.execute(insert)
        cursor.execute(f"DELETE FROM {_STAGE}")


def _chunks(items: list[str]) -> list[list[str]]:
    return [items[i : i + _UUIDS] for i in range(0, len(items), _UUIDS)]


def _by_hour(pairs: set[tuple[datetime, str]]) -> dict[datetime, list[str]]:
    out: dict[datetime, list[str]] = defaultdict(list)
    for hour, uuid in sorted(pairs):
        out[hour].append(uuid)
    return out


class RollupJob:
    """The leader's rollups job: keeps ``gpu_hourly`` current. A pass is skipped while another
    process runs one. The newest sample id of the last pass is kept in ``leader_state`` (not
    memory): a pass starting without it would miss late samples older than its lookback that
    arrived since that pass (an agent's spool after an outage).

    Its first pass recomputes what :func:`refresh_rollups` would, and keeps the recent hours
    folded (:class:`~fleetwatch.server.upkeep.recent_rollups.RecentHours`); later passes fold in
    only the samples stored since and rewrite only the GPU-hours that changed. When another
    process ran a pass in between (the stored pass count is not this job's own), it starts
    over."""

    def __init__(
        self,
        db: Database,
        catalog: XidCatalog,
        guard: ItemGuard | None = None,
        *,
        lookback_hours: int = 2,
        backfill_hours: int = 7 * 24,
    ) -> None:
        self.db = db
        self.catalog = catalog
        self.guard = guard or ItemGuard("rollups")
        self.lookback_hours = lookback_hours
        self.backfill_hours = backfill_hours
        self._recent: RecentHours | None = None
        # A GPU's UUID by its gpus.id (the packed read's key); a GPU keeps both for good.
        self._uuid_by_gpu_id: dict[int, str] = {}

    def __call__(self, now: datetime | None = None) -> int | None:
        now = now or datetime.now(UTC)
        recent, self._recent = self._recent, None  # kept only once this pass has committed
        with self.db.write() as conn:
            if not try_transaction_lock(conn, LockKey.ROLLUPS):
                return None
            state = load_state(conn, "rollups") or {}
            passes = int(state.get("passes", 0))
            if recent is None or recent.after_id is None or recent.passes != passes:
                recent, written = self._first_pass(conn, now, state.get("after_id"))
            else:
                written = self._next_pass(conn, recent, now)
            # Every pass counts, so a job (or an assessor's cache of the covariates) can tell
            # that gpu_hourly may have changed since it last looked.
            recent.passes = passes + 1
            save_state(conn, "rollups", {"after_id": recent.after_id, "passes": passes + 1}, now)
        self._recent = recent
        return written

    def _first_pass(
        self, conn: Connection, now: datetime, after_id: int | None
    ) -> tuple[RecentHours, int]:
        """What refresh_rollups does, folding the hours from its start on."""
        current = floor_hour(now)
        start = _start_hour(conn, self.lookback_hours, after_id)
        recent = RecentHours(floor=current, keep_hours=self.lookback_hours, catalog=self.catalog)
        recent.after_id = newest_block_id(conn)
        newest_event = conn.execute(select(func.max(events.c.id))).scalar() or 0
        recent.new_events(_xid_events_after(conn, newest_event - EVENT_ID_OVERLAP))  # seen
        recent.after_event_id = max(recent.after_event_id, newest_event)
        if start is None:
            return recent, 0
        start = max(floor_hour(start), current - timedelta(hours=self.backfill_hours))
        recent.floor = start
        self._fold_new(conn, recent, since=start, skip_seen=False, oldest=start)
        recent.note_xids(_xids_by_gpu_hour(conn, start, _FAR_FUTURE))
        written = 0
        hour = start
        while hour <= current:
            conn.execute(delete(gpu_hourly).where(gpu_hourly.c.hour == hour))
            if hour in recent.folds:
                slots = recent.folds[hour].slots().tolist()
                written += self._write(conn, recent, hour, slots, deleted=True)
            recent.dirty.pop(hour, None)  # later hours (an agent's clock ahead) wait for theirs
            hour += timedelta(hours=1)
        recent.forget_before(current - timedelta(hours=self.lookback_hours))
        return recent, written

    def _next_pass(self, conn: Connection, recent: RecentHours, now: datetime) -> int:
        current = floor_hour(now)
        oldest = current - timedelta(hours=self.backfill_hours)
        assert recent.after_id is not None
        after_id = recent.after_id - SAMPLE_ID_OVERLAP
        redo = self._fold_new(conn, recent, after_id=after_id, skip_seen=True, oldest=oldest)
        redo |= self._late_xids(conn, recent, oldest)
        recent.note_xids(_xids_by_gpu_hour(conn, recent.floor, _FAR_FUTURE))
        written = 0
        for hour, uuids in _by_hour(redo).items():
            if hour in recent.folds:  # refolded from all their samples, written below
                recent.refold(hour, _gpu_hour_rows(conn, hour, uuids), uuids)
            else:
                written += self._write_exact(conn, hour, uuids)
        for hour in sorted(recent.folds):
            if hour <= current and recent.dirty.get(hour):
                written += self._write(conn, recent, hour, recent.dirty.pop(hour))
        recent.forget_before(current - timedelta(hours=self.lookback_hours))
        return written

    def _fold_new(
        self,
        conn: Connection,
        recent: RecentHours,
        *,
        since: datetime | None = None,
        after_id: int | None = None,
        skip_seen: bool,
        oldest: datetime,
    ) -> set[tuple[datetime, str]]:
        """Fold the samples with ``ts >= since`` or in blocks after ``after_id`` into
        ``recent``; the GPU-hours to recompute from the database."""
        redo: set[tuple[datetime, str]] = set()
        for chunk in read_samples(conn, _COLUMNS, since=since, after_id=after_id, chunk=_CHUNK):
            give_way()  # between chunks of samples: the urgent lane first (runtime/passes.py)
            values = dict(zip(_COLUMNS, chunk.values, strict=True))
            reasons = chunk.raw[_COLUMNS.index("clocks_event_reasons")].astype(np.int64)
            redo |= recent.fold_arrays(
                chunk.ids,
                self._slots_of(conn, recent, chunk.gpu_ids),
                chunk.ts_us,
                chunk.node_ids,
                values,
                reasons,
                skip_seen=skip_seen,
                oldest=oldest,
            )
        return redo

    def _slots_of(
        self, conn: Connection, recent: RecentHours, gpu_ids: NDArray[np.int64]
    ) -> NDArray[np.int64]:
        """The slot in ``recent`` of each sample's GPU, by its ``gpus.id``."""
        keys, key_of = np.unique(gpu_ids, return_inverse=True)
        missing = [k for k in keys.tolist() if k not in self._uuid_by_gpu_id]
        for i in range(0, len(missing), _UUIDS):
            query = select(gpus.c.id, gpus.c.uuid).where(gpus.c.id.in_(missing[i : i + _UUIDS]))
            self._uuid_by_gpu_id.update({row.id: row.uuid for row in conn.execute(query)})
        slots = [recent.slot(self._uuid_by_gpu_id[k]) for k in keys.tolist()]
        return np.asarray(slots, np.int64)[key_of]

    def _late_xids(
        self, conn: Connection, recent: RecentHours, oldest: datetime
    ) -> set[tuple[datetime, str]]:
        """GPU-hours before the held ones with an Xid stored since the last pass (their rollups
        count it)."""
        found = recent.new_events(_xid_events_after(conn, recent.after_event_id - EVENT_ID_OVERLAP))
        late = [e for e in found if oldest <= e.ts < recent.floor]
        if not late:
            return set()
        by_address = _by_address(conn, late)
        out = set()
        for e in late:
            uuid = e.gpu_uuid or by_address.get((e.node_id, e.pci_bus_id))
            if uuid is not None:
                out.add((floor_hour(e.ts), uuid))
        return out

    def _write(
        self,
        conn: Connection,
        recent: RecentHours,
        hour: datetime,
        slots: Any,
        *,
        deleted: bool = False,
    ) -> int:
        """Write the rows of ``slots`` in ``hour`` (in place of what was stored for them)."""
        rows, exact = recent.rows(hour, slots)
        written = self.guard.many(
            conn,
            rows,
            lambda many: _store_rollups(conn, many, replace=not deleted),
            ident=lambda row: f"gpu {row['gpu_uuid']}",
        )
        return written + (self._write_exact(conn, hour, exact) if exact else 0)

    def _write_exact(self, conn: Connection, hour: datetime, uuids: list[str]) -> int:
        """Roll ``uuids``' hour up from all their samples, with Python integers."""
        return roll_up_hours(
            conn,
            start=hour,
            end=hour + timedelta(hours=1),
            catalog=self.catalog,
            guard=self.guard,
            gpu_uuids=uuids,
        )


def fleet_window_features(
    conn: Connection, *, window: timedelta, since: datetime
) -> dict[str, dict[str, float]]:
    """:func:`~fleetwatch.models.telemetry_features.window_features` for every GPU with rollups
    after ``since``, each over the ``window`` before its own newest rollup (the agent's clock, as
    the rules use: a simulated or lagging node is described as of its latest data). Covariates a
    GPU never reported are absent. One aggregate query per distinct newest hour (a live fleet has
    one or two)."""
    newest = conn.execute(
        select(gpu_hourly.c.gpu_uuid, func.max(gpu_hourly.c.hour).label("newest"))
        .where(gpu_hourly.c.hour >= floor_hour(since))
        .group_by(gpu_hourly.c.gpu_uuid)
    )
    by_hour: dict[datetime, list[str]] = defaultdict(list)
    for row in newest:
        by_hour[row.newest].append(row.gpu_uuid)
    out: dict[str, dict[str, float]] = {}
    for hour, uuids in by_hour.items():
        start = hour + timedelta(hours=1) - window
        for i in range(0, len(uuids), 1000):
            out.update(window_aggregate(conn, uuids[i : i + 1000], start, hour))
    return out
