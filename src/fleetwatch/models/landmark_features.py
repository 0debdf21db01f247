"""Covariates of every unit in service at a landmark, from what was known before it.

A *landmark* is a moment :math:`t` at which the fleet is looked at: each unit in service gets
one row of covariates, computed from :func:`~fleetwatch.models.snapshot.snapshot` at :math:`t`
alone. The same function serves training (many past landmarks, :mod:`fleetwatch.models.landmarks`)
and scoring (the cutoff), so the two see covariates built the same way.

Groups of columns (:data:`FEATURE_GROUPS`), each from one module:

``position``
    ``col, row, cage, slot, node`` and ``col_odd``: where the unit sits. Cage 2 is the top of a
    cabinet, where the air is hottest; failure rates alternate between neighbouring columns.
``age``
    ``age_days``: days since the unit's first insertion.
``unit``
    ``stint_days`` (days in its current slot), ``n_stints`` (its insertions so far: a unit pulled
    and put back has more than one), ``days_out`` (days since its first insertion spent out of
    any slot, e.g. on the bench between stints) and ``mfg_year`` (from the serial: 12 for the
    original boards, 16-17 for their replacements).
``exposure``
    ``days_cage0``, ``days_cage1``, ``days_cage2``, ``days_node01``: days the unit has spent at
    each cage level and in a blade's nodes 0-1, over all its stints; the heat it has taken.
``slot``
    :mod:`fleetwatch.models.slot_history`.
``neighbours``
    :mod:`fleetwatch.models.neighbour_failures`.
``lot``
    :mod:`fleetwatch.models.lot_hazard`.
``cohort``
    :mod:`fleetwatch.models.cohort_hazard`.
``maintenance``
    :mod:`fleetwatch.models.maintenance`.
``fleet``
    ``fleet_recent_30d``, ``fleet_recent_90d``: the fleet's recency-weighted failures per unit
    in service (half-lives 30 and 90 days), the same for every unit at a landmark; it lets a
    model trained on many landmarks follow the fleet's failure rate as it moves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from fleetwatch.models.cohort_hazard import cohort_columns, cohort_hazard
from fleetwatch.models.history_features import serial_vintage
from fleetwatch.models.lot_hazard import lot_columns, lot_hazard
from fleetwatch.models.maintenance import maintenance_activity, maintenance_columns
from fleetwatch.models.neighbour_failures import neighbour_columns, neighbour_failures
from fleetwatch.models.slot_history import SLOT_HISTORY_COLUMNS, slot_history
from fleetwatch.models.snapshot import InventorySnapshot, snapshot

__all__ = ["FEATURE_GROUPS", "feature_columns", "landmark_features"]

FEATURE_GROUPS: dict[str, tuple[str, ...]] = {
    "position": ("col", "row", "cage", "slot", "node", "col_odd"),
    "age": ("age_days",),
    "unit": ("stint_days", "n_stints", "days_out", "mfg_year"),
    "exposure": ("days_cage0", "days_cage1", "days_cage2", "days_node01"),
    "slot": SLOT_HISTORY_COLUMNS,
    "neighbours": neighbour_columns(),
    "lot": lot_columns(),
    "cohort": cohort_columns(),
    "maintenance": maintenance_columns(),
    "fleet": ("fleet_recent_30d", "fleet_recent_90d"),
}
_DAY = pd.Timedelta(days=1)


def feature_columns(groups: Sequence[str]) -> tuple[str, ...]:
    """The columns of ``groups`` in :data:`FEATURE_GROUPS` order.

    Raises
    ------
    ValueError
        Naming any group that does not exist.
    """
    unknown = [g for g in groups if g not in FEATURE_GROUPS]
    if unknown:
        raise ValueError(f"unknown feature group(s) {unknown}; choose from {list(FEATURE_GROUPS)}")
    return tuple(c for g, cols in FEATURE_GROUPS.items() if g in groups for c in cols)


def _position(snap: InventorySnapshot) -> pd.DataFrame:
    units = snap.units
    out = units[["col", "row", "cage", "slot", "node"]].astype(np.float64)
    out["col_odd"] = out["col"] % 2.0
    return out


def _age(snap: InventorySnapshot) -> pd.DataFrame:
    return snap.units[["age_days"]].astype(np.float64)


def _unit(snap: InventorySnapshot) -> pd.DataFrame:
    units, stints = snap.units, snap.stints
    year = serial_vintage(units.index.to_series())["mfg_year"]
    in_slots = (stints["removed"].fillna(snap.at) - stints["inserted"]) / _DAY
    in_slots = in_slots.groupby(stints["serial"].to_numpy()).sum().reindex(units.index)
    return pd.DataFrame(
        {
            "stint_days": (snap.at - units["stint_start"]) / _DAY,
            "n_stints": units["n_stints"],
            "days_out": (units["age_days"] - in_slots.fillna(0.0)).clip(lower=0.0),
            "mfg_year": year.fillna(-1.0),
        },
        index=units.index,
    ).astype(np.float64)


def _exposure(snap: InventorySnapshot) -> pd.DataFrame:
    stints = snap.stints
    days = (stints["removed"].fillna(snap.at) - stints["inserted"]) / _DAY
    spent = pd.DataFrame({"serial": stints["serial"], "days": days.to_numpy()})
    out = pd.DataFrame(index=snap.units.index)
    for level in (0, 1, 2):
        mask = (stints["cage"] == level).to_numpy()
        total = spent[mask].groupby("serial")["days"].sum()
        out[f"days_cage{level}"] = total.reindex(out.index).fillna(0.0)
    total = spent[(stints["node"] <= 1).to_numpy()].groupby("serial")["days"].sum()
    out["days_node01"] = total.reindex(out.index).fillna(0.0)
    return out.astype(np.float64)


def _fleet(snap: InventorySnapshot) -> pd.DataFrame:
    age = ((snap.at - snap.failures["time"]) / _DAY).to_numpy(dtype=np.float64)
    n = max(len(snap.units), 1)
    return pd.DataFrame(
        {f"fleet_recent_{h}d": float(np.exp2(-age / h).sum()) / n for h in (30, 90)},
        index=snap.units.index,
    )


_BUILDERS: dict[str, Callable[[InventorySnapshot], pd.DataFrame]] = {
    "position": _position,
    "age": _age,
    "unit": _unit,
    "exposure": _exposure,
    "slot": slot_history,
    "neighbours": neighbour_failures,
    "lot": lot_hazard,
    "cohort": cohort_hazard,
    "maintenance": maintenance_activity,
    "fleet": _fleet,
}


def landmark_features(
    records: pd.DataFrame | InventorySnapshot,
    at: pd.Timestamp | str | None = None,
    groups: Sequence[str] = tuple(FEATURE_GROUPS),
) -> pd.DataFrame:
    """One row per unit in service at ``at``: the columns of ``groups``, known before ``at``.

    Parameters
    ----------
    records : pandas.DataFrame or InventorySnapshot
        Inventory records (ideally :func:`~fleetwatch.models.snapshot.prepare_records`), or a
        snapshot already taken (then ``at`` is ignored).
    at : Timestamp or str
        The landmark; needed with records.
    groups : sequence of str
        Names from :data:`FEATURE_GROUPS` (default: all).

    Returns
    -------
    pandas.DataFrame
        Indexed by serial (the units in service at ``at``), float columns
        :func:`feature_columns` of ``groups``.
    """
    columns = feature_columns(groups)
    if isinstance(records, InventorySnapshot):
        snap = records
    else:
        if at is None:
            raise ValueError("give the landmark 'at' with inventory records")
        snap = snapshot(records, at)
    parts = [_BUILDERS[g](snap) for g in FEATURE_GROUPS if g in groups]
    frame = pd.concat(parts, axis=1) if parts else pd.DataFrame(index=snap.units.index)
    return frame[list(columns)].astype(np.float64)
