"""A cohort's recent failure rate: units of the same vintage at the same kind of position.

Titan's old boards wore out at a pace set by their heat: the top cage and a blade's first two
nodes first, the bottom cage last (Ostrouchov et al., SC20). A *cohort* is the units that share
a manufacturing year (from the serial) and a position class: cage level and node number within
the blade. At a moment :math:`t`, the cohort's recent failures per unit tell where its wave
stands: before, at or past its peak. A fixed position effect cannot follow that, and the lot
(:mod:`fleetwatch.models.lot_hazard`) mixes positions.

For a unit in service at :math:`t` in cohort :math:`C`, with :math:`n_C` cohort units in
service, first failures :math:`f_j` of cohort units (cohort of the position they failed at) and
half-life :math:`h`:

``cohort_recent_{h}d``
    :math:`(\\sum_{j \\in C} 2^{-(t - f_j)/h} + m\\,W(h)/N) / (n_C + m)`, shrunk towards the
    fleet's recent failures per unit in service with :math:`m` pseudo-units.

Leak-free: only failures known by :math:`t` are in the snapshot
(:func:`~fleetwatch.models.snapshot.snapshot`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from fleetwatch.models.history_features import serial_vintage
from fleetwatch.models.snapshot import InventorySnapshot

__all__ = ["cohort_columns", "cohort_hazard"]

DEFAULT_HALF_LIVES = (90.0, 365.0)
_DAY = pd.Timedelta(days=1)


def cohort_columns(half_lives: Sequence[float] = DEFAULT_HALF_LIVES) -> tuple[str, ...]:
    """Column names of :func:`cohort_hazard`."""
    return tuple(f"cohort_recent_{h:g}d" for h in half_lives)


def _cohort(serials: pd.Series, cage: pd.Series, node: pd.Series) -> pd.Series:
    year = serial_vintage(serials)["mfg_year"].fillna(-1).astype(int).astype(str)
    return year.str.cat([cage.astype(str), node.astype(str)], sep="/").set_axis(serials.index)


def cohort_hazard(
    snap: InventorySnapshot,
    half_lives: Sequence[float] = DEFAULT_HALF_LIVES,
    *,
    prior_units: float = 20.0,
) -> pd.DataFrame:
    """:func:`cohort_columns` for each unit of ``snap.units`` (float, same index)."""
    if not prior_units > 0 or any(not h > 0 for h in half_lives):
        raise ValueError(
            f"need prior_units > 0 and half-lives > 0, got {prior_units}, {half_lives}"
        )
    units, failures = snap.units, snap.failures
    mine = _cohort(units.index.to_series(), units["cage"], units["node"])
    where = failures["node_key"].str.extract(r"c(\d+)s\d+n(\d+)$")
    theirs = _cohort(failures.index.to_series(), where[0], where[1]).to_numpy()
    n_here = mine.map(mine.value_counts()).to_numpy(dtype=np.float64)
    age = ((snap.at - failures["time"]) / _DAY).to_numpy(dtype=np.float64)
    n_fleet = max(len(units), 1)
    out = pd.DataFrame(index=units.index)
    for name, h in zip(cohort_columns(half_lives), half_lives, strict=True):
        weight = pd.Series(np.exp2(-age / h))
        per_cohort = weight.groupby(theirs).sum()
        recent = mine.map(per_cohort).fillna(0.0).to_numpy(dtype=np.float64)
        base = float(weight.sum()) / n_fleet
        out[name] = (recent + prior_units * base) / (n_here + prior_units)
    return out
