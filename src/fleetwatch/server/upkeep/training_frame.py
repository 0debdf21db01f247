"""The training frame of the risk models, built from stored lifetimes and hourly telemetry.

One row per GPU lifetime (``gpu_lifetimes``) that began before ``now``:

* ``duration_days``: (``removed_at`` or ``now``) - ``installed_at``, in days (rows <= 0 dropped);
* ``event``: 1 when the lifetime ended in a failure; repairs, retirements and open lifetimes are
  censored (0);
* ``group``: the SKU, or None;
* the telemetry covariates of :data:`~fleetwatch.models.telemetry_features.FEATURE_NAMES`, from the
  GPU's ``gpu_hourly`` rows in the ``window_days`` before the lifetime's end (or ``now``); NaN where
  the GPU did not report one (or the lifetime has no ``gpu_uuid``). Only hours that had ended by
  ``now`` count: an hour's row holds every sample of the hour, so one that straddles ``now``
  would carry readings from after it;
* with a ``location_pattern``, ``loc_<name>`` for each named group of the pattern that matched a
  number.

The frame's index is the lifetime's id. Telemetry is read in chunks of GPUs, not per lifetime.

The frame at ``now`` holds only what had happened by ``now`` (installs, removals, their kinds,
telemetry), so a frame at a past ``now`` is what a refit then would have seen: the held-out
evaluation of a refit (:mod:`fleetwatch.server.upkeep.promotion`) fits on it. Knowledge is dated
by the events themselves: a lifetime imported later but installed before ``now`` counts as known.
:func:`window_outcomes` gives what then happened to the units in service at such a ``now``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import numpy as np
import pandas as pd
from sqlalchemy import Connection, select

from fleetwatch.inventory import compile_location_pattern, location_columns
from fleetwatch.models.registry import DURATION_DAYS, EVENT, GROUP
from fleetwatch.models.telemetry_features import FEATURE_NAMES, HourRollup, window_features
from fleetwatch.server.db.tables import gpu_hourly, gpu_lifetimes

__all__ = ["hourly_by_gpu", "read_chunks", "training_frame", "window_outcomes"]

_DAY_S = 86400.0
_HOUR = timedelta(hours=1)
CHUNK_GPUS = 500
SPAN_WINDOWS = 3


def read_chunks(
    windows: dict[str, list[tuple[datetime, datetime]]],
) -> Iterator[tuple[list[str], datetime, datetime]]:
    """GPUs in chunks of at most :data:`CHUNK_GPUS` whose windows lie close together in time,
    with each chunk's span. One query reads a chunk's span for all its GPUs, so GPUs whose
    windows are months apart (lifetimes that ended at different times) must not share one: a
    chunk closes once its span would exceed :data:`SPAN_WINDOWS` times its longest window."""
    spans = sorted(
        (min(w[0] for w in ws), max(w[1] for w in ws), u) for u, ws in windows.items() if ws
    )
    chunk: list[str] = []
    start = end = datetime.min.replace(tzinfo=UTC)
    longest = timedelta(0)
    for lo, hi, uuid in spans:
        if chunk:
            too_wide = max(end, hi) - start > SPAN_WINDOWS * max(longest, hi - lo)
            if len(chunk) >= CHUNK_GPUS or too_wide:
                yield chunk, start, end
                chunk = []
        if not chunk:
            start, end, longest = lo, hi, hi - lo
        chunk.append(uuid)
        end, longest = max(end, hi), max(longest, hi - lo)
    if chunk:
        yield chunk, start, end


def hourly_by_gpu(
    conn: Connection, windows: dict[str, list[tuple[datetime, datetime]]], now: datetime
) -> dict[str, list[HourRollup]]:
    """Every rollup of the given GPUs inside the span of their windows and ended by ``now``,
    grouped by GPU (a GPU may also get rollups of its chunk's span outside its own windows)."""
    found: dict[str, list[HourRollup]] = defaultdict(list)
    for chunk, start, end in read_chunks(windows):
        query = select(gpu_hourly).where(
            gpu_hourly.c.gpu_uuid.in_(chunk),
            gpu_hourly.c.hour >= start,
            gpu_hourly.c.hour < end,
            gpu_hourly.c.hour <= now - _HOUR,  # the hour had ended by now
        )
        for row in conn.execute(query).mappings():
            found[row["gpu_uuid"]].append(HourRollup.from_row(cast(Mapping[str, Any], row)))
    return found


def training_frame(
    conn: Connection,
    *,
    now: datetime,
    window_days: float = 7,
    location_pattern: str | None = None,
) -> pd.DataFrame:
    """The lifetimes stored by ``now`` as a frame for :meth:`RiskBundle.fit
    <fleetwatch.models.registry.RiskBundle.fit>` (see the module docstring for its columns)."""
    if window_days <= 0:
        raise ValueError(f"window_days must be > 0, got {window_days}")
    pattern = compile_location_pattern(location_pattern)
    query = (
        select(
            gpu_lifetimes.c.id,
            gpu_lifetimes.c.gpu_uuid,
            gpu_lifetimes.c.location,
            gpu_lifetimes.c.sku,
            gpu_lifetimes.c.installed_at,
            gpu_lifetimes.c.removed_at,
            gpu_lifetimes.c.end_kind,
        )
        .where(gpu_lifetimes.c.installed_at < now)
        .order_by(gpu_lifetimes.c.id)
    )
    window = timedelta(days=window_days)
    ids: list[int] = []
    durations: list[float] = []
    events: list[int] = []
    groups: list[str | None] = []
    locations: list[str | None] = []
    ends: list[tuple[str | None, datetime]] = []
    for row in conn.execute(query):
        ended = row.removed_at is not None and row.removed_at <= now
        end = row.removed_at if ended else now
        duration = (end - row.installed_at).total_seconds() / _DAY_S
        if duration <= 0:
            continue
        ids.append(row.id)
        durations.append(duration)
        events.append(int(ended and row.end_kind == "failure"))
        groups.append(row.sku)
        locations.append(row.location)
        ends.append((row.gpu_uuid, end))

    windows: dict[str, list[tuple[datetime, datetime]]] = defaultdict(list)
    for uuid, end in ends:
        if uuid is not None:
            windows[uuid].append((end - window, end))
    hourly = hourly_by_gpu(conn, windows, now)
    features: list[dict[str, float]] = []
    for uuid, end in ends:
        rollups = hourly.get(uuid, []) if uuid is not None else []
        inside = [r for r in rollups if end - window <= r.hour < end]
        features.append(window_features(inside))

    columns: dict[str, Any] = {
        DURATION_DAYS: np.asarray(durations, dtype=np.float64),
        EVENT: np.asarray(events, dtype=np.int64),
        GROUP: pd.Series(groups, dtype=object),
    }
    for name in FEATURE_NAMES:
        columns[name] = np.asarray([f.get(name, np.nan) for f in features], dtype=np.float64)
    if pattern is not None:
        for name, values in location_columns(locations, pattern).items():
            columns[name] = np.asarray(values, dtype=np.float64)
    frame = pd.DataFrame(columns)
    frame.index = pd.Index(ids, name="lifetime_id")
    return frame


def window_outcomes(conn: Connection, *, start: datetime, end: datetime) -> pd.Series:
    """What happened in ``(start, end]`` to each lifetime in service at ``start``.

    A boolean Series indexed by lifetime id (the index of :func:`training_frame` at ``start``,
    where these lifetimes are its open rows): True when the lifetime ended in a failure inside
    the window. A repair or retirement in the window, or no ending, is False, as in the backtest.
    """
    if end <= start:
        raise ValueError(f"the window must end after it starts, got ({start}, {end}]")
    lt = gpu_lifetimes.c
    query = (
        select(lt.id, lt.removed_at, lt.end_kind)
        .where(lt.installed_at < start, (lt.removed_at.is_(None)) | (lt.removed_at > start))
        .order_by(lt.id)
    )
    ids: list[int] = []
    failed: list[bool] = []
    for row in conn.execute(query):
        ids.append(row.id)
        ended = row.removed_at is not None and row.removed_at <= end
        failed.append(ended and row.end_kind == "failure")
    return pd.Series(failed, index=pd.Index(ids, name="lifetime_id"), dtype=bool, name="failed")
