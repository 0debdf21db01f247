"""The inventory as it stood at one moment: units in service, their stints, the failures seen.

Every landmark covariate (:mod:`fleetwatch.models.landmark_features`) is a function of an
:class:`InventorySnapshot`, and :func:`snapshot` builds one from
:func:`~fleetwatch.models.history_features.known_before` alone: stints inserted at or after the
moment :math:`t` are dropped, and a removal or failure after :math:`t` is forgotten (the stint is
open at :math:`t`). Nothing after :math:`t` can therefore reach a covariate computed at :math:`t`.

A unit is *in service* at :math:`t` when it has a stint open at :math:`t` and had not failed
before :math:`t`; this is the set :func:`~fleetwatch.models.features.survival_frame` marks
``in_service``, so a backtest scores the same units with either. Its *failure* is its first event
row (``DBE``, ``OTB``, ...), as in :func:`~fleetwatch.models.features.failures_in_window`; a unit's
stints after its first failure are not its history.

Locations are Titan positions ``c{col}-{row}c{cage}s{slot}n{node}``; :data:`AREA_KEYS` names the
nested areas a position belongs to, from the node itself to the cabinet column.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from fleetwatch.models.features import LOCATION_COLUMNS, location_covariates
from fleetwatch.models.history_features import known_before

__all__ = ["AREA_KEYS", "InventorySnapshot", "area_keys", "prepare_records", "snapshot"]

AREA_KEYS = ("node_key", "blade_key", "cage_key", "cabinet_key", "column_key")
"""Area key columns: ``node_key`` ``c1-0c2s3n1`` (one GPU), ``blade_key`` ``c1-0c2s3`` (4 nodes),
``cage_key`` ``c1-0c2`` (8 blades), ``cabinet_key`` ``c1-0`` (3 cages) and ``column_key`` ``c1``
(a line of cabinets)."""
_DAY = pd.Timedelta(days=1)
_PREPARED = (*AREA_KEYS, *LOCATION_COLUMNS)


def area_keys(locations: pd.Series) -> pd.DataFrame:
    """Area keys (:data:`AREA_KEYS`) and integer position columns of Titan locations.

    Examples
    --------
    >>> area_keys(pd.Series(["c1-0c2s3n1"])).iloc[0].tolist()
    ['c1-0c2s3n1', 'c1-0c2s3', 'c1-0c2', 'c1-0', 'c1', 1, 0, 2, 3, 1]
    """
    loc = location_covariates(locations)
    col, row, cage, slot = (loc[c].astype(str) for c in ("col", "row", "cage", "slot"))
    cabinet = "c" + col + "-" + row
    keys = pd.DataFrame(
        {
            "node_key": cabinet + "c" + cage + "s" + slot + "n" + loc["node"].astype(str),
            "blade_key": cabinet + "c" + cage + "s" + slot,
            "cage_key": cabinet + "c" + cage,
            "cabinet_key": cabinet,
            "column_key": "c" + col,
        },
        index=locations.index,
    )
    return keys.join(loc)


def prepare_records(records: pd.DataFrame) -> pd.DataFrame:
    """``records`` with :func:`area_keys` joined on, parsed once for many snapshots.

    A frame that already has the columns is returned as it is.
    """
    if all(c in records.columns for c in _PREPARED):
        return records
    return records.join(area_keys(records["location"].astype(str)))


@dataclass(frozen=True)
class InventorySnapshot:
    """What the inventory knew at ``at``.

    Attributes
    ----------
    at : Timestamp
    stints : DataFrame
        Stints begun before ``at`` and before their unit's first failure (record columns plus
        area keys); ``removed`` is NaT while the stint was open at ``at``. ``ended_in_failure``
        marks the stint that ended with its unit's first failure.
    failures : DataFrame
        Each unit's first failure before ``at``: indexed by serial, ``time`` and the area keys of
        the location it failed at.
    units : DataFrame
        Units in service at ``at``, indexed by serial: ``location``, area keys, position columns,
        ``first_seen``, ``stint_start``, ``n_stints`` and ``age_days`` (> 0).
    """

    at: pd.Timestamp
    stints: pd.DataFrame
    failures: pd.DataFrame
    units: pd.DataFrame


def snapshot(records: pd.DataFrame, at: pd.Timestamp | str) -> InventorySnapshot:
    """The :class:`InventorySnapshot` of ``records`` at ``at``, from what was known before it.

    Parameters
    ----------
    records : pandas.DataFrame
        Inventory records (serial, location, inserted, removed, event), ideally through
        :func:`prepare_records` first when many snapshots are taken.
    at : Timestamp or str
        The moment; records inserted at or after it, and removals after it, are not seen.
    """
    t = pd.Timestamp(at)
    known = known_before(prepare_records(records), t)
    events = known[known["event"].notna() & known["removed"].notna()]
    first = events.sort_values("removed").drop_duplicates("serial").set_index("serial")
    failures = first[["removed", *AREA_KEYS]].rename(columns={"removed": "time"})

    stints = known[known["inserted"].notna()]
    failed_at = stints["serial"].map(failures["time"])
    stints = stints[failed_at.isna() | (stints["inserted"] < failed_at)]
    failed_at = failed_at.loc[stints.index]
    stints = stints.assign(
        ended_in_failure=stints["removed"].notna() & (stints["removed"] >= failed_at)
    )
    stints = stints.sort_values(["serial", "inserted", "removed"], na_position="last")

    per_unit = stints.groupby("serial")
    open_stints = stints[stints["removed"].isna() & failed_at.loc[stints.index].isna()]
    current = open_stints.groupby("serial").tail(1).set_index("serial")
    first_seen = per_unit["inserted"].min().reindex(current.index)
    age = ((t - first_seen) / _DAY).astype(np.float64)
    current = current[age > 0]
    units = current[["location", *_PREPARED]].copy()
    units["first_seen"] = first_seen.loc[units.index]
    units["stint_start"] = current["inserted"]
    units["n_stints"] = per_unit.size().reindex(units.index).astype(np.float64)
    units["age_days"] = age.loc[units.index]
    return InventorySnapshot(at=t, stints=stints, failures=failures, units=units)
