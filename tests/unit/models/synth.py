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
