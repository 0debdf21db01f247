"""Maintenance around a unit: the replacement campaign's pace and when its blade was last opened.

In 2016-17 Titan's operators replaced most of the old GPUs, hottest positions first, before they
failed (Ostrouchov et al., SC20). A unit pulled healthy cannot fail in the window, so "failed
within :math:`H`" is a race between the unit's own hazard and the campaign reaching it: where
healthy units are being pulled fast, a unit is likely to be pulled before it fails. And a blade
that was just opened (a neighbour swapped) has been handled and retested.

For a unit in service at :math:`t`, with half-life :math:`h` days:

``rm_<area>_<h>d``
    Healthy removals (stints that ended without their unit's failure) in the unit's cage or
    cabinet, or at its position class (same cage level and node number anywhere in the machine),
    weighted :math:`2^{-(t - r)/h}` by removal time :math:`r`, per unit now in service there.
``touch_<area>_days``
    Days since the last insertion or removal (other than the unit's own current insertion)
    in the unit's blade or cage; 3650 if none.

Leak-free: removals and insertions after :math:`t` are not in the snapshot at :math:`t`
(:func:`~fleetwatch.models.snapshot.snapshot`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from fleetwatch.models.snapshot import InventorySnapshot

__all__ = ["maintenance_activity", "maintenance_columns"]

DEFAULT_HALF_LIVES = (30.0, 90.0)
REMOVAL_AREAS = ("cage_key", "cabinet_key", "position_class")
TOUCH_AREAS = ("blade_key", "cage_key")
NEVER_DAYS = 3650.0
_DAY = pd.Timedelta(days=1)


def _name(area: str) -> str:
    return area.removesuffix("_key")


def maintenance_columns(half_lives: Sequence[float] = DEFAULT_HALF_LIVES) -> tuple[str, ...]:
    """Column names of :func:`maintenance_activity`."""
    removal = [f"rm_{_name(a)}_{h:g}d" for a in REMOVAL_AREAS for h in half_lives]
    return (*removal, *(f"touch_{_name(a)}_days" for a in TOUCH_AREAS))


def _position_class(frame: pd.DataFrame) -> pd.Series:
    return frame["cage"].astype(str) + "n" + frame["node"].astype(str)


def maintenance_activity(
    snap: InventorySnapshot, half_lives: Sequence[float] = DEFAULT_HALF_LIVES
) -> pd.DataFrame:
    """:func:`maintenance_columns` for each unit of ``snap.units`` (float, same index)."""
    if any(not h > 0 for h in half_lives):
        raise ValueError(f"half-lives must be > 0 days, got {list(half_lives)}")
    units = snap.units.assign(position_class=_position_class(snap.units))
    stints = snap.stints.assign(position_class=_position_class(snap.stints))
    healthy = stints[stints["removed"].notna() & ~stints["ended_in_failure"]]
    age = ((snap.at - healthy["removed"]) / _DAY).to_numpy(dtype=np.float64)
    out = pd.DataFrame(index=units.index)
    names = iter(maintenance_columns(half_lives))
    for area in REMOVAL_AREAS:
        keys = units[area]
        n_here = keys.map(keys.value_counts()).to_numpy(dtype=np.float64)
        for h in half_lives:
            weight = pd.Series(np.exp2(-age / h), index=healthy.index)
            per_area = weight.groupby(healthy[area].to_numpy()).sum()
            out[next(names)] = keys.map(per_area).fillna(0.0).to_numpy(dtype=np.float64) / n_here

    # every insertion and removal but the unit's own current insertion: the two latest per
    # area suffice, since at most one of them is the unit's own
    moves = pd.concat(
        [
            stints[["serial", "inserted", *TOUCH_AREAS]].rename(columns={"inserted": "time"}),
            stints[["serial", "removed", *TOUCH_AREAS]].rename(columns={"removed": "time"}),
        ],
        ignore_index=True,
    ).dropna(subset=["time"])
    here = pd.DataFrame(
        {"unit": units.index, "since": units["stint_start"].to_numpy()}, index=units.index
    )
    for area in TOUCH_AREAS:
        latest = moves.sort_values("time", ascending=False).groupby(area).head(2)
        pairs = here.assign(key=units[area]).merge(
            latest[["serial", "time", area]].rename(columns={area: "key"}), on="key"
        )
        own = (pairs["serial"] == pairs["unit"]) & (pairs["time"] == pairs["since"])
        last = pairs[~own].groupby("unit")["time"].max()
        since = (snap.at - last.reindex(units.index)) / _DAY
        out[next(names)] = since.fillna(NEVER_DAYS).clip(upper=NEVER_DAYS).to_numpy(np.float64)
    return out
