"""A manufacturing lot's failure hazard at a moment: how many of its units died lately.

Titan's GPUs failed in waves by batch: the 2012-13 boards wore out from 2015 on, their 2016-17
replacements far less (Ostrouchov et al., SC20). A serial number starts with its lot
(``0323712007755``: product ``03237``, year ``12``, then the lot's further digits), so the units
of a lot share their parts and their making. A lot whose units are failing *now* is in its wave;
its all-time share of failures lags the wave, so both are given.

For a unit in service at :math:`t` whose serial starts with lot :math:`L` (the first
:math:`k` characters, :data:`DEFAULT_PREFIXES`), with :math:`n_L` the lot's units in service at
:math:`t`, :math:`w_L(h) = \\sum_{j \\in L,\\ f_j \\le t} 2^{-(t - f_j)/h}` its recency-weighted
first failures and the fleet's :math:`W(h)/N` as prior (:math:`m` pseudo-units):

``lot{k}_recent_{h}d``
    :math:`(w_L(h) + m\\,W(h)/N) / (n_L + m)`, the lot's recent failures per unit in service.
``lot{k}_share``
    :math:`(F_L + m\\,F/U) / (U_L + m)`: failures among all the lot's units seen so far
    (:math:`U_L`), shrunk the same way.

Leak-free: :math:`f_j`, :math:`n_L` and :math:`U_L` come from the snapshot at :math:`t`
(:func:`~fleetwatch.models.snapshot.snapshot`), which knows nothing after :math:`t`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from fleetwatch.models.snapshot import InventorySnapshot

__all__ = ["lot_columns", "lot_hazard"]

DEFAULT_PREFIXES = (7, 9)
DEFAULT_HALF_LIVES = (90.0, 365.0)
_DAY = pd.Timedelta(days=1)


def lot_columns(
    prefixes: Sequence[int] = DEFAULT_PREFIXES, half_lives: Sequence[float] = DEFAULT_HALF_LIVES
) -> tuple[str, ...]:
    """Column names of :func:`lot_hazard`."""
    names: list[str] = []
    for k in prefixes:
        names += [f"lot{k}_recent_{h:g}d" for h in half_lives]
        names.append(f"lot{k}_share")
    return tuple(names)


def lot_hazard(
    snap: InventorySnapshot,
    prefixes: Sequence[int] = DEFAULT_PREFIXES,
    half_lives: Sequence[float] = DEFAULT_HALF_LIVES,
    *,
    prior_units: float = 20.0,
) -> pd.DataFrame:
    """:func:`lot_columns` for each unit of ``snap.units`` (float, same index).

    Parameters
    ----------
    snap : InventorySnapshot
    prefixes : sequence of int
        Lot = the serial's first ``k`` characters, for each ``k`` (>= 1).
    half_lives : sequence of float
        Half-lives of the recent rates in days (> 0).
    prior_units : float
        Pseudo-units :math:`m` of shrinkage towards the fleet (> 0).
    """
    if not prior_units > 0 or any(k < 1 for k in prefixes) or any(not h > 0 for h in half_lives):
        raise ValueError(
            f"need prior_units > 0, prefixes >= 1 and half-lives > 0; got {prior_units}, "
            f"{list(prefixes)}, {list(half_lives)}"
        )
    units = snap.units.index.to_series()
    failures = snap.failures
    seen = pd.Index(snap.stints["serial"].unique()).union(failures.index)
    age = ((snap.at - failures["time"]) / _DAY).to_numpy(dtype=np.float64)
    n_fleet = max(len(units), 1)
    out = pd.DataFrame(index=units.index)
    names = iter(lot_columns(prefixes, half_lives))
    for k in prefixes:
        lot = units.str[:k]
        in_service = lot.map(lot.value_counts()).to_numpy(dtype=np.float64)
        failed_lot = failures.index.to_series().str[:k].to_numpy()
        for h in half_lives:
            weight = pd.Series(np.exp2(-age / h))
            per_lot = weight.groupby(failed_lot).sum()
            base = float(weight.sum()) / n_fleet
            recent = lot.map(per_lot).fillna(0.0).to_numpy(dtype=np.float64)
            out[next(names)] = (recent + prior_units * base) / (in_service + prior_units)
        ever = seen.to_series().str[:k].value_counts()
        dead = pd.Series(failed_lot).value_counts()
        base = len(failures) / max(len(seen), 1)
        n_ever = lot.map(ever).fillna(0.0).to_numpy(dtype=np.float64)
        n_dead = lot.map(dead).fillna(0.0).to_numpy(dtype=np.float64)
        out[next(names)] = (n_dead + prior_units * base) / (n_ever + prior_units)
    return out
