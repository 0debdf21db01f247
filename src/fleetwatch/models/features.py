"""Inventory records to survival data: durations, events and location covariates at a cutoff.

An *inventory record* is one stint of one unit in one slot, with columns ``serial``, ``location``,
``inserted``, ``removed`` (timestamps) and ``event`` (empty, or a failure kind such as ``DBE``).
Titan's ``gc_full.csv`` is such a table (:func:`read_titan`).

At a cutoff :math:`c` only what was known before :math:`c` is used: stints inserted at or after
:math:`c` are dropped, removals after :math:`c` are not yet known, and failures after :math:`c`
are invisible. Per unit, with :math:`s` its first insertion,

.. math::

    d = \\begin{cases} f - s & \\text{failed at } f \\le c \\\\
                       \\min(r_{\\max}, c) - s & \\text{otherwise (censored)} \\end{cases}

in days, where :math:`r_{\\max}` is the latest removal. Age is calendar time since first insertion.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from fleetwatch.models.history_features import HISTORY_COLUMNS, history_covariates

__all__ = [
    "HISTORY_COLUMNS",
    "LOCATION_COLUMNS",
    "MODEL_COLUMNS",
    "RECORD_COLUMNS",
    "TitanLocation",
    "failures_in_window",
    "location_covariates",
    "parse_location",
    "read_titan",
    "survival_frame",
]

RECORD_COLUMNS = ("serial", "location", "inserted", "removed", "event")
LOCATION_COLUMNS = ("col", "row", "cage", "slot", "node")
MODEL_COLUMNS = (*LOCATION_COLUMNS, "col_odd", "lot_fail_rate", "cabinet_fail_rate")
"""Covariates of the backtest's model: location plus the history covariates that helped on the
earlier Titan cutoffs (benchmarks/HISTORY.md, "Titan backtest")."""
_LOCATION = re.compile(r"^c(?P<col>\d+)-(?P<row>\d+)c(?P<cage>\d+)s(?P<slot>\d+)n(?P<node>\d+)$")
_DAY = pd.Timedelta(days=1)


class TitanLocation(NamedTuple):
    """A Cray XK7 position: cabinet column and row, cage (0 bottom), slot and node."""

    col: int
    row: int
    cage: int
    slot: int
    node: int


def parse_location(location: str) -> TitanLocation:
    """Parse ``c{col}-{row}c{cage}s{slot}n{node}``, e.g. ``c11-2c1s4n1`` -> (11, 2, 1, 4, 1).

    Raises
    ------
    ValueError
        If ``location`` does not have that form.
    """
    match = _LOCATION.match(location.strip())
    if match is None:
        raise ValueError(
            f"location {location!r} is not a Titan position like 'c11-2c1s4n1' "
            "(c{col}-{row}c{cage}s{slot}n{node})"
        )
    return TitanLocation(*(int(v) for v in match.groups()))


def location_covariates(locations: pd.Series) -> pd.DataFrame:
    """Integer columns ``col, row, cage, slot, node`` from a Series of Titan locations.

    The index of ``locations`` is kept. Raises ``ValueError`` naming the first unparsable value.
    """
    parts = locations.astype(str).str.strip().str.extract(_LOCATION)
    bad = parts.isna().any(axis=1)
    if bad.any():
        first = locations[bad].iloc[0]
        raise ValueError(
            f"{int(bad.sum())} locations are not Titan positions like 'c11-2c1s4n1'; "
            f"first: {first!r}"
        )
    return parts.astype(np.int64)[list(LOCATION_COLUMNS)]


def read_titan(path: str | Path) -> pd.DataFrame:
    """Read Titan's ``gc_full.csv`` as inventory records (:data:`RECORD_COLUMNS`).

    Serial numbers stay strings (they have leading zeros). Rows with an empty ``insert`` are
    extra event annotations of a stint and are kept: they carry a failure time.
    """
    raw = pd.read_csv(path, dtype={"SN": str, "location": str, "event": str})
    records = pd.DataFrame(
        {
            "serial": raw["SN"],
            "location": raw["location"],
            "inserted": pd.to_datetime(raw["insert"]),
            "removed": pd.to_datetime(raw["remove"]),
            "event": raw["event"].where(raw["event"].notna(), None),
        }
    )
    return records


def _check_records(records: pd.DataFrame) -> None:
    missing = [c for c in RECORD_COLUMNS if c not in records.columns]
    if missing:
        raise ValueError(f"records lack column(s) {missing}; need {list(RECORD_COLUMNS)}")


def survival_frame(
    records: pd.DataFrame, cutoff: pd.Timestamp | str, *, history: bool = False
) -> pd.DataFrame:
    """One row per unit known before ``cutoff``: duration, event, location and service state.

    Only first failures count; a unit's stints after its first failure are ignored. With
    ``history=True`` the columns :data:`HISTORY_COLUMNS` of
    :func:`~fleetwatch.models.history_features.history_covariates` are joined on, computed
    from the records known before ``cutoff`` only.

    Returns
    -------
    pandas.DataFrame
        Indexed by ``serial``, with ``first_seen``, ``location``, ``col``, ``row``, ``cage``,
        ``slot``, ``node``, ``duration`` (days, > 0), ``event`` (bool, failed before the cutoff),
        ``in_service`` (in a slot at the cutoff, not failed) and ``age_days`` (= ``duration``
        for units in service, NaN otherwise).
    """
    _check_records(records)
    cut = pd.Timestamp(cutoff)
    failed = records[records["event"].notna() & (records["removed"] <= cut)]
    failure_time = failed.groupby("serial")["removed"].min().rename("failure_time")

    stints = records[records["inserted"].notna() & (records["inserted"] < cut)]
    stints = stints.join(failure_time, on="serial")
    before_failure = stints["failure_time"].isna() | (stints["inserted"] < stints["failure_time"])
    stints = stints[before_failure].sort_values(["serial", "inserted", "removed"])

    units = stints.groupby("serial").agg(
        first_seen=("inserted", "min"),
        last_removed=("removed", "max"),
        location=("location", "last"),
        failure_time=("failure_time", "first"),
    )
    event = units["failure_time"].notna()
    in_service = ~event & (units["last_removed"] > cut)
    end = units["failure_time"].where(event, units["last_removed"].clip(upper=cut))
    duration = (end - units["first_seen"]) / _DAY

    frame = pd.DataFrame(
        {
            "first_seen": units["first_seen"],
            "location": units["location"],
            "duration": duration.astype(np.float64),
            "event": event.astype(bool),
            "in_service": in_service.astype(bool),
        }
    )
    frame = frame[frame["duration"] > 0]
    frame = frame.join(location_covariates(frame["location"]))
    frame["age_days"] = frame["duration"].where(frame["in_service"])
    if history:
        frame = frame.join(history_covariates(records, frame, cut))
    return frame


def failures_in_window(
    records: pd.DataFrame, start: pd.Timestamp | str, end: pd.Timestamp | str
) -> pd.Series:
    """Each unit's earliest failure time in ``(start, end]``, indexed by serial."""
    _check_records(records)
    lo, hi = pd.Timestamp(start), pd.Timestamp(end)
    removed = records["removed"]
    hits = records[records["event"].notna() & (removed > lo) & (removed <= hi)]
    return hits.groupby("serial")["removed"].min().rename("failure_time")
