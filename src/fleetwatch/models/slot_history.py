"""What the unit's own slot had been through before the unit arrived in it.

A slot (a Titan node position: one GPU) that wore out its earlier GPUs is a hot or badly cooled
slot, and the unit now in it runs there too. For each unit in service at a snapshot's moment
:math:`t`, over the *other* units' stints at the unit's location that began before the unit's
current stint:

``slot_prev_n``
    How many there were (0 for a slot still holding its first GPU).
``slot_prev_failures``
    How many of them ended in their unit's failure.
``slot_prev_failed``
    1 if the latest of them ended in a failure, 0 if not, -1 if there was none.
``slot_prev_life_days``
    How long the latest of them lasted, in days (-1 if none). A short life that ended in a
    failure marks a harsh slot.

Leak-free: a snapshot holds only stints begun before :math:`t` and only removals and failures
known by :math:`t` (:func:`~fleetwatch.models.snapshot.snapshot`), and a predecessor's stint
ended before the current unit's began.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fleetwatch.models.snapshot import InventorySnapshot

__all__ = ["SLOT_HISTORY_COLUMNS", "slot_history"]

SLOT_HISTORY_COLUMNS = (
    "slot_prev_n",
    "slot_prev_failures",
    "slot_prev_failed",
    "slot_prev_life_days",
)
_DAY = pd.Timedelta(days=1)


def slot_history(snap: InventorySnapshot) -> pd.DataFrame:
    """:data:`SLOT_HISTORY_COLUMNS` for each unit of ``snap.units`` (float, same index)."""
    units = snap.units
    here = pd.DataFrame(
        {
            "unit": units.index.to_numpy(),
            "node_key": units["node_key"].to_numpy(),
            "since": units["stint_start"].to_numpy(),
        }
    )
    stints = snap.stints[["serial", "node_key", "inserted", "removed", "ended_in_failure"]]
    pairs = here.merge(stints, on="node_key")
    before = pairs[(pairs["serial"] != pairs["unit"]) & (pairs["inserted"] < pairs["since"])]
    # a predecessor still open at t would overlap the unit: the data has a few; it lasted until t
    life = (before["removed"].fillna(snap.at) - before["inserted"]) / _DAY
    before = before.assign(life=life.to_numpy(), failed=before["ended_in_failure"].astype(float))
    grouped = before.groupby("unit")
    latest = before.sort_values("inserted").groupby("unit").tail(1).set_index("unit")
    out = pd.DataFrame(index=units.index)
    out["slot_prev_n"] = grouped.size().reindex(units.index).fillna(0.0)
    out["slot_prev_failures"] = grouped["failed"].sum().reindex(units.index).fillna(0.0)
    out["slot_prev_failed"] = latest["failed"].reindex(units.index).fillna(-1.0)
    out["slot_prev_life_days"] = latest["life"].reindex(units.index).fillna(-1.0)
    return out[list(SLOT_HISTORY_COLUMNS)].astype(np.float64)
