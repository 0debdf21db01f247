"""Covariates from what the inventory knew before a cutoff: vintage, unit and slot history.

Every function here first cuts the records down to what was known before the cutoff :math:`c`
(:func:`known_before`): stints inserted at or after :math:`c` are dropped, and a removal or
failure after :math:`c` is forgotten (the stint is still open at :math:`c`). Nothing after
:math:`c` can therefore reach a covariate, for training rows or for the units being scored.

Covariates, per unit (columns of :func:`history_covariates`):

``col_odd``
    1 if the cabinet column is odd (Titan's failure rates alternate between neighbouring
    columns in a way a linear ``col`` term cannot follow), else 0.
``mfg_year``
    Two-digit manufacturing year read from the serial number (Titan serials
    ``0323712007755``: characters 6-7, here ``12``); a vintage proxy known at insertion.
``lot_fail_rate``
    Share of units of the same lot (serial characters 1-8) *outside the unit's fold* that
    failed before :math:`c`, shrunk towards the fleet-wide share with ``prior_units``
    pseudo-units: :math:`(f_{-k(i)} + m\\,\\bar p)/(n_{-k(i)} + m)`.
``cabinet_fail_rate``, ``cage_fail_rate``, ``blade_fail_rate``
    The same shrunken share over the units outside the unit's fold that ever sat in the unit's
    cabinet (``c{col}-{row}``), cage (``...c{cage}``) or blade (``...s{slot}``) before :math:`c`.

Why folds: a model is trained on these rates and on each unit's own outcome. Leaving out only
the unit itself (leave-one-out) gives a failed unit a lower rate than its healthy group mates,
:math:`(F-1)/(N-1)` against :math:`F/(N-1)`, so the rate encodes the unit's own label and a model
learns that a *lower* group rate means failure. Every unit is instead given a fold
:math:`k(i)` (a hash of its serial, the same at every cutoff) and its group's rate is counted
over the other folds only: the rate no longer depends on the unit's own outcome.
``loc_prior_failures``
    Failures of other units at the unit's own location (node) before the unit was first
    inserted there; for a unit in service at :math:`c` these are its predecessors' failures.
``n_stints``
    The unit's stints begun before :math:`c` (a reinserted unit has more than one).
"""

from __future__ import annotations

import zlib

import numpy as np
import pandas as pd
from numpy.typing import NDArray

__all__ = [
    "HISTORY_COLUMNS",
    "fold_of",
    "history_covariates",
    "known_before",
    "serial_vintage",
]

HISTORY_COLUMNS = (
    "col_odd",
    "mfg_year",
    "lot_fail_rate",
    "cabinet_fail_rate",
    "cage_fail_rate",
    "blade_fail_rate",
    "loc_prior_failures",
    "n_stints",
)
_AREA_PATTERNS = {
    "cabinet": r"^(c\d+-\d+)",
    "cage": r"^(c\d+-\d+c\d+)",
    "blade": r"^(c\d+-\d+c\d+s\d+)",
}


def known_before(records: pd.DataFrame, cutoff: pd.Timestamp | str) -> pd.DataFrame:
    """The inventory as it stood just before ``cutoff``.

    Stints inserted at or after the cutoff are dropped; a stint removed after it gets
    ``removed = NaT`` and ``event = None`` (it was still open). Event rows without an insert
    time are kept only if their removal (the failure) came before the cutoff.
    """
    cut = pd.Timestamp(cutoff)
    inserted, removed = records["inserted"], records["removed"]
    keep = (inserted < cut) | (inserted.isna() & (removed <= cut))
    known = records[keep].copy()
    later = ~(known["removed"] <= cut)
    known.loc[later, "removed"] = pd.NaT
    known["event"] = known["event"].astype(object).where(~later, None)
    return known


def serial_vintage(serials: pd.Series) -> pd.DataFrame:
    """``mfg_year`` (float, NaN if unreadable) and ``lot`` (first 8 characters) from serials.

    Examples
    --------
    >>> serial_vintage(pd.Series(["0323712007755"])).iloc[0].tolist()
    [12.0, '03237120']
    """
    text = serials.astype(str).str.strip()
    year = pd.to_numeric(text.str[5:7], errors="coerce").astype(np.float64)
    return pd.DataFrame({"mfg_year": year, "lot": text.str[:8]}, index=serials.index)


def fold_of(serials: pd.Index | pd.Series, folds: int) -> NDArray[np.int64]:
    """Each serial's fold in ``range(folds)``: a hash of the serial, so a unit keeps its fold at
    every cutoff and on every machine."""
    return np.asarray([zlib.crc32(str(s).encode()) % folds for s in serials], dtype=np.int64)


def _shrunk_rate(
    keys: pd.Series,
    unit_keys: pd.DataFrame,
    failed: pd.Series,
    prior_units: float,
    folds: int,
) -> pd.Series:
    """Shrunken failure share of each unit's group(s) over the units outside its fold.

    ``unit_keys`` has columns ``serial`` and ``key`` (every group a unit belonged to);
    ``keys`` maps each scored serial to its own group; ``failed`` maps serial to bool.
    """
    members = unit_keys.drop_duplicates()
    members = members.assign(
        failed=members["serial"].map(failed).fillna(False).astype(bool),
        fold=fold_of(members["serial"], folds),
    )
    n = members.groupby("key").size()
    f = members.groupby("key")["failed"].sum()
    n_fold = members.groupby(["key", "fold"]).size()
    f_fold = members.groupby(["key", "fold"])["failed"].sum()
    base = float(failed.mean()) if len(failed) else 0.0
    own = pd.MultiIndex.from_arrays([keys.to_numpy(), fold_of(keys.index, folds)])
    n_others = keys.map(n).fillna(0.0) - n_fold.reindex(own).fillna(0.0).to_numpy()
    f_others = keys.map(f).fillna(0.0) - f_fold.reindex(own).fillna(0.0).to_numpy()
    rate = (f_others + prior_units * base) / (n_others + prior_units)
    return rate.astype(np.float64)


def history_covariates(
    records: pd.DataFrame,
    units: pd.DataFrame,
    cutoff: pd.Timestamp | str,
    *,
    prior_units: float = 20.0,
    folds: int = 5,
) -> pd.DataFrame:
    """:data:`HISTORY_COLUMNS` for each unit of ``units``, from records known before ``cutoff``.

    Parameters
    ----------
    records : pandas.DataFrame
        Inventory records (``serial``, ``location``, ``inserted``, ``removed``, ``event``).
    units : pandas.DataFrame
        Indexed by serial, with the unit's ``location`` (as from
        :func:`~fleetwatch.models.features.survival_frame`).
    cutoff : Timestamp or str
        Only records known before it are read (:func:`known_before`).
    prior_units : float
        Pseudo-units of shrinkage towards the fleet-wide failure share (> 0).
    folds : int
        Folds the group rates leave out one of (>= 2; see the module docstring).

    Returns
    -------
    pandas.DataFrame
        Float columns :data:`HISTORY_COLUMNS`, indexed like ``units``.
    """
    if not prior_units > 0:
        raise ValueError(f"prior_units must be > 0, got {prior_units}")
    if folds < 2:
        raise ValueError(f"folds must be >= 2, got {folds}")
    known = known_before(records, cutoff)
    fails = known[known["event"].notna() & known["removed"].notna()]
    first_fail = fails.groupby("serial")["removed"].min()
    stints = known[known["inserted"].notna()].join(first_fail.rename("_failed_at"), on="serial")
    # as in survival_frame, a unit's stints after its first failure are not its own history
    before = stints["_failed_at"].isna() | (stints["inserted"] < stints["_failed_at"])
    stints = stints[before].drop(columns="_failed_at")
    serials = pd.Index(stints["serial"].unique())
    failed = pd.Series(serials.isin(first_fail.index), index=serials)

    out = pd.DataFrame(index=units.index)
    vintage = serial_vintage(units.index.to_series())
    year = vintage["mfg_year"]
    out["mfg_year"] = year.fillna(year.median() if year.notna().any() else 0.0)

    lots = serial_vintage(pd.Series(serials, index=serials))["lot"]
    lot_members = pd.DataFrame({"serial": serials, "key": lots.to_numpy()})
    out["lot_fail_rate"] = _shrunk_rate(vintage["lot"], lot_members, failed, prior_units, folds)

    location = units["location"].astype(str).str.strip()
    col = pd.to_numeric(location.str.extract(r"^c(\d+)-")[0], errors="coerce")
    out["col_odd"] = (col % 2).fillna(0.0)
    stint_loc = stints["location"].astype(str).str.strip()
    for area, pattern in _AREA_PATTERNS.items():
        members = pd.DataFrame(
            {"serial": stints["serial"].to_numpy(), "key": stint_loc.str.extract(pattern)[0]}
        )
        own = location.str.extract(pattern)[0]
        out[f"{area}_fail_rate"] = _shrunk_rate(own, members, failed, prior_units, folds)

    out["loc_prior_failures"] = _prior_failures_at_location(stints, fails, location)
    n_stints = stints.groupby("serial").size()
    out["n_stints"] = units.index.to_series().map(n_stints).fillna(0.0)
    return out[list(HISTORY_COLUMNS)].astype(np.float64)


def _prior_failures_at_location(
    stints: pd.DataFrame, fails: pd.DataFrame, location: pd.Series
) -> pd.Series:
    """Other units' failures at each unit's location before the unit first arrived there."""
    arrivals = (
        stints.assign(location=stints["location"].astype(str).str.strip())
        .groupby(["serial", "location"])["inserted"]
        .min()
    )
    key = pd.MultiIndex.from_arrays([location.index, location.to_numpy()])
    arrived = pd.Series(arrivals.reindex(key).to_numpy(), index=location.index)
    events = fails.assign(location=fails["location"].astype(str).str.strip())
    events = events.drop_duplicates(["serial", "location", "removed"])
    units = pd.DataFrame(
        {"unit": location.index, "location": location.to_numpy(), "arrived": arrived.to_numpy()}
    )
    pairs = units.merge(events[["serial", "location", "removed"]], on="location")
    before = (pairs["removed"] <= pairs["arrived"]) & (pairs["serial"] != pairs["unit"])
    counts = pairs[before].groupby("unit").size()
    return location.index.to_series().map(counts).fillna(0.0).astype(np.float64)
