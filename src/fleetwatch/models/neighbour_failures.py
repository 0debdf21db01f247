"""Recent failures around a unit, weighted by how recent they are.

Titan's GPUs share air and power with their neighbours: a blade's four nodes, a cage's eight
blades, a cabinet's three cages, a column of cabinets along the room's airflow. Failures cluster
in space and time where cooling is poor, so the failures a unit's areas saw lately say something
about its own hazard that its position alone (a fixed effect) cannot follow as conditions change.

For a unit in service at :math:`t` and each area :math:`A` of :data:`NEIGHBOUR_AREAS` it belongs
to, with half-life :math:`h` days,

.. math::

    \\mathrm{nb}_{A,h} = \\sum_{j\\,\\text{failed in}\\,A,\\ f_j \\le t} 2^{-(t - f_j)/h}

over the *first* failures :math:`f_j` of the units that failed in that area (a unit that
logged a failure 80 times in one afternoon counts once). The unit itself is never among them: it
is in service, so it has not failed. Leak-free: only failures known by :math:`t` are in a
snapshot's ``failures``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from fleetwatch.models.snapshot import InventorySnapshot

__all__ = ["NEIGHBOUR_AREAS", "neighbour_columns", "neighbour_failures"]

NEIGHBOUR_AREAS = ("node_key", "blade_key", "cage_key", "cabinet_key", "column_key")
"""Area key columns (:data:`~fleetwatch.models.snapshot.AREA_KEYS`) counted around a unit."""
DEFAULT_HALF_LIVES = (30.0, 180.0)
_DAY = pd.Timedelta(days=1)


def neighbour_columns(half_lives: Sequence[float] = DEFAULT_HALF_LIVES) -> tuple[str, ...]:
    """Column names of :func:`neighbour_failures`: ``nb_<area>_<h>d``."""
    return tuple(f"nb_{a.removesuffix('_key')}_{h:g}d" for a in NEIGHBOUR_AREAS for h in half_lives)


def neighbour_failures(
    snap: InventorySnapshot, half_lives: Sequence[float] = DEFAULT_HALF_LIVES
) -> pd.DataFrame:
    """Recency-weighted failure counts per area and half-life, for each unit of ``snap.units``.

    Parameters
    ----------
    snap : InventorySnapshot
    half_lives : sequence of float
        Half-lives :math:`h` in days (> 0).

    Returns
    -------
    pandas.DataFrame
        Float columns :func:`neighbour_columns`, indexed like ``snap.units``.
    """
    if any(not h > 0 for h in half_lives):
        raise ValueError(f"half-lives must be > 0 days, got {list(half_lives)}")
    failures = snap.failures
    age = ((snap.at - failures["time"]) / _DAY).to_numpy(dtype=np.float64)
    out = pd.DataFrame(index=snap.units.index)
    names = iter(neighbour_columns(half_lives))
    for area in NEIGHBOUR_AREAS:
        keys = snap.units[area]
        for h in half_lives:
            weight = pd.Series(np.exp2(-age / h), index=failures.index)
            per_area = weight.groupby(failures[area].to_numpy()).sum()
            out[next(names)] = keys.map(per_area).fillna(0.0).to_numpy(dtype=np.float64)
    return out
