"""A hand-made Titan inventory of six units, shared by the covariate tests (not a test module)."""

from __future__ import annotations

import pandas as pd

Row = tuple[str, str, str | None, str, str | None]


def make_records(rows: list[Row]) -> pd.DataFrame:
    """Inventory records from ``(serial, location, inserted, removed, event)`` rows."""
    frame = pd.DataFrame(rows, columns=["serial", "location", "inserted", "removed", "event"])
    frame["inserted"] = pd.to_datetime(frame["inserted"])
    frame["removed"] = pd.to_datetime(frame["removed"])
    return frame


def tiny_inventory() -> pd.DataFrame:
    """Six units: a failure and its replacement at one node, a repaired unit, one pulled and
    put back elsewhere (lot = serial characters 1-8, year = characters 6-7)."""
    return make_records(
        [
            # serial, location, inserted, removed, event
            ("0323712000001", "c1-0c2s3n1", "2014-01-01", "2015-01-01", "DBE"),  # fails at L
            ("0323712000002", "c1-0c2s3n1", "2015-01-10", "2019-01-01", None),  # replaces it
            ("0323712000003", "c1-0c2s3n0", "2014-01-01", "2015-06-01", "OTB"),  # same blade
            ("0323712000003", "c1-0c2s3n0", "2015-08-01", "2019-01-01", None),  # after repair
            ("0323712000004", "c1-0c0s0n0", "2014-01-01", "2019-01-01", None),  # same cabinet
            ("0323816000005", "c2-0c2s3n1", "2014-01-01", "2015-03-01", None),  # pulled...
            ("0323816000005", "c2-0c1s1n1", "2015-04-01", "2019-01-01", None),  # ...put back
            ("0323816000006", "c2-0c1s1n0", "2014-01-01", "2019-01-01", None),
        ]
    )
