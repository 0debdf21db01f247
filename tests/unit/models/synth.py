"""Synthetic Weibull draws shared by the model tests (not a test module)."""

from __future__ import annotations

import numpy as np
import pandas as pd

SEED = 20240611


def weibull_data(
    rng: np.random.Generator, n: int, scale: float, shape: float, censor_at: float | None = None
) -> pd.DataFrame:
    """Weibull lifetimes, right-censored at ``censor_at`` days where given."""
    t = scale * rng.weibull(shape, size=n)
    event = np.ones(n, dtype=bool)
    if censor_at is not None:
        event = t <= censor_at
        t = np.minimum(t, censor_at)
    return pd.DataFrame({"duration": t, "event": event})


def planted_fleet(
    rng: np.random.Generator,
    start: str = "2014-01-01",
    end: str = "2018-01-01",
    cols: int = 5,
) -> pd.DataFrame:
    """Inventory records of a small Titan-like fleet whose failures have planted causes.

    ``cols`` x 3 cages x 8 slots x 4 nodes slots, each filled at ``start`` from two lots of
    2012 boards (serials ``0323712...`` and ``0323812...``). Lifetimes are Weibull (shape 2,
    wear-out) with scale 2500 days, x 0.3 in the top cage (2) and x 0.6 for lot ``0323812``;
    a failed unit (``DBE``) is replaced the same day by a fresh 2016 board (``0324816...``,
    scale 6000 days). Units alive at ``end`` are removed then without an event.
    """
    t0, t1 = pd.Timestamp(start), pd.Timestamp(end)
    horizon = (t1 - t0) / pd.Timedelta(days=1)
    rows: list[tuple[str, str, pd.Timestamp, pd.Timestamp, str | None]] = []
    serial = 0
    for col in range(cols):
        for cage in range(3):
            for slot in range(8):
                for node in range(4):
                    location = f"c{col}-0c{cage}s{slot}n{node}"
                    bad = rng.random() < 0.5
                    scale = 2500.0 * (0.3 if cage == 2 else 1.0) * (0.6 if bad else 1.0)
                    prefix = "0323812" if bad else "0323712"
                    day = 0.0
                    while day < horizon:
                        serial += 1
                        life = scale * rng.weibull(2.0)
                        stop = min(day + life, horizon)
                        failed = day + life < horizon
                        rows.append(
                            (
                                f"{prefix}{serial:06d}",
                                location,
                                t0 + pd.Timedelta(days=day),
                                t0 + pd.Timedelta(days=stop),
                                "DBE" if failed else None,
                            )
                        )
                        day, scale, prefix = stop, 6000.0, "0324816"
    return pd.DataFrame(rows, columns=["serial", "location", "inserted", "removed", "event"])
