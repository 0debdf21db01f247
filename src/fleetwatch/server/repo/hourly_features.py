"""Window covariates from the hourly rollups (``gpu_hourly``): one aggregate query.

:func:`window_aggregate` computes, in SQL, what
:func:`fleetwatch.models.telemetry_features.window_features` computes from rollups in Python.
The assessment reads it at each GPU's own newest hour
(:func:`fleetwatch.server.upkeep.rollups.fleet_window_features`); the weekly report reads it at
a fixed time, the week's start (:func:`window_features_before`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, case, func, select

from fleetwatch.models.telemetry_features import GPU_CATEGORIES
from fleetwatch.server.db.tables import gpu_hourly

__all__ = ["floor_hour", "window_aggregate", "window_features_before"]

_DAY_S = 86400.0


def floor_hour(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def _rate(value_col: Any) -> Any:
    """Sum of increases per day of the time covered by hours that reported the counter."""
    known = and_(value_col.is_not(None), gpu_hourly.c.span_s > 0)
    span = func.sum(case((known, gpu_hourly.c.span_s)))
    return func.sum(case((known, value_col))) / func.nullif(span, 0) * _DAY_S


def window_features_before(
    conn: Connection, *, end: datetime, window: timedelta
) -> dict[str, dict[str, float]]:
    """For every GPU with rollups of whole hours in ``[end - window, end)``, its covariates over
    those hours: what the server would have scored it with at ``end``."""
    newest = floor_hour(end) - timedelta(hours=1)  # the last hour that ended by ``end``
    start = end - window
    uuids = list(
        conn.execute(
            select(gpu_hourly.c.gpu_uuid)
            .where(gpu_hourly.c.hour >= floor_hour(start), gpu_hourly.c.hour <= newest)
            .distinct()
        ).scalars()
    )
    out: dict[str, dict[str, float]] = {}
    for i in range(0, len(uuids), 1000):
        out.update(window_aggregate(conn, uuids[i : i + 1000], start, newest))
    return out


def window_aggregate(
    conn: Connection, uuids: list[str], start: datetime, newest: datetime
) -> dict[str, dict[str, float]]:
    """Covariates of ``uuids`` over their rollups from ``start``'s hour to ``newest`` (an hour,
    inclusive); a covariate a GPU never reported there is absent."""
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
