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
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, case, delete, func, select

from fleetwatch.models.telemetry_features import GPU_CATEGORIES, rollup_hour
from fleetwatch.rules.xid_catalog import XidCatalog
from fleetwatch.server.db.sample_joins import SAMPLE_GPU_UUID, SAMPLES_WITH_GPU
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import events, gpu_hourly, gpu_samples, gpus
from fleetwatch.server.jobs.isolation import ItemGuard
from fleetwatch.server.jobs.locks import LockKey, try_transaction_lock
from fleetwatch.server.jobs.state import load_state, save_state

__all__ = [
    "RollupJob",
    "fleet_window_features",
    "floor_hour",
    "refresh_rollups",
    "roll_up_hours",
]

_COLUMNS = (
    "gpu_temp_c",
    "clocks_event_reasons",
    "ecc_sbe_aggregate_total",
    "nvlink_crc_flit_errors_total",
    "nvlink_crc_data_errors_total",
    "nvlink_replay_errors_total",
    "nvlink_recovery_errors_total",
    "pcie_replay_total",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
)
_DAY_S = 86400.0


def floor_hour(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def _xids_by_gpu_hour(
    conn: Connection, start: datetime, end: datetime
) -> dict[tuple[str, datetime], list[int]]:
    """Xid codes per (GPU UUID, hour); events that name only a PCI bus id are matched to the GPU
    at that address on the same node."""
    by_address = {
        (row.node_id, row.pci_bus_id): row.uuid
        for row in conn.execute(select(gpus.c.uuid, gpus.c.node_id, gpus.c.pci_bus_id))
    }
    rows = conn.execute(
        select(events.c.node_id, events.c.gpu_uuid, events.c.pci_bus_id, events.c.xid, events.c.ts)
        .where(events.c.kind == "xid", events.c.ts >= start, events.c.ts < end)
        .where(events.c.xid.is_not(None))
    )
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
) -> int:
    """Recompute the rollups of every GPU for the hours in ``[start, end)``; return rows written."""
    start, end = floor_hour(start), end
    cols = [gpu_samples.c[name] for name in _COLUMNS]
    rows = conn.execute(
        select(SAMPLE_GPU_UUID, gpu_samples.c.node_id, gpu_samples.c.ts, *cols)
        .select_from(SAMPLES_WITH_GPU)
        .where(gpu_samples.c.ts >= start, gpu_samples.c.ts < end)
        .order_by(SAMPLE_GPU_UUID, gpu_samples.c.ts)
    )
    grouped: dict[tuple[str, datetime], list[dict[str, Any]]] = defaultdict(list)
    node_of: dict[str, int] = {}
    for row in rows:
        mapping = row._mapping
        grouped[(row.gpu_uuid, floor_hour(row.ts))].append(dict(mapping))
        node_of[row.gpu_uuid] = row.node_id
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
    conn.execute(delete(gpu_hourly).where(gpu_hourly.c.hour >= start, gpu_hourly.c.hour < end))
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
    newest_id = conn.execute(select(func.max(gpu_samples.c.id))).scalar()
    newest_hour = conn.execute(select(func.max(gpu_hourly.c.hour))).scalar()
    if newest_hour is None:
        start = conn.execute(select(func.min(gpu_samples.c.ts))).scalar()
    else:
        start = newest_hour - timedelta(hours=lookback_hours)
        if after_id is not None:
            oldest_new = conn.execute(
                select(func.min(gpu_samples.c.ts)).where(gpu_samples.c.id > after_id)
            ).scalar()
            if oldest_new is not None:
                start = min(start, oldest_new)
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


class RollupJob:
    """The leader's rollups job: keeps ``gpu_hourly`` current. A pass is skipped while another
    process runs one. The newest sample id of the last pass is kept in ``leader_state`` (not
    memory): a pass starting without it would miss late samples older than its lookback that
    arrived since that pass (an agent's spool after an outage)."""

    def __init__(self, db: Database, catalog: XidCatalog, guard: ItemGuard | None = None) -> None:
        self.db = db
        self.catalog = catalog
        self.guard = guard or ItemGuard("rollups")

    def __call__(self, now: datetime | None = None) -> int | None:
        now = now or datetime.now(UTC)
        with self.db.write() as conn:
            if not try_transaction_lock(conn, LockKey.ROLLUPS):
                return None
            state = load_state(conn, "rollups") or {}
            written, after_id = refresh_rollups(
                conn,
                now=now,
                catalog=self.catalog,
                after_id=state.get("after_id"),
                guard=self.guard,
            )
            save_state(conn, "rollups", {"after_id": after_id}, now)
            return written


def _rate(value_col: Any) -> Any:
    """Sum of increases per day of the time covered by hours that reported the counter."""
    known = and_(value_col.is_not(None), gpu_hourly.c.span_s > 0)
    span = func.sum(case((known, gpu_hourly.c.span_s)))
    return func.sum(case((known, value_col))) / func.nullif(span, 0) * _DAY_S


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
            out.update(_window_aggregate(conn, uuids[i : i + 1000], start, hour))
    return out


def _window_aggregate(
    conn: Connection, uuids: list[str], start: datetime, newest: datetime
) -> dict[str, dict[str, float]]:
    xid_cols = [func.sum(gpu_hourly.c[f"xid_{c}"]).label(f"xid_{c}") for c in GPU_CATEGORIES]
    query = (
        select(
            gpu_hourly.c.gpu_uuid,
            _rate(gpu_hourly.c.sbe_errors).label("sbe_per_day"),
            _rate(gpu_hourly.c.nvlink_errors).label("nvlink_errors_per_day"),
            _rate(gpu_hourly.c.pcie_replays).label("pcie_replays_per_day"),
            func.max(gpu_hourly.c.temp_p95_c).label("temp_p95_c"),
            (
                func.sum(gpu_hourly.c.throttled)
                * 1.0
                / func.nullif(func.sum(gpu_hourly.c.throttle_reported), 0)
            ).label("throttle_fraction"),
            func.max(gpu_hourly.c.remapped_rows).label("remapped_rows"),
            *xid_cols,
        )
        .where(gpu_hourly.c.gpu_uuid.in_(uuids))
        .where(gpu_hourly.c.hour >= floor_hour(start), gpu_hourly.c.hour <= newest)
        .group_by(gpu_hourly.c.gpu_uuid)
    )
    out: dict[str, dict[str, float]] = {}
    for row in conn.execute(query):
        values = dict(row._mapping)
        uuid = values.pop("gpu_uuid")
        out[uuid] = {k: float(v) for k, v in values.items() if v is not None}
    return out
